"""The conversational simulator's configuration (agents/config.py's loader: YAML into typed dataclasses).

    config = load_config("configs/converse/yelp.yaml", ["dialogues=5", "refinement.enabled=false"])

Sections: the run (setting, dialogues, turns, seed, data), ``priors`` (the profile dictionaries'
hand-set distributions: environment, language and action patterns; the data's priors are estimated
from RecLLMSim at run time), ``rating``,
``refinement`` (the language-pattern tools, in order), ``llm`` (the simulator's backend), ``crs_llm``
(the built-in recommenders' backend) and ``plugins`` (your own recommenders, agents/converse/plugins.py).
"""

from __future__ import annotations

from dataclasses import asdict, field
from pathlib import Path

from pydantic import Field
from pydantic.dataclasses import dataclass

from agents.config import STRICT, ConfigError, load_yaml  # noqa: F401 (ConfigError: what callers catch)
from agents.llm import LLMConfig
from agents.plugins import is_target

# the built-in recommenders of the yelp setting (agents/converse/crs.py RECOMMENDERS): the ladder's rungs
# random, oracle-ignores, oracle-explains and oracle, and the two LLM recommenders base and agent
YELP_CRS = {"base", "agent", "assistant", "random", "oracle", "oracle-ignores", "oracle-explains"}


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
            "message_length": {"short": 0.35, "medium": 0.45, "long": 0.2},
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
    # how the four 1-5 scores are read: expected (the expected value over the digits) or greedy (the most
    # likely digit), both from the model's probabilities after the judgement is written; or json (decoded
    # inside the rating's JSON, after its rationale)
    read: str = Field("expected", pattern="^(json|greedy|expected)$")
    # the rating's judgement is written at this temperature (0: greedy), whatever the run's temperature
    temperature: float = Field(0.0, ge=0)
    # off: no rating is asked (no simulator LLM call for it): the objective figures alone, in minutes
    enabled: bool = True
    # what the quit rule (unhappy_below, patience) reads for a persona with a catalogue goal: fit (the
    # measured fit of each recommendation, so the dialogue's course and success do not depend on the
    # rating LLM) or ratings (the rated satisfaction, RecUserSim's rule). Personas without a goal have no
    # measured fit and always read the ratings.
    patience_from: str = Field("fit", pattern="^(fit|ratings)$")


@dataclass(config=STRICT)
class ToolConfig:
    """One refinement tool: a judger and a refiner for one language pattern. ``judge: rule`` (message
    length: words per message against ``thresholds``) or ``judge: llm`` (the LLM picks a level for
    ``question``); the refiner is the LLM, asked to rewrite toward the persona's level."""

    name: str
    trait: str  # the language trait (priors.language) the persona's level comes from
    judge: str = Field("llm", pattern="^(rule|llm)$")
    question: str = ""  # llm judger: what it is asked, answered with one of the trait's levels
    # rule: short < a <= medium <= b < long, in words per message. The default: the tertiles of
    # RecLLMSim's LLM users' words per message (7,096 user turns: 58 and 96), the lengths the
    # evaluation compares with (the RecUserSim paper's own thresholds were not available offline)
    thresholds: list[float] = field(default_factory=lambda: [58.0, 96.0])


@dataclass(config=STRICT)
class RefinementConfig:
    enabled: bool = True
    tools: list[ToolConfig] = field(
        default_factory=lambda: [
            ToolConfig(name="message length", trait="message_length", judge="rule"),
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
class PluginConfig:
    """A researcher's own CRS (agents/converse/plugins.py has the protocol): ``python`` (target:
    package.module:Class, built with ``options``), ``http`` (target: the URL answering the protocol's
    POST) or ``openai`` (target: an OpenAI-compatible base URL, ``model``, your ``system_prompt``)."""

    transport: str = Field(pattern="^(python|http|openai)$")
    target: str = Field(min_length=1)
    options: dict = field(default_factory=dict)  # python: keyword arguments of the class
    model: str = ""  # openai: the served model's name
    system_prompt: str = ""  # openai: sent first; none when empty
    max_tokens: int | None = Field(None, ge=1)  # openai: none: only the model's window bounds a reply
    api_key_env: str = ""  # openai: the environment variable holding the key (the key is never recorded)
    timeout: float = Field(60.0, gt=0)  # seconds per try
    retries: int = Field(2, ge=0)  # more tries after a timeout, a lost connection or a 5xx
    concurrency: int = Field(8, ge=1)  # dialogues served at once


@dataclass(config=STRICT)
class ConverseConfig:
    setting: str = Field("yelp", pattern="^(yelp|recllmsim)$")  # restaurants from Yelp, or RecLLMSim's tasks
    data: str = "../shared/data/raw/recllmsim"
    catalogue: str = "../shared/data/raw/yelp_asc_sample/item_subset.json"  # yelp: the restaurants
    # yelp: sampled (RecLLMSim-style personas in the catalogue's cities, judged by the LLM) or goals
    # (catalogue tasks: each persona is a real Yelp user at a cutoff, with the places they really went to
    # next as targets; agents/converse/goals.py); goals need the sample's reviews
    personas: str = Field("sampled", pattern="^(sampled|goals)$")
    reviews: str = "../shared/data/raw/yelp_asc_sample/review_subset.json"  # goals: the real visits
    goal_users: str = "../shared/data/raw/yelp_asc_sample/user_subset.json"  # goals: whose (empty: all)
    # who writes a goal persona's message: the LLM (told the act and its slot) or a template stating them
    user_text: str = Field("llm", pattern="^(llm|template)$")
    # who writes the built-in CRSs' replies: the LLM, or a template stating the same move (the place the
    # CRS chose, its question); the choices stay the CRS's own either way
    crs_text: str = Field("llm", pattern="^(llm|template)$")
    crs: list[str] = field(
        default_factory=lambda: ["base", "agent"]
    )  # yelp: base, agent; recllmsim: assistant; either: a name from plugins, or package.module:Class
    plugins: dict[str, PluginConfig] = field(default_factory=dict)
    # a CRS that gives no item ids (openai, text-only): its recommendations are the catalogue places its
    # reply names (crs.NameMatcher; matched, ambiguous and unmatched counted), so it is scored like the rest
    match_names: bool = True
    dialogues: int = Field(10, ge=1)  # per recommender
    max_turns: int = Field(6, ge=1)  # user turns per dialogue
    seed: int = 0
    temperature: float = Field(0.7, ge=0)
    transcript_turns: int = Field(6, ge=1)  # the simulator's prompts show this many last turns
    # ... whole, as long as they fit this many tokens together (the assistant message being rated always
    # whole); an older turn that does not fit is cut by tokens, marked "…" and counted (turns_cut)
    transcript_tokens: int = Field(1536, ge=64)
    message_tokens: int = Field(320, ge=16)  # the most tokens a user message may take (cut_short counted)
    rating_tokens: int = Field(
        320, ge=32
    )  # ... and a rating's JSON (a cut one is an unusable rating, counted)
    # how the people's questionnaire (eval.converse --replay human) is answered: expected (each item's
    # expected place on its scale, from the model's probabilities over the item's numbered options) or
    # greedy (the most likely option), each read after the answer's beginning "{item}: "; or json (all
    # four items in one JSON object, written at rating.temperature: for a backend that cannot continue an
    # answer, such as openai without decoding_fields: vllm, which the replay refuses otherwise)
    questionnaire_read: str = Field("expected", pattern="^(json|greedy|expected)$")
    priors: PriorsConfig = field(default_factory=PriorsConfig)
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
    for name in config.crs:  # the shorthand: a python plug-in named by its import path in crs itself
        if name not in config.plugins and is_target(name):
            config.plugins[name] = PluginConfig(transport="python", target=name)
    allowed = {"yelp": YELP_CRS, "recllmsim": {"assistant"}}[config.setting]
    if config.personas == "goals" and config.setting != "yelp":
        raise ConfigError(f"{path or 'config'}: personas: goals are catalogue tasks (setting: yelp)")
    oracles = [name for name in config.crs if name.startswith("oracle")]
    if oracles and config.personas != "goals":
        raise ConfigError(f"{path or 'config'}: crs: {oracles} recommend a goal's targets (personas: goals)")
    wrong = [name for name in config.crs if name not in allowed and name not in config.plugins]
    if wrong or not config.crs:
        raise ConfigError(
            f"{path or 'config'}: crs: {wrong or 'none'} for setting {config.setting!r} (one of "
            f"{sorted(allowed)}, a name from plugins {sorted(config.plugins)}, or package.module:Class)"
        )
    for name, spec in config.plugins.items():
        if spec.transport in ("http", "openai") and not spec.target.startswith(("http://", "https://")):
            raise ConfigError(
                f"{path or 'config'}: plugins.{name}.target: {spec.target!r} is not an http(s) URL"
            )
        if spec.transport == "openai" and not spec.model:
            raise ConfigError(
                f"{path or 'config'}: plugins.{name}.model: the openai transport needs the served model's name"
            )
        if spec.transport != "python" and spec.options:
            raise ConfigError(
                f"{path or 'config'}: plugins.{name}.options: only a python plug-in takes options"
            )
    clash = sorted(set(config.plugins) & YELP_CRS)
    if clash:
        raise ConfigError(f"{path or 'config'}: plugins: {clash} would hide the built-in recommenders")
    return config


def as_dict(config: ConverseConfig) -> dict:
    return asdict(config)
