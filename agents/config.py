"""One loader for the three simulators' YAML configs: YAML into typed dataclasses, checked on load.

    config = load_yaml("configs/sandbox/movielens.yaml", SandboxConfig, ["rounds=3", "memory.retrieve_top=8"])
    agent, llm, run = parse_flat(["--config", "configs/review/stats.yaml", "--k_user", "2", ...],
                                 (AgentConfig, LLMConfig, RunArguments), prog="python -m agents.review run")

Two shapes of file, one loader. The sandbox and the conversational simulator use sections: a config class
is a pydantic dataclass (``config=STRICT``) whose sections are pydantic dataclasses too, so the code
reading them sees plain dataclasses. The review runner's files are flat: one mapping whose keys are the
fields of several dataclasses (its agent, its LLM backend, its run). Validation is pydantic's either way:
an unknown key, a wrong type or an out-of-range value is an error naming the file and the field, e.g.
``configs/sandbox/x.yaml: memory.forget_beta: Input should be greater than 1``. Overrides are
``section.field=value`` strings (``--set``), parsed as YAML scalars; a flat config also takes each field
as a flag (``--k_user 2``). Sections named in LLM_SECTIONS hold the shared backends' settings
(agents/llm.py's LLMConfig). Only train.sft's recipes go through TrlParser, as TRL intends.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import types
import typing
from pathlib import Path

import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError

from agents.llm import LLMConfig

STRICT = ConfigDict(extra="forbid")
LLM_SECTIONS = ("llm", "crs_llm")  # sections that are LLMConfig


class ConfigError(ValueError):
    pass


def split_setting(item: str) -> tuple[str, str]:
    """``KEY=VALUE`` as (key, raw value text); a clear error for anything else."""
    key, equals, raw = item.partition("=")
    if not (equals and key):
        raise ConfigError(f"{item!r}: expected KEY=VALUE")
    return key, raw


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    for item in overrides:
        try:
            key, raw = split_setting(item)
        except ConfigError:
            raise ConfigError(f"override {item!r}: expected section.field=value") from None
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


# --- flat configs (the review runner): one mapping over the fields of several dataclasses -------------


@functools.cache  # the parser, the command line and the loader all ask; resolving the hints once is enough
def flat_fields(classes: tuple[type, ...]) -> dict[str, tuple[type, dataclasses.Field, object]]:
    """Each field name with its class, its field and its resolved type; a name two classes share is an
    error. The mapping is shared between callers: read it, never change it."""
    fields: dict[str, tuple[type, dataclasses.Field, object]] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if f.name in fields:
                raise ConfigError(
                    f"{f.name}: a field of both {fields[f.name][0].__name__} and {cls.__name__}"
                )
            fields[f.name] = (cls, f, hints[f.name])
    return fields


def _kinds(hint) -> set:
    """The plain types a hint allows (``str | None`` -> {str, NoneType})."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return set().union(*(_kinds(arg) for arg in typing.get_args(hint)))
    return {typing.get_origin(hint) or hint}


def _textual(hint) -> bool:
    return str in _kinds(hint) and not _kinds(hint) & {int, float, bool, dict, list}


def flat_value(hint, raw: str | list[str]):
    """A command-line value for a field: text stays text for a text field; anything else is read as a YAML
    scalar or mapping ("2" -> 2, "true" -> True, "{a: 1}" -> {"a": 1}); null, ~ or None is None where
    the field allows it. A flag that takes several values gives its list as it is."""
    if isinstance(raw, list):
        return raw
    if type(None) in _kinds(hint) and raw in ("null", "~", "None"):
        return None
    if _textual(hint):
        return raw
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw  # not YAML: the type check below names the setting


def load_flat(path: str | Path | None, classes: tuple[type, ...], settings: dict | None = None) -> tuple:
    """The flat YAML file (None: all defaults) with ``settings`` (typed values, the command line's) over
    it, as one instance of each class. Each value is checked strictly against its field's type: a number
    in a file is text where the field is text (``device: 0``), but a flag is no number and 2.0 is no
    count. An error names the file and the setting, or the flag when the value came from the command line."""
    where = str(path) if path else "config"
    data = (yaml.safe_load(Path(path).read_text()) or {}) if path else {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    fields = flat_fields(classes)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{where}: {unknown[0]}: unknown setting")
    for name, value in data.items():  # a YAML number where the field is text: the text as written
        if _textual(fields[name][2]) and isinstance(value, int | float) and not isinstance(value, bool):
            data[name] = str(value)
    given = settings or {}
    data.update(given)
    checked = {}
    for name, value in data.items():
        try:
            checked[name] = TypeAdapter(fields[name][2]).validate_python(value, strict=True)
        except ValidationError as error:
            source = f"--{name}" if name in given else f"{where}: {name}"
            raise ConfigError(f"{source}: {error.errors()[0]['msg']} (got {value!r})") from None
    made = []
    for cls in classes:
        mine = {k: v for k, v in checked.items() if fields[k][0] is cls}
        required = [f.name for f in dataclasses.fields(cls) if f.name not in mine and _required(f)]
        if required:
            raise ConfigError(f"--{required[0]} is required")
        made.append(cls(**mine))
    return tuple(made)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


class _InOrder(argparse.Action):
    """Keeps every flag and ``--set`` item in command-line order, so the last one given for a key wins."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, "given", None) or []
        if self.dest == "set":
            for item in values:
                try:
                    given.append(split_setting(item))
                except ConfigError as err:
                    parser.error(f"--set {err}")
        else:
            given.append((self.dest, values))
        namespace.given = given


def flat_parser(
    classes: tuple[type, ...], prog: str, description: str | None = None
) -> argparse.ArgumentParser:
    """``--config FILE``, ``--set KEY=VALUE ...`` and one flag per field, with the field's help and default."""
    fields = flat_fields(classes)
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--config", help="a YAML file of settings (keys: the flags below, without --)")
    parser.add_argument(
        "--set", nargs="+", action=_InOrder, metavar="KEY=VALUE",
        help="settings over the file's, as the other simulators take them; where a key is given more than "
        "once on the command line (as --set or as its flag), the last one wins",
    )  # fmt: skip
    groups = {cls: parser.add_argument_group(cls.__name__) for cls in classes}
    for name, (cls, f, hint) in fields.items():
        if f.default is not dataclasses.MISSING:
            default = f"default: {f.default}"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"default: {f.default_factory()}"
        else:
            default = "required"
        text = f"{f.metadata.get('help', '')} ({default})".strip().replace("%", "%%")
        options = {"dest": name, "action": _InOrder, "help": text}
        if list in _kinds(hint):
            options["nargs"] = "+"
        elif bool in _kinds(hint):
            options.update(nargs="?", const="true")
        groups[cls].add_argument(f"--{name}", **options)
    parser.set_defaults(given=[])
    return parser


def parse_flat(
    argv: list[str], classes: tuple[type, ...], prog: str, description: str | None = None
) -> tuple:
    """A flat config's command line: the file, then the ``--set`` items and flags in the order given (the
    last one for a key wins). Bad input exits with the parser's usage and the reason."""
    parser = flat_parser(classes, prog, description)
    args = parser.parse_args(argv)
    fields = flat_fields(classes)
    settings = {}
    for key, raw in args.given:
        if key not in fields:
            parser.error(f"--set {key}={raw}: {key}: unknown setting")
        settings[key] = flat_value(fields[key][2], raw)
    try:
        return load_flat(args.config, classes, settings)
    except (ConfigError, OSError, yaml.YAMLError) as error:
        parser.error(str(error))
