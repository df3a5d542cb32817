"""The sandbox's configuration: YAML into typed, nested dataclasses, checked on load.

    config = load_config("configs/sandbox/movielens.yaml", ["rounds=3", "memory.short_term_capacity=5"])

Sections: the run (data, start, rounds, agents, seed), ``activity`` (who acts each round), ``memory``,
``features`` (the behaviour features: estimated, sampled, and how much they weigh), ``decision`` (how
agents choose: constrained generation or scoring), ``stars`` (the rating of a watched film),
``text`` (chats and posts), ``recommender``, ``graph`` and ``llm`` (the shared backends' settings,
agents/llm.py). Loaded by the
agents' one YAML loader (agents/config.py): an unknown key, a wrong type or an out-of-range value is an
error naming the file and the field, e.g. ``configs/sandbox/x.yaml: memory.forget_beta: Input should be
greater than 1``. Overrides are ``section.field=value`` strings. No trl needed.
"""

from __future__ import annotations

from dataclasses import asdict, field
from datetime import date
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass

from agents.config import STRICT, ConfigError, load_yaml  # noqa: F401 (ConfigError: the error callers catch)
from agents.llm import LLMConfig
from data_prep.prompt import FEATURE_TEXT

FEATURES = tuple(FEATURE_TEXT)  # Watcher, Explorer, Critic, Chatter, Poster


@dataclass(config=STRICT)
class ActivityConfig:
    """Each round an agent acts with its activity level, a probability from a Pareto law: for a
    data-aligned agent (``from_data``), its user's number of ratings before the start mapped through the
    Pareto law fitted to every user's count (the same quantile of this law); otherwise a random draw."""

    pareto_alpha: float = Field(1.5, gt=0)  # fit it to the data: python -m bench.sandbox_bench pareto
    pareto_xmin: float = Field(0.1, gt=0, le=1)  # the smallest activity level
    max_active: int | None = Field(None, ge=1)  # cap on agents acting in one round
    from_data: bool = True


@dataclass(config=STRICT)
class MemoryConfig:
    importance_threshold: float = Field(0.3, ge=0, le=1)  # sensory: observations below are dropped
    enhance_similarity: float = Field(0.8, ge=0, le=1)  # short-term: cosine to enhance a record
    enhance_times: int = Field(3, ge=1)  # short-term: enhanced this often -> insight, to long-term
    short_term_capacity: int = Field(10, ge=1)  # short-term: the oldest beyond this move to long-term
    retrieve_top: int = Field(5, ge=1)  # long-term records a prompt reads
    recency_decay: float = Field(0.99, gt=0, lt=1)  # recency = decay ** (rounds since last access)
    forget_beta: float = Field(2.0, gt=1)  # g(M) = 1 - (s + r)/2 * max(r ** beta, delta)
    forget_delta: float = Field(0.1, gt=0, lt=1)
    # the probability of forgetting a record at a forgetting pass is forget_scale x g(M); the survival it
    # gives is measured by python -m bench.sandbox_bench memory (docs/sandbox.md)
    forget_scale: float = Field(0.1, gt=0, le=1)
    # the same for the records of the user's real history (rated films, well established): a smaller
    # scale keeps the user an agent stands for in its memory through a long run
    history_forget_scale: float = Field(0.01, gt=0, le=1)
    reflect_every: int = Field(5, ge=1)  # rounds between reflections (and forgetting passes)
    merge_similarity: float = Field(0.9, ge=0, le=1)  # reflection merges long-term records closer than this
    # who writes the memory's texts: llm (summaries, insights, reflections; checked each round,
    # agents/sandbox/textcheck.py) or template (an observation is kept as it is at importance 0.5, an
    # insight is the record it came from, and no reflection is written: no LLM call)
    writer: str = Field("llm", pattern="^(llm|template)$")
    # ablations (each a row of eval.sandbox.discrimination): memory.py's docstring says what each turns off
    short_term: bool = True
    long_term: bool = True
    reflection: bool = True


@dataclass(config=STRICT)
class FeatureConfig:
    # Watcher, Explorer and Critic of a data-aligned agent from its ratings (data_prep.movielens)
    from_data: bool = True
    # each feature the data does not settle (Chatter and Poster always) is drawn with this probability
    sample_share: float = Field(0.3, ge=0, le=1)
    # in score mode a feature multiplies the probability of the options it names by this (decide.py)
    weight: float = Field(2.0, ge=1)


@dataclass(config=STRICT)
class DecisionConfig:
    # generate: constrained generation (a choice, a JSON schema); score: options ranked by the LLM's
    # log-likelihood of each, the features' weights applied (decide.py)
    mode: str = Field("generate", pattern="^(generate|score)$")
    # score mode: a film's score is its title's log-likelihood summed, per token, or over its likelihood
    # without the agent's prompt (pmi); chosen on validation users by eval.sandbox.discrimination
    normalisation: str = Field("mean", pattern="^(sum|mean|pmi)$")
    # with llm.adapter: the adapter scores the choice of a film only (what data_prep.choice_pairs trains
    # it for; the base model does the rest), the choice and the stars for a watched film (watch-rate: pairs
    # built with --ratings), or every call
    adapter_scope: str = Field("watch", pattern="^(watch|watch-rate|all)$")
    # score mode: this many times the log-odds of a choice model fitted on real choices before the start
    # (choice.py) is added to the LLM's score of each film (0: the LLM alone); the sandbox's tests choose
    # it on validation users
    choice_weight: float = Field(0.0, ge=0)
    choice_pages: int = Field(3000, ge=100)  # the real choices (pages) it is fitted on


@dataclass(config=STRICT)
class StarsConfig:
    # a watched film's stars come from the review simulator's star model (agents/review/stars.py) on the
    # ratings before the start; the LLM's stars blend in only where these many validation ratings, asked
    # of the LLM at build time, show it helps (0: the model alone, no LLM call)
    llm_validation: int = Field(0, ge=0)
    # how the LLM's stars are read from its probabilities over the five digits (agents.llm.option_probs):
    # expected (their expected value, calibrated by an isotonic fit on the validation ratings older than
    # each rating) or greedy (the most likely digit)
    read: str = Field("expected", pattern="^(expected|greedy)$")


@dataclass(config=STRICT)
class TextConfig:
    # llm: the agents write their chats and posts; template: a fixed sentence states the same content
    # (the film, the stars), for a model that cannot write a readable message
    messages: str = Field("llm", pattern="^(llm|template)$")
    # llm: an agent that searches types its query; template: its first interest is the query
    # (agents/sandbox/textcheck.py checks both each round: do the results share a genre with its taste)
    search: str = Field("llm", pattern="^(llm|template)$")
    repetition_penalty: float = Field(1.0, ge=1)  # hf and vllm backends
    no_repeat_ngram_size: int = Field(0, ge=0)  # hf backend


@dataclass(config=STRICT)
class RecommenderConfig:
    # random | popularity | mf, or a researcher's own: package.module:Class or path/to/file.py:Class
    # (the protocol: agents/sandbox/recommender.py); options go to it as config.options
    kind: str = "mf"
    options: dict[str, Any] = field(default_factory=dict)
    # what serves a page when the recommender fails or returns a page it may not show (counted)
    fallback: str = Field("popularity", pattern="^(random|popularity)$")
    page_size: int = Field(5, ge=1)
    rec_random_k: int = Field(0, ge=0)  # random items injected into each page
    retrain_every: int = Field(1, ge=1)  # rounds between retrainings on the simulated clicks (mf)
    # the real history it trains on: every user's ratings, or only the agents' own (the simulated clicks
    # then weigh more: the feedback loop of the information-cocoon benchmark)
    train_on: str = Field("all", pattern="^(all|agents)$")
    factors: int = Field(32, ge=1)
    iterations: int = Field(15, ge=1)
    regularization: float = Field(0.01, ge=0)

    @field_validator("kind")
    @classmethod
    def known_or_import_path(cls, value: str) -> str:
        from agents.plugins import is_target

        if value not in ("random", "popularity", "mf") and not is_target(value):
            raise ValueError(f"{value!r} is not random, popularity, mf or package.module:Class")
        return value


@dataclass(config=STRICT)
class GraphConfig:
    edges: str | None = None  # a CSV of name pairs; None: generated
    mean_degree: float = Field(3.0, ge=0)
    homophily: float = Field(0.0, ge=0, le=1)  # 0: random; 1: friends only among shared interests


@dataclass(config=STRICT)
class SandboxConfig:
    data: str = "../shared/data/raw/movielens_latest_small"
    # the simulated moment round 0 stands for: a date (YYYY-MM-DD, UTC) or a Unix time; None: just after
    # the data's last rating. Agents carry their users' ratings before it; the recommender, the star
    # model, the pages' rating counts and the films' tags see only what is older.
    start: str | int | None = None
    round_days: float = Field(1.0, gt=0)  # real days a round stands for (the history on the round clock)
    min_history: int = Field(5, ge=1)  # an aligned user needs this many ratings before the start
    profiles: str | None = None  # handcrafted profiles (YAML or CSV); None: aligned with MovieLens users
    # a description of the population: the LLM writes every field the profiles lack (profiles.py)
    profile_prompt: str | None = Field(None, min_length=1, max_length=2000)
    agents: int = Field(10, ge=1)
    rounds: int = Field(5, ge=1)
    seed: int = 0
    chat: str = Field("two-sided", pattern="^(two-sided|one-call)$")  # one-call: cheaper, labelled
    temperature: float = Field(0.7, ge=0)  # sampling; each call's seed is drawn from the run's generator
    activity: ActivityConfig = field(default_factory=ActivityConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    features: FeatureConfig = field(default_factory=FeatureConfig)
    decision: DecisionConfig = field(default_factory=DecisionConfig)
    stars: StarsConfig = field(default_factory=StarsConfig)
    text: TextConfig = field(default_factory=TextConfig)
    recommender: RecommenderConfig = field(default_factory=RecommenderConfig)
    graph: GraphConfig = field(default_factory=GraphConfig)
    llm: LLMConfig = field(default_factory=LLMConfig)

    @field_validator("start", mode="before")
    @classmethod
    def date_as_text(cls, value):
        """YAML reads 2015-01-01 as a date: kept as its ISO text (configs stay plain JSON)."""
        return value.isoformat() if isinstance(value, date) else value


def load_config(path: str | Path | None, overrides: list[str] = ()) -> SandboxConfig:
    return load_yaml(path, SandboxConfig, overrides)


def as_dict(config: SandboxConfig) -> dict:
    """The config as plain data (for the run's fingerprint and summary)."""
    return asdict(config)
