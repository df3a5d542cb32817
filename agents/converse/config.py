"""The conversational simulator's configuration (agents/config.py's loader: YAML into typed dataclasses).

    config = load_config("configs/converse/yelp.yaml", ["dialogues=5", "refinement.enabled=false"])

Sections: the run (setting, dialogues, turns, seed, data), ``priors`` (the profile dictionaries'
hand-set distributions: environment, language and action patterns; the data's priors are estimated
from RecLLMSim at run time), ``conflicts`` (pairs of preferences that cannot both hold), ``rating``,
``refinement`` (the language-pattern tools, in order), ``llm`` (the simulator's backend) and ``crs_llm``
(the recommenders' backend).
"""

from __future__ import annotations

from dataclasses import asdict, field
from pathlib import Path

from pydantic import Field
from pydantic.dataclasses import dataclass

from agents.config import STRICT, ConfigError, load_yaml  # noqa: F401 (ConfigError: what callers catch)
from agents.llm import LLMConfig


@dataclass(config=STRICT)
class PriorsConfig:
    """Hand-set priors where the data has none (documented in docs/converse.md): weights per option."""

    place: dict[str, float] = field(
        default_factory=lambda: {"at home": 0.4, "at work": 0.25, "travelling": 0.15, "out in town": 0.2}
    )
    time: dict[str, float] = field(
        default_factory=lambda: {"morning": 0.2, "midday": 0.25, "evening": 0.45, "late at night": 0.1}
    )
    company: dict[str, float] = field(
        default_factory=lambda: {
            "alone": 0.35,
            "with a partner": 0.25,
            "with family": 0.2,
            "with friends": 0.2,
        }
    )
    # the language pattern: trait -> level -> weight; a trait added here (with a refinement tool naming
    # it) is sampled, shown to the persona and refined like the three of the design
    language: dict[str, dict[str, float]] = field(
        default_factory=lambda: {
            "information_richness": {"low": 0.3, "medium": 0.45, "high": 0.25},
            "formality": {"low": 0.4, "medium": 0.4, "high": 0.2},
            "sentence_length": {"short": 0.35, "medium": 0.45, "long": 0.2},
        }
    )
    decisiveness: dict[str, float] = field(default_factory=lambda: {"decisive": 0.5, "hesitant": 0.5})
    exploration: dict[str, float] = field(default_factory=lambda: {"exploratory": 0.5, "conservative": 0.5})
    preferences: int = Field(3, ge=1)  # dining preferences drawn per profile
    dislikes: int = Field(1, ge=0)  # and dislikes


@dataclass(config=STRICT)
class RatingConfig:
    excitation_fit: int = Field(4, ge=1, le=5)  # a new item fitting this well may become a preference
    excitation_probability: float = Field(0.5, ge=0, le=1)
    patience: dict[str, int] = field(default_factory=lambda: {"decisive": 2, "hesitant": 4})
    unhappy_below: float = Field(2.5, ge=1, le=5)  # satisfaction under this, `patience` turns running: leave


@dataclass(config=STRICT)
class ToolConfig:
    """One refinement tool: a judger and a refiner for one language pattern. ``judge: rule`` (sentence
    length: words per sentence against ``thresholds``) or ``judge: llm`` (the LLM picks a level for
    ``question``); the refiner is the LLM, asked to rewrite toward the persona's level."""

    name: str
    trait: str  # the language trait (priors.language) the persona's level comes from
    judge: str = Field("llm", pattern="^(rule|llm)$")
    question: str = ""  # llm judger: what it is asked, answered with one of the trait's levels
    thresholds: list[float] = field(
        default_factory=lambda: [8.0, 16.0]
    )  # rule: short < a <= medium <= b < long


@dataclass(config=STRICT)
class RefinementConfig:
    enabled: bool = True
    tools: list[ToolConfig] = field(
        default_factory=lambda: [
            ToolConfig(name="sentence length", trait="sentence_length", judge="rule"),
            ToolConfig(
                name="formality",
                trait="formality",
                question="How formal is this message: low (casual), medium or high (formal)?",
            ),
            ToolConfig(
                name="information richness",
                trait="information_richness",
                question="How much detail about the writer's needs does this message give: low, medium or high?",
            ),
        ]
    )


@dataclass(config=STRICT)
class ConverseConfig:
    setting: str = Field("yelp", pattern="^(yelp|recllmsim)$")  # restaurants from Yelp, or RecLLMSim's tasks
    data: str = "../shared/data/raw/recllmsim"
    catalogue: str = "../shared/data/raw/yelp_asc_sample/item_subset.json"  # yelp: the restaurants
    crs: list[str] = field(
        default_factory=lambda: ["base", "agent"]
    )  # yelp: base, agent; recllmsim: assistant
    dialogues: int = Field(10, ge=1)  # per recommender
    max_turns: int = Field(6, ge=1)  # user turns per dialogue
    seed: int = 0
    temperature: float = Field(0.7, ge=0)
    transcript_turns: int = Field(6, ge=1)  # the simulator's prompts show this many last turns
    priors: PriorsConfig = field(default_factory=PriorsConfig)
    conflicts: list[list[str]] = field(
        default_factory=lambda: [
            ["Vegan", "Seafood"],
            ["Vegan", "Grilling"],
            ["Healthy food", "Fast food"],
            ["Follows a balanced diet", "Fast food"],
        ]
    )
    rating: RatingConfig = field(default_factory=RatingConfig)
    refinement: RefinementConfig = field(default_factory=RefinementConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)
    crs_llm: LLMConfig = field(default_factory=LLMConfig)


def load_config(path: str | Path | None, overrides: list[str] = ()) -> ConverseConfig:
    config = load_yaml(path, ConverseConfig, overrides)
    for tool in config.refinement.tools:
        if tool.trait not in config.priors.language:
            raise ConfigError(
                f"{path or 'config'}: refinement tool {tool.name!r}: trait {tool.trait!r} is not in priors.language"
            )
        if tool.judge == "llm" and not tool.question:
            raise ConfigError(
                f"{path or 'config'}: refinement tool {tool.name!r}: an llm judger needs a question"
            )
    allowed = {"yelp": {"base", "agent", "assistant"}, "recllmsim": {"assistant"}}[config.setting]
    wrong = [name for name in config.crs if name not in allowed]
    if wrong or not config.crs:
        raise ConfigError(
            f"{path or 'config'}: crs: {wrong or 'none'} for setting {config.setting!r} (one of {sorted(allowed)})"
        )
    for pair in config.conflicts:
        if len(pair) != 2:
            raise ConfigError(f"{path or 'config'}: conflicts: {pair!r} is not a pair")
    return config


def as_dict(config: ConverseConfig) -> dict:
    return asdict(config)
