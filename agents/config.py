"""One loader for the agents' YAML configs: YAML into typed, nested dataclasses, checked on load.

    config = load_yaml("configs/sandbox/movielens.yaml", SandboxConfig, ["rounds=3", "memory.retrieve_top=8"])

A config class is a pydantic dataclass (``config=STRICT``) whose sections are pydantic dataclasses too,
so the code reading them sees plain dataclasses. Validation is pydantic's: an unknown key, a wrong type
or an out-of-range value is an error naming the file and the field, e.g.
``configs/sandbox/x.yaml: memory.forget_beta: Input should be greater than 1``. Overrides are
``section.field=value`` strings, parsed as YAML scalars. Sections named in LLM_SECTIONS hold the shared
backends' settings (agents/llm.py's LLMConfig). No trl needed (train.sft and the review agent's flat
flag-style configs go through TrlParser, as TRL intends).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ConfigDict, ValidationError

from agents.llm import LLMConfig

STRICT = ConfigDict(extra="forbid")
LLM_SECTIONS = ("llm", "crs_llm")  # sections that are LLMConfig


class ConfigError(ValueError):
    pass


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected section.field=value")
        *sections, name = key.split(".")
        node = data
        for section in sections:
            node = node.setdefault(section, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {section} is not a section")
        try:
            node[name] = yaml.safe_load(raw)
        except yaml.YAMLError as err:
            raise ConfigError(f"override {item!r}: not a YAML value ({err})") from None
    return data


def load_yaml(path: str | Path | None, cls: type, overrides: list[str] = ()):
    """The YAML file (None: all defaults) with ``section.field=value`` overrides, as ``cls``."""
    data = (yaml.safe_load(Path(path).read_text()) or {}) if path else {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of settings, got {type(data).__name__}")
    data = apply_overrides(data, list(overrides))
    try:
        for name in LLM_SECTIONS:  # a plain dataclass: unknown keys are checked here
            if isinstance(data.get(name), dict):
                unknown = sorted(set(data[name]) - set(LLMConfig.__dataclass_fields__))
                if unknown:
                    raise ConfigError(f"{path or 'config'}: {name}.{unknown[0]}: unknown setting")
                data[name] = LLMConfig(**data[name])
        return cls(**data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"{path or 'config'}: {where}: {first['msg']}") from None
    except TypeError as error:  # an unknown top-level key of a plain dataclass section
        raise ConfigError(f"{path or 'config'}: {error}") from None
