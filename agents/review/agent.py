"""The review agent: retrieval + an LLM through the shared prompt renderer + calibrated stars.

Kinds (all runnable by config, see configs/review/):
- ``stats``: no LLM. Calibrated stars; the review is the user's past review most similar to the item.
- ``asc-baseline``: a re-creation of the official baseline agent's recipe: the user, the item and one
  similar review of the item, the base model, the LLM's own stars.
- ``retrieval-llm``: the base model with our retrieval prompt (k user + k item reviews), LLM stars.
- ``tuned``: a LoRA adapter (train.sft) with the retrieval prompt and the calibrated stars.
- ``tuned-write``: the tuned agent whose review is always one its model wrote: the greedy answer and
  ``samples`` sampled ones, chosen by a utility of what the agent may see (agents.review.write).

The tuned kinds decide the stars first (calibrated, blended with the LLM's where validation says so)
and then the model writes the review after them: the answer's beginning "stars: N\nreview:" is given
(data_prep.prompt.answer_beginning) and the model continues it, as in training, where the review follows
the real stars. So a review is written for the stars the agent gives. The other LLM kinds write the
whole answer and their stars are the LLM's.

Every answer is parsed (data_prep.prompt.parse_completion); with ``constrained: true`` the backend makes
every answer follow the format (agents.llm.Constraint). An unusable one (no stars, stars outside 1-5,
no review) is asked again once with a stricter instruction; if still unusable, a retrieval-based
fallback answers. A prediction never has an empty review. Retries and fallbacks are counted.

``selection: mbr`` (LLM agents): the review is chosen from a pool of candidates (the LLM's answer,
``samples`` sampled answers, ``candidates_user`` + ``candidates_item`` retrieved real reviews) by minimum
Bayes risk under cheap stand-ins of the metric (agents.review.select), never with the ground truth;
every prediction keeps its pool (texts, sources, VADER compounds), so eval.review.selection chooses the pool
and weight per group on validation tasks without asking the LLM again (``selection_rule``). Under a
selection rule, a task whose group's choice cannot use sampled answers (``centroid``, ``similar``,
``retrieved``, ``answer``) draws none: its prediction is the same, its pool holds no samples, and its
counts say how many were not drawn (``samples_not_needed``).

``visibility: time-aware`` (the default): everything a prediction uses (retrieval, the calibrated stars
and their choice, the baselines' history) is strictly older than the task's target.
``visibility: official``: everything but the task pairs, as on the AgentSociety leaderboard.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agents.emotion import EMOTION_CHARS
from agents.llm import Answer as LLMAnswer
from agents.llm import Constraint, LLMConfig, Sampling, load_llm, option_probs, read_choice
from agents.retrieval import Retriever
from agents.review import write
from agents.review.select import (
    CHOICES,
    SIMILAR,
    SentimentByStars,
    choose,
    option_name,
    read_rule,
    uses_samples,
)
from agents.review.stars import GROUPS, StarModel
from agents.text import words
from data_prep.prompt import (
    FittedPrompt,
    answer_beginning,
    build_messages,
    describe_item,
    fit_messages,
    parse_completion,
)

KINDS = ("stats", "asc-baseline", "retrieval-llm", "tuned", "tuned-write")
TUNED = ("tuned", "tuned-write")  # the kinds that decide the stars first and write the review after them
# settings that only matter with selection: mbr
MBR_FIELDS = (
    "samples",
    "sample_temperature",
    "sample_max_new_tokens",
    "candidates_user",
    "candidates_item",
    "pool",
    "sentiment_weight",
    "selection_rule",
)
VISIBILITY = ("time-aware", "official")
# What an MBR pool holds, in a run's fingerprint: 2 = the nearest-centroid review marked in every pool,
# each prediction's group, cosine ties within agents.retrieval.TIE broken by position; 3 = MBR risks
# within agents.retrieval.TIE a tie, going to the earlier candidate.
POOL_VERSION = 3
# Under a selection rule (in a run's fingerprint only then): 1 = samples drawn only for the tasks whose
# group's choice uses them (select.uses_samples), so the others' pools hold none.
RULE_SAMPLING = 1
# Per task: first answers, unusable ones, retries (and those that worked), fallbacks, answers cut at
# max_new_tokens, answers asked for a constraint the backend could not enforce.
COUNTS = (
    "llm_answers",
    "parse_failures",
    "retries",
    "retry_successes",
    "fallbacks",
    "cut_short",
    "unconstrained",
)
STAR_DIGITS = ["1", "2", "3", "4", "5"]
STARS_PREFIX = "stars: "  # how the renderer's answer format begins (data_prep.prompt.format_completion)
STRICT = (
    "Your answer was not in the required format. Answer again with exactly two lines and nothing else:\n"
    "stars: <a whole number from 1 to 5>\nreview: <the review text>"
)


@dataclass
class AgentConfig:
    kind: str = field(default="stats", metadata={"help": f"one of {', '.join(KINDS)}"})
    visibility: str = field(
        default="time-aware",
        metadata={
            "help": "time-aware: a task sees only reviews strictly older than its target (retrieval, "
            "stars, everything); official: everything but the task pairs, as the AgentSociety "
            "leaderboard does"
        },
    )
    k_user: int = 5
    k_item: int = 3
    user_reviews: str = field(
        default="latest",
        metadata={
            "help": "which of the user's older reviews the prompt shows: latest (the k_user latest, as the "
            "training pairs show them) or relevant (the k_user most similar to the item)"
        },
    )
    retrieval: str = field(default="embedding", metadata={"help": "embedding or bm25"})
    prompt_tokens: int = field(
        default=768, metadata={"help": "prompt budget; oldest shown reviews dropped first"}
    )
    max_new_tokens: int = 160
    repetition_penalty: float = field(
        default=1.0, metadata={"help": "every answer and sample: the backend's repetition penalty (1: none)"}
    )
    no_repeat_ngram_size: int = field(
        default=0, metadata={"help": "every answer and sample: no n-gram of this size twice (hf; 0: off)"}
    )
    utility_weights: dict[str, float] = field(
        default_factory=lambda: {name: 1.0 for name in write.FEATURES},
        metadata={
            "help": "tuned-write: the weight of each utility feature (agents.review.write.FEATURES); a "
            "selection_rule from eval.review.selection --utility overrides them"
        },
    )
    constrained: bool = field(
        default=False,
        metadata={
            "help": "constrained decoding: every answer follows the answer format (hf: a grammar, vllm: "
            "structured outputs, openai: a JSON schema); the review is at most max_review_chars long"
        },
    )
    max_review_chars: int = 400
    temperature: float = 0.0
    seed: int = 0
    batch_size: int = 8
    item_candidates: int = field(
        default=100, metadata={"help": "retrieval ranks the item's most recent N older reviews"}
    )
    llm_stars: str = field(
        default="greedy",
        metadata={
            "help": "how the LLM's stars are read: greedy (the digit its answer writes) or expected (the "
            "expected value over the five digits after 'stars: ', one forward pass, calibrated by an "
            "isotonic fit on the validation reviews of blend_fraction older than each task; needs "
            "blend_fraction > 0)"
        },
    )
    blend_fraction: float = field(
        default=0.0,
        metadata={
            "help": "tuned: ask the LLM for the stars of this fraction of the star model's validation "
            "reviews (those its adapter did not train on; drawn by a hash of the review id) and let "
            "blends with the calibrated stars compete (0: no blend)"
        },
    )
    blend_max: int = field(
        default=256, metadata={"help": "refuse to start when the blend sample is larger than this"}
    )
    selection: str = field(
        default="answer", metadata={"help": "answer: the LLM's answer; mbr: minimum Bayes risk over a pool"}
    )
    samples: int = field(default=0, metadata={"help": "mbr: reviews sampled from the LLM per task"})
    sample_temperature: float = 0.8
    sample_max_new_tokens: int = field(
        default=0, metadata={"help": "mbr: the sampled answers' length cap (0: max_new_tokens)"}
    )
    candidates_user: int = field(
        default=0, metadata={"help": "mbr: the user's own past reviews most similar to the item"}
    )
    candidates_item: int = field(
        default=0, metadata={"help": "mbr: the item's reviews nearest the centroid of the user's reviews"}
    )
    pool: str = field(
        default="both",
        metadata={"help": f"mbr: the sources a review is chosen from, one of {', '.join(CHOICES)}"},
    )
    sentiment_weight: float = field(
        default=1.0, metadata={"help": "mbr: weight of the sentiment stand-in against the topic one"}
    )
    selection_rule: str | None = field(
        default=None,
        metadata={
            "help": "mbr: a JSON file of eval.review.selection (the pool and weight per group, new item or item "
            "with history, chosen on validation tasks); overrides pool and sentiment_weight"
        },
    )
    agent: str | None = field(
        default=None,
        metadata={
            "help": "an AgentSociety SimulationAgent to run instead of a shipped kind: path/to/file.py:Class "
            "or package.module:Class (agents.review.official)"
        },
    )
    agent_timeout_s: float = field(
        default=300.0, metadata={"help": "--agent: seconds a task's workflow may run (the official limit)"}
    )


@dataclass
class Context:
    """What the agent may see for one task: under time-aware visibility, only reviews strictly older than
    its target (official visibility: all reviews); the store hides the task pairs either way."""

    user: dict
    item: dict
    history: list[dict]  # the user's visible reviews, oldest first
    item_pool: list[dict]  # the item's most recent visible reviews by others (item_candidates of them)
    item_all: list[dict]  # every visible review of the item by other users
    item_text: str  # the item as the prompt describes it (describe_item)
    user_reviews: list[dict] = field(default_factory=list)  # the user's reviews the prompt shows
    item_reviews: list[dict] = field(default_factory=list)  # the item's reviews the prompt shows


@dataclass
class Prediction:
    task_id: int
    user_id: str
    item_id: str
    stars: float
    review: str
    source: str  # llm | llm_retry | fallback | stats
    raw: str | None = None
    unusable: list[str] = field(default_factory=list)  # LLM answers that could not be used, in order
    cut_short: bool = False  # the answer used stopped at max_new_tokens (its review may be truncated)
    star_model: str | None = None  # the star candidate (or blend) that gave the stars; None: the LLM's
    counts: Counter = field(default_factory=Counter)  # this task's counts (COUNTS); a run sums them
    candidates: list[dict] | None = None  # mbr: the pool [{text, source, vader}]; the review is one of them
    chosen: int | None = None  # mbr: the index of the chosen candidate
    group: str | None = None  # mbr: new_item or item_with_history (stars.GROUPS), as the agent saw it
    selection: str | None = None  # mbr with a selection_rule: the task's group and what it chose with


@dataclass
class TaskAnswer:
    """The LLM's answer for one task, parsed, after at most one stricter retry."""

    stars: float | None
    review: str | None
    text: str
    source: str
    unusable: list[str]
    cut_short: bool
    counts: Counter


def prompt_counts(prompt: FittedPrompt, has_history: bool) -> Counter:
    """What a task's prompt showed, as counts a run sums: how many of the user's reviews (0 / 1 / 2+,
    and how many prompts showed none of a user who has older ones), the tokens each part took, and
    what was cut to fit."""
    counts = Counter({f"prompt_user_reviews:{prompt.shown}": 1})
    counts["prompt_user_has_reviews"] += has_history
    counts["prompt_hides_the_users_reviews"] += has_history and not prompt.user_reviews
    counts.update({f"prompt_tokens:{part}": n for part, n in prompt.tokens.items()})
    counts.update(f"prompt_cut:{cut}" for cut in prompt.cuts)
    return counts


def usable(stars: float | None, review: str | None) -> bool:
    return stars is not None and 1 <= stars <= 5 and bool(review and review.strip())


def in_sample(review_id: str, fraction: float, seed: int) -> bool:
    """Membership by a hash of the review's own id: whether a review is drawn never depends on any
    other review (so reviews added later cannot change which earlier ones are drawn)."""
    digest = hashlib.sha256(f"{seed}:{review_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def adapter_training_data(adapter: str | Path) -> dict:
    """What train.sft recorded about the examples an adapter was trained on (training_data.json)."""
    path = Path(adapter) / "training_data.json"
    if not path.exists():
        raise SystemExit(
            f"error: {path} is missing, so the reviews this adapter trained on are unknown; retrain it "
            "with train.sft, or set blend_fraction: 0"
        )
    return json.loads(path.read_text())


class ReviewAgent:
    def __init__(self, config: AgentConfig, llm_config: LLMConfig | None, store, encoder=None):
        if config.kind not in KINDS:
            raise ValueError(f"unknown agent kind {config.kind!r}: one of {KINDS}")
        if config.visibility not in VISIBILITY:
            raise ValueError(f"unknown visibility {config.visibility!r}: one of {VISIBILITY}")
        if config.item_candidates < 1:
            raise ValueError("item_candidates must be at least 1")
        if config.selection not in ("answer", "mbr") or config.pool not in CHOICES:
            raise ValueError(f"selection is answer or mbr, pool one of {CHOICES}")
        self.writes = config.kind == "tuned-write"
        if self.writes and config.selection != "answer":
            raise ValueError("tuned-write chooses among its written reviews itself: leave selection out")
        if config.selection_rule and config.selection != "mbr" and not self.writes:
            raise ValueError("selection_rule is for selection: mbr or kind tuned-write")
        if config.user_reviews not in ("latest", "relevant"):
            raise ValueError(f"user_reviews is latest or relevant, not {config.user_reviews!r}")
        if config.llm_stars not in ("greedy", "expected"):
            raise ValueError(f"llm_stars is greedy or expected, not {config.llm_stars!r}")
        if config.llm_stars == "expected" and config.kind not in ("stats",) and config.blend_fraction <= 0:
            raise ValueError(
                "llm_stars: expected calibrates the LLM's expected stars on validation reviews: set "
                "blend_fraction > 0 (the share of validation reviews asked), or read them greedy"
            )
        self.weights = write.check_weights(config.utility_weights)
        self.selection_rule = None
        if config.selection_rule and self.writes:  # the weights chosen on validation (eval.review.selection)
            self.weights = write.check_weights(json.loads(Path(config.selection_rule).read_text())["utility"])
        elif config.selection_rule:
            self.selection_rule = read_rule(config.selection_rule)
        chosen = {g["pool"] for g in self.selection_rule["groups"].values()} if self.selection_rule else set()
        if SIMILAR in {config.pool, *chosen} and config.candidates_user < 1:
            raise ValueError(
                f"{SIMILAR} is the first of the user's retrieved reviews: it needs candidates_user >= 1"
            )
        if (config.selection == "mbr" or self.writes) and (
            encoder is None or config.retrieval != "embedding"
        ):
            raise ValueError("selection: mbr and tuned-write need the embedding retrieval (and its encoder)")
        if (
            config.selection == "mbr"
            and config.kind == "stats"
            and (config.samples or config.pool != "retrieved")
        ):
            raise ValueError("the stats agent has no LLM: selection mbr needs pool: retrieved and samples: 0")
        self.config, self.store = config, store
        self.retriever = Retriever(encoder if config.retrieval == "embedding" else None)
        self.llm = load_llm(llm_config) if config.kind != "stats" else None
        self.tokenizer = getattr(self.llm, "tokenizer", None)
        self.stars = StarModel(store.visible_ratings())
        expected = config.llm_stars == "expected" and self.llm is not None
        if self.llm is not None and (expected or (config.kind in TUNED and config.blend_fraction > 0)):
            answers = self.llm_validation_stars(llm_config.adapter)
            self.stars.set_llm_validation(answers, calibrate=expected)
        if config.selection == "mbr" or self.writes:
            from agents.encoders import VaderSentiment

            self.vader = VaderSentiment(offline=True)
            self.sentiment = SentimentByStars.from_store(store)
        if self.writes:
            from agents.emotion import StandInEmotion

            self.emotion = StandInEmotion(encoder)
            # the store's short reviews, each with the first time it was written: a candidate under 8
            # words that equals one written before the task's moment is a copy (agents.review.write)
            self.short_reviews = write.short_texts(store.visible_texts())

    def llm_validation_stars(self, adapter: str | None) -> dict[str, float]:
        """The LLM's stars for the drawn validation reviews that its adapter did not train on, each
        asked like a time-aware task (only strictly older reviews shown); unusable answers are left
        out. These are not task answers, so they are not in any task's counts."""
        trained = set(adapter_training_data(adapter)["train_review_ids"]) if adapter else set()
        rows = [r for r in self.stars.validation if r[0] not in trained]
        drawn = [r for r in rows if in_sample(r[0], self.config.blend_fraction, self.config.seed)]
        if len(drawn) > self.config.blend_max:
            raise SystemExit(
                f"error: blend_fraction {self.config.blend_fraction} draws {len(drawn)} validation reviews, "
                f"more than blend_max {self.config.blend_max}: lower blend_fraction"
            )
        self.stars.report["llm_validation"] = {
            "validation_reviews": len(self.stars.validation),
            "not_in_adapter_training": len(rows),
            "asked": len(drawn),
        }
        tasks = [
            {"task_id": review_id, "user_id": user, "item_id": item, "ts": ts, "validation": True}
            for review_id, user, item, ts, _ in drawn
        ]
        answered, cached = {}, 0
        for start in tqdm(range(0, len(tasks), self.config.batch_size), desc="LLM stars for the blend"):
            batch = tasks[start : start + self.config.batch_size]
            contexts = self.contexts(batch)
            if self.config.llm_stars == "expected" or self.config.kind in TUNED:  # probabilities only
                values = self.llm_star_reads(contexts)
                answered.update(
                    (t["task_id"], v) for t, v in zip(batch, values, strict=True) if v is not None
                )
                continue
            answers = self.ask(contexts)
            cached += sum(a.counts["cached_answers"] for a in answers)
            answered.update(
                (t["task_id"], a.stars)
                for t, a in zip(batch, answers, strict=True)
                if usable(a.stars, a.review)
            )
        self.stars.report["llm_validation"]["cached_answers"] = cached  # answer_cache
        return answered

    def before(self, task: dict) -> int | None:
        """The moment a task's prediction is made at: its target's time, or (official visibility)
        none, so everything but the task pairs is visible. LLM validation asks are always time-aware."""
        return None if self.config.visibility == "official" and not task.get("validation") else task["ts"]

    def star_moment(self, task: dict) -> int:
        moment = self.before(task)
        return self.stars.history.end if moment is None else moment

    # -- context ---------------------------------------------------------------------------------------
    def context(self, task: dict) -> Context:
        return self.contexts([task])[0]

    def contexts(self, tasks: list[dict]) -> list[Context]:
        """What the agent may see for each task: only reviews strictly older than its target (official
        visibility: all reviews); the store hides the task pairs either way. The user's shown reviews are
        their latest (``user_reviews: latest``, as in training) or the most relevant to the item; the
        item's the most relevant to the user's style; both put oldest first."""
        k_user, k_item = self.config.k_user, self.config.k_item
        if self.config.kind == "asc-baseline":
            k_user, k_item = 0, 1
        contexts, requests = [], []
        for task in tasks:
            before = self.before(task)
            user, item = self.store.get_user(task["user_id"]), self.store.get_item(task["item_id"])
            history = self.store.get_reviews(user_id=task["user_id"], before=before)
            # other users' reviews of the item (with the task pair blocked the user has none; without, their
            # own earlier review of it is in their history, not under "other users")
            item_all = self.store.get_reviews(
                item_id=task["item_id"], before=before, not_user=task["user_id"]
            )
            item_pool = item_all[-self.config.item_candidates :]  # the most recent ones
            item_text = describe_item(item)
            style = " ".join(r["text"] for r in history[-3:]) or item_text
            contexts.append(
                Context(
                    user=user,
                    item=item,
                    history=history,
                    item_pool=item_pool,
                    item_all=item_all,
                    item_text=item_text,
                )
            )
            if self.config.kind == "stats":  # only the fallback review is needed
                requests += [(item_text, history, 1), (item_text, item_pool, 0 if history else 1)]
            else:
                latest = self.config.user_reviews == "latest"
                requests += [(item_text, history, 0 if latest else k_user), (style, item_pool, k_item)]
        ranked = self.retriever.rank_many(requests)
        by_age = lambda reviews: sorted(reviews, key=lambda r: (r["date"], r["review_id"]))  # noqa: E731
        for n, ctx in enumerate(contexts):
            latest = self.config.kind != "stats" and self.config.user_reviews == "latest"
            user_reviews = ctx.history[-k_user:] if latest and k_user else ranked[2 * n]
            ctx.user_reviews, ctx.item_reviews = by_age(user_reviews), by_age(ranked[2 * n + 1])
        return contexts

    def fit(self, ctx: Context) -> FittedPrompt:
        """The task's prompt fitted to ``prompt_tokens`` (data_prep.prompt.fit_messages: text cut by
        tokens before a review is dropped, the user's last review kept longest); without a tokenizer
        (an openai backend without one) as built, unmeasured."""
        if self.tokenizer is not None:
            return fit_messages(
                self.tokenizer,
                ctx.user,
                ctx.user_reviews,
                ctx.item,
                ctx.item_reviews,
                self.config.prompt_tokens,
            )
        messages = build_messages(ctx.user, ctx.user_reviews, ctx.item, ctx.item_reviews)
        return FittedPrompt(messages, ctx.user_reviews, ctx.item_reviews)

    def messages(self, ctx: Context) -> list[dict]:
        return self.fit(ctx).messages

    def fallback_review(self, ctx: Context) -> str:
        """The most relevant past review of the user, else of the item, else a neutral sentence."""
        for pool in (ctx.history, ctx.item_pool):
            best = self.retriever.rank(ctx.item_text, pool, 1)
            if best:
                return best[0]["text"]
        return "It was fine."

    # -- prediction ------------------------------------------------------------------------------------
    def predict(self, tasks: list[dict]) -> list[Prediction]:
        contexts = self.contexts(tasks)
        users, items = [t["user_id"] for t in tasks], [t["item_id"] for t in tasks]
        moments = [self.star_moment(t) for t in tasks]
        if self.llm is None:
            stars, names = self.stars.predict(users, items, moments)
            out = [
                Prediction(
                    t["task_id"],
                    t["user_id"],
                    t["item_id"],
                    s,
                    self.fallback_review(c),
                    "stats",
                    star_model=n,
                )
                for t, c, s, n in zip(tasks, contexts, stars, names, strict=True)
            ]
            if self.config.selection == "mbr":  # among retrieved real reviews only (no LLM)
                self.select(tasks, contexts, out)
            return out
        if self.config.kind in TUNED:  # the stars first, then the review written after them
            stars, names, reads = self.decide_stars(contexts, users, items, moments)
            answers = self.ask(contexts, stars=stars)
            for answer, read in zip(answers, reads, strict=True):
                answer.counts.update(read)
        else:  # the LLM's own stars; calibrated ones only where the LLM gave none in range
            answers = self.ask(contexts)
            if self.config.llm_stars == "expected":
                raw = self.llm_star_reads(contexts)
                llm_stars = self.stars.calibrated(raw, moments)
                for answer, value, mapped in zip(answers, raw, llm_stars, strict=True):
                    answer.counts["expected_stars"] += value is not None
                    answer.counts["expected_stars_not_calibrated"] += value is not None and mapped is None
            else:
                llm_stars = [a.stars if a.stars is not None and 1 <= a.stars <= 5 else None for a in answers]
            calibrated, calibrated_names = self.stars.predict(users, items, moments)
            stars = [s if s is not None else c for s, c in zip(llm_stars, calibrated, strict=True)]
            names = [None if s is not None else n for s, n in zip(llm_stars, calibrated_names, strict=True)]
        out = []
        for task, ctx, answer, star, name in zip(tasks, contexts, answers, stars, names, strict=True):
            review, source, cut_short, counts = answer.review, answer.source, answer.cut_short, answer.counts
            if not usable(answer.stars, answer.review):  # keep what was usable: in-range stars, or the text
                counts["fallbacks"] += 1
                source = "fallback"
                if not (review and review.strip()):
                    review, cut_short = self.fallback_review(ctx), False
                    counts["retrieved_fallback_review"] += 1  # the text is a real review, not the LLM's
            counts["cut_short"] += cut_short
            out.append(
                Prediction(
                    task["task_id"],
                    task["user_id"],
                    task["item_id"],
                    float(star),
                    review.strip(),
                    source,
                    answer.text,
                    answer.unusable,
                    cut_short,
                    name,
                    counts,
                )
            )
        if self.config.selection == "mbr":
            self.select(tasks, contexts, out)
        if self.writes:
            self.choose_written(tasks, contexts, out)
        return out

    def decide_stars(
        self, contexts: list[Context], users: list[str], items: list[str], moments: list[int]
    ) -> tuple[list[float], list[str], list[Counter]]:
        """The tuned kinds' stars, before any text: the calibrated ones, blended with the LLM's (read from
        its probabilities after "stars: ", greedy or expected) where validation chose a blend. The LLM is
        read only for the tasks whose blend would use it. Returns stars, their names, per-task counts."""
        raw: list[float | None] = [None] * len(contexts)
        reads = [Counter() for _ in contexts]
        wanted = [i for i, o in enumerate(self.stars.blend_options(items, moments)) if o != "model"]
        if wanted:
            values = self.llm_star_reads([contexts[i] for i in wanted])
            for i, value in zip(wanted, values, strict=True):
                raw[i] = value
                reads[i]["llm_stars_read"] += 1
                reads[i]["llm_stars_unreadable"] += value is None
        # the star model calibrates expected stars itself, as it did on validation: given them raw
        stars, names = self.stars.predict(users, items, moments, llm_stars=raw)
        return stars, names, reads

    # -- candidates and selection ----------------------------------------------------------------------
    def sampling(self, max_new_tokens: int, temperature: float, seed: int) -> Sampling:
        return Sampling(
            max_new_tokens,
            temperature,
            seed=seed,
            repetition_penalty=self.config.repetition_penalty,
            no_repeat_ngram_size=self.config.no_repeat_ngram_size,
        )

    def conversation(self, messages: list[dict], stars: float | None) -> list[dict]:
        """The task's messages, and for decided stars the answer's beginning the model continues."""
        if stars is None:
            return messages
        return [*messages, {"role": "assistant", "content": answer_beginning(stars)}]

    def constraint(self, stars_given: bool) -> Constraint | None:
        if not self.config.constrained:
            return None
        chars = self.config.max_review_chars
        return Constraint.review(chars) if stars_given else Constraint.answer(chars)

    def sample(
        self, contexts: list[Context], stars: list[float] | None = None
    ) -> tuple[list[list[str]], list[int]]:
        """``samples`` reviews per context from the LLM at ``sample_temperature`` (unusable ones left
        out; the caller counts them), and how many of each context's samples hit the length cap. With
        ``stars`` each review is written after its task's decided stars."""
        n = self.config.samples
        if n == 0 or not contexts:
            return [[] for _ in contexts], [0] * len(contexts)
        tokens = self.config.sample_max_new_tokens or self.config.max_new_tokens
        sampling = self.sampling(tokens, self.config.sample_temperature, self.config.seed + 1)
        given = [None] * len(contexts) if stars is None else stars
        conversations = [
            self.conversation(self.messages(c), s)
            for c, s in zip(contexts, given, strict=True)
            for _ in range(n)
        ]
        answers = self.llm.generate(conversations, sampling, constraint=self.constraint(stars is not None))
        begun = [c[-1]["content"] if stars is not None else "" for c in conversations]
        reviews = [parse_completion(b + a.text)[1] for b, a in zip(begun, answers, strict=True)]
        cut = [sum(a.cut_short for a in answers[i * n : (i + 1) * n]) for i in range(len(contexts))]
        kept = [
            [r.strip() for r in reviews[i * n : (i + 1) * n] if r and r.strip()] for i in range(len(contexts))
        ]
        return kept, cut

    def retrieved(self, ctx: Context) -> tuple[list[tuple[str, str]], int | None]:
        """Real candidates: the user's own reviews most similar to the item, then the item's reviews
        nearest the centroid of the user's reviews (none without a user history); and the position of
        the nearest-centroid baseline's review among them, appended when it is not one of them already
        (for a new item it is the user's own review nearest their centroid), so every pool can choose it."""
        user = self.retriever.rank(ctx.item_text, ctx.history, self.config.candidates_user)
        item = self.retriever.nearest_centroid(ctx.history, ctx.item_pool, self.config.candidates_item)
        pool = [(r["text"], "user") for r in user] + [(r["text"], "item") for r in item]
        best = self.retriever.centroid_review(ctx.history, ctx.item_all)
        if best is None:
            return pool, None
        baseline = (best["text"], "item" if ctx.item_all else "user")
        if baseline in pool:
            return pool, pool.index(baseline)
        return [*pool, baseline], len(pool)

    def group(self, ctx: Context) -> str:
        """The task's group for its selection rule: does the item have a visible review by another user
        older than the moment. With the task pair blocked, as in every evaluation, that is how the star
        model groups; on an unblocked store the user's own earlier rating counts for the star model."""
        return GROUPS[bool(ctx.item_all)]

    def rule(self, ctx: Context) -> tuple[str, float]:
        """The pool and sentiment weight this task is chosen with: its group's in ``selection_rule``,
        else the config's."""
        if self.selection_rule is None:
            return self.config.pool, self.config.sentiment_weight
        chosen = self.selection_rule["groups"][self.group(ctx)]
        return chosen["pool"], chosen.get("sentiment_weight", 0.0)

    def wants_samples(self, ctx: Context) -> bool:
        """Whether this task's pool draws sampled answers: always without a selection rule (the pools
        are kept for eval.review.selection to re-choose from), under one only where its choice uses them."""
        return self.selection_rule is None or uses_samples(self.rule(ctx)[0])

    def select(self, tasks: list[dict], contexts: list[Context], predictions: list[Prediction]) -> None:
        """Give each prediction its pool and the review of least risk among the configured sources.
        Samples are drawn for every task, or under a selection rule only where its choice uses them."""
        wanted = [i for i, ctx in enumerate(contexts) if self.wants_samples(ctx)]
        given = [predictions[i].stars for i in wanted] if self.config.kind in TUNED else None
        drawn_for, cut_for = self.sample([contexts[i] for i in wanted], given)
        samples, cut = [None] * len(contexts), [0] * len(contexts)
        for i, drawn, n_cut in zip(wanted, drawn_for, cut_for, strict=True):
            samples[i], cut[i] = drawn, n_cut
        pools, centroids = [], []
        for ctx, p, drawn, n_cut in zip(contexts, predictions, samples, cut, strict=True):
            if drawn is None:  # the rule's choice for this task cannot use them
                p.counts["samples_not_needed"] += self.config.samples
                drawn = []
            else:
                p.counts["unusable_samples"] += self.config.samples - len(drawn)
            p.counts["samples_cut_short"] += n_cut
            # the answer's text is the LLM's, unless it had none and a retrieved review stood in; the
            # stats agent (no LLM) has no answer: its pool is the retrieved reviews
            first = "fallback" if p.counts["retrieved_fallback_review"] else "llm"
            answer = [] if p.source == "stats" else [(p.review, first)]
            real, centroid = self.retrieved(ctx)
            pool = [*answer, *((s, "sample") for s in drawn), *real]
            centroids.append(None if centroid is None else len(pool) - len(real) + centroid)
            pools.append(pool or [(p.review, "fallback")])  # nothing retrieved: its fallback review
        texts = [t for pool in pools for t, _ in pool]
        vectors = self.retriever.embed(texts)
        compounds = np.round(self.vader(texts), 4)  # as kept in the pool, so re-choosing offline agrees
        at = 0
        for task, ctx, p, pool, centroid in zip(tasks, contexts, predictions, pools, centroids, strict=True):
            v, c = vectors[at : at + len(pool)], compounds[at : at + len(pool)]
            at += len(pool)
            p.candidates = [
                {"text": t, "source": s, "vader": float(x)} for (t, s), x in zip(pool, c, strict=True)
            ]
            if centroid is not None:
                p.candidates[centroid]["centroid"] = True  # the nearest-centroid baseline's review
            target = self.sentiment.expected(p.stars, self.before(task))
            sources = [s for _, s in pool]
            pool_name, weight = self.rule(ctx)
            p.group = self.group(ctx)
            p.selection = f"{p.group}: {option_name(pool_name, weight)}" if self.selection_rule else None
            p.chosen = choose(sources, v, c, target, weight, pool_name, centroid)
            if p.chosen is None:  # e.g. retrieved only, for a user with no history: the LLM's answer
                p.counts["empty_pool"] += 1
                p.chosen = 0
            p.review = pool[p.chosen][0]

    def choose_written(
        self, tasks: list[dict], contexts: list[Context], predictions: list[Prediction]
    ) -> None:
        """tuned-write: each prediction's review is the one of highest utility (agents.review.write) among
        the model's greedy answer and its ``samples`` sampled ones, all written after the decided stars.
        The pool is kept with every feature, so eval.review.selection --utility can choose the weights on
        validation without asking the model again."""
        drawn_for, cut_for = self.sample(contexts, [p.stars for p in predictions])
        pools = []
        for p, drawn, n_cut in zip(predictions, drawn_for, cut_for, strict=True):
            p.counts["unusable_samples"] += self.config.samples - len(drawn)
            p.counts["samples_cut_short"] += n_cut
            first = "fallback" if p.counts["retrieved_fallback_review"] else "llm"
            pools.append([(p.review, first), *((text, "sample") for text in drawn)])
        texts = [t for pool in pools for t, _ in pool]
        older = [[r["text"] for r in ctx.history] + [r["text"] for r in ctx.item_pool] for ctx in contexts]
        shown = [[r["text"] for r in ctx.user_reviews + ctx.item_reviews] for ctx in contexts]
        # the older reviews a utility compares with: the user's and the item's shown in the prompt
        refs = [t for part in shown for t in part]
        vectors = self.retriever.embed(texts + refs)
        emotions = self.emotion([t[:EMOTION_CHARS] for t in texts + refs])  # as the metric reads emotion
        compounds = np.round(self.vader(texts), 4)
        at, ref_at = 0, len(texts)
        for task, ctx, p, pool, known, seen in zip(
            tasks, contexts, predictions, pools, older, shown, strict=True
        ):
            n, n_user = len(pool), len(ctx.user_reviews)
            v, e, c = vectors[at : at + n], emotions[at : at + n], compounds[at : at + n]
            ref_vectors = vectors[ref_at : ref_at + len(seen)]
            ref_emotions = emotions[ref_at : ref_at + len(seen)]
            at, ref_at = at + n, ref_at + len(seen)
            values = write.features(
                v,
                c,
                e,
                self.sentiment.expected(p.stars, self.before(task)),
                ref_vectors[:n_user],
                ref_vectors[n_user:],
                ref_emotions[:n_user],
                ref_emotions[n_user:],
                np.array([len(words(t)) for t, _ in pool]),
                np.array([len(words(r["text"])) for r in ctx.user_reviews]),
            )
            spans, moment = write.copied_spans(known), self.before(task)
            copied = [write.copies(t, spans, self.short_reviews, moment) for t, _ in pool]
            looping = [write.loops(t) for t, _ in pool]
            p.candidates = [
                {
                    "text": t,
                    "source": src,
                    "vader": float(x),
                    "copied": cp,
                    "loops": lp,
                    "features": {k: round(float(values[k][j]), 6) for k in write.FEATURES},
                }
                for j, ((t, src), x, cp, lp) in enumerate(zip(pool, c, copied, looping, strict=True))
            ]
            eligible = [not (cp or lp) for cp, lp in zip(copied, looping, strict=True)]
            p.counts["written_candidates"] += n
            p.counts["copied_candidates"] += sum(copied)
            p.counts["looping_candidates"] += sum(looping)
            p.counts["no_eligible_candidate"] += not any(eligible)
            p.chosen = write.choose(values, self.weights, eligible)
            p.review = pool[p.chosen][0]
            p.group = self.group(ctx)

    def llm_star_reads(self, contexts: list[Context]) -> list[float | None]:
        """The LLM's stars for each context from the probability of each digit after the answer's
        beginning "stars: " (the renderer's format), one forward pass per prompt (agents.llm.option_probs):
        the expected value (``llm_stars: expected``) or the most likely digit (greedy)."""
        conversations = [self.messages(c) for c in contexts]
        read = option_probs(self.llm, conversations, STAR_DIGITS, seed=self.config.seed, prefix=STARS_PREFIX)
        return [read_choice(a, self.config.llm_stars) for a in read]

    def ask(self, contexts: list[Context], stars: list[float] | None = None) -> list[TaskAnswer]:
        """The LLM's answer for each context; an unusable one is asked once more, stricter. With
        ``stars`` the answer's beginning is given (the decided stars) and the model writes the review.
        Each answer carries its own counts (answers, parse failures, retries, retry successes)."""
        sampling = self.sampling(self.config.max_new_tokens, self.config.temperature, self.config.seed)
        constraint = self.constraint(stars is not None)
        fitted = [self.fit(c) for c in contexts]
        given = [None] * len(contexts) if stars is None else stars
        conversations = [self.conversation(f.messages, s) for f, s in zip(fitted, given, strict=True)]
        begun = [c[-1]["content"] if s is not None else "" for c, s in zip(conversations, given, strict=True)]
        replies: list[LLMAnswer] = self.llm.generate(conversations, sampling, constraint=constraint)
        answers = []
        for reply, ctx, prompt, start in zip(replies, contexts, fitted, begun, strict=True):
            stars, review = parse_completion(start + reply.text)
            counts = Counter(
                llm_answers=1, unconstrained=int(constraint is not None and not reply.constrained)
            )
            counts.update(prompt_counts(prompt, bool(ctx.history)))
            if reply.cached:  # a key only where it happened, as with the other counts (answer_cache)
                counts["cached_answers"] += 1
            ok = usable(stars, review)
            counts["parse_failures"] += not ok
            unusable = [] if ok else [reply.text]
            answers.append(
                TaskAnswer(stars, review, start + reply.text, "llm", unusable, reply.cut_short, counts)
            )
        bad = [i for i, a in enumerate(answers) if not usable(a.stars, a.review)]
        if bad:  # one retry, stricter
            retry = [
                self.conversation(
                    fitted[i].messages
                    + [
                        {"role": "assistant", "content": answers[i].text},
                        {"role": "user", "content": STRICT},
                    ],
                    given[i],
                )
                for i in bad
            ]
            again = self.llm.generate(retry, sampling, constraint=constraint)
            for i, reply in zip(bad, again, strict=True):
                answer = answers[i]
                answer.counts["retries"] += 1
                if reply.cached:
                    answer.counts["cached_retries"] += 1
                stars, review = parse_completion(begun[i] + reply.text)
                if usable(stars, review):
                    answer.stars, answer.review, answer.text, answer.source, answer.cut_short = (
                        stars,
                        review,
                        begun[i] + reply.text,
                        "llm_retry",
                        reply.cut_short,
                    )
                    answer.counts["retry_successes"] += 1
                else:
                    answer.unusable.append(reply.text)
        return answers
