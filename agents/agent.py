"""The review agent: retrieval + an LLM through the shared prompt renderer + calibrated stars.

Kinds (all runnable by config, see configs/agents/):
- ``stats``: no LLM. Calibrated stars; the review is the user's past review most similar to the item.
- ``asc-baseline``: a re-creation of the official baseline agent's recipe: the user, the item and one
  similar review of the item, the base model, the LLM's own stars.
- ``retrieval-llm``: the base model with our retrieval prompt (k user + k item reviews), LLM stars.
- ``tuned``: a LoRA adapter (train.sft) with the retrieval prompt and the calibrated stars.

Every answer is parsed (data_prep.prompt.parse_completion). An unusable one (no stars, stars outside
1-5, no review) is asked again once with a stricter instruction; if still unusable, a retrieval-based
fallback answers. A prediction never has an empty review. Retries and fallbacks are counted.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from tqdm import tqdm

from agents.llm import LLMConfig, Sampling, load_llm
from agents.retrieval import Retriever
from agents.stars import StarModel
from data_prep.prompt import build_messages, describe_item, fit_messages, parse_completion

KINDS = ("stats", "asc-baseline", "retrieval-llm", "tuned")
STRICT = (
    "Your answer was not in the required format. Answer again with exactly two lines and nothing else:\n"
    "stars: <a whole number from 1 to 5>\nreview: <the review text>"
)


@dataclass
class AgentConfig:
    kind: str = field(default="stats", metadata={"help": f"one of {', '.join(KINDS)}"})
    k_user: int = 5
    k_item: int = 3
    retrieval: str = field(default="embedding", metadata={"help": "embedding or bm25"})
    prompt_tokens: int = field(
        default=768, metadata={"help": "prompt budget; oldest shown reviews dropped first"}
    )
    max_new_tokens: int = 160
    temperature: float = 0.0
    seed: int = 0
    batch_size: int = 8
    item_candidates: int = field(
        default=100, metadata={"help": "retrieval ranks the item's most recent N older reviews"}
    )
    blend_validation: int = field(
        default=0,
        metadata={
            "help": "tuned: ask the LLM for N validation reviews' stars and offer blends of the "
            "calibrated stars with them as star-model candidates (0: no blend)"
        },
    )


@dataclass
class Prediction:
    task_id: int
    stars: float
    review: str
    source: str  # llm | llm_retry | fallback | stats
    raw: str | None = None
    unusable: list[str] = field(default_factory=list)  # LLM answers that could not be used, in order
    cut_short: bool = False  # the answer used stopped at max_new_tokens (its review may be truncated)


def usable(stars: float | None, review: str | None) -> bool:
    return stars is not None and 1 <= stars <= 5 and bool(review and review.strip())


class ReviewAgent:
    def __init__(self, config: AgentConfig, llm_config: LLMConfig | None, store, encoder=None):
        if config.kind not in KINDS:
            raise ValueError(f"unknown agent kind {config.kind!r}: one of {KINDS}")
        if config.item_candidates < 1:
            raise ValueError("item_candidates must be at least 1")
        self.config, self.store = config, store
        self.retriever = Retriever(encoder if config.retrieval == "embedding" else None)
        self.llm = load_llm(llm_config) if config.kind != "stats" else None
        self.tokenizer = getattr(self.llm, "tokenizer", None)
        visible = store.visible_ratings()
        self.stars = StarModel().fit(visible)
        self.counts = dict.fromkeys(
            ("llm_answers", "parse_failures", "retries", "retry_successes", "fallbacks", "cut_short"), 0
        )
        if config.kind == "tuned" and config.blend_validation > 0:
            asked = min(config.blend_validation, len(self.stars.validation))
            self.stars = StarModel().fit(visible, llm_validation=self.llm_validation_stars(asked))
            self.stars.report["llm_validation_asked"] = asked

    def llm_validation_stars(self, n: int) -> dict[str, float]:
        """The LLM's stars for a seeded sample of n of the star model's validation reviews, each asked
        like a task (only strictly older reviews shown); unusable answers are left out. These answers
        are not task answers, so they do not enter the agent's counts."""
        sample = random.Random(self.config.seed).sample(self.stars.validation, n)
        tasks = [
            {"task_id": review_id, "user_id": user, "item_id": item, "date": ts}
            for review_id, user, item, ts, _ in sample
        ]
        answered = {}
        for start in tqdm(range(0, len(tasks), self.config.batch_size), desc="LLM stars for the blend"):
            batch = tasks[start : start + self.config.batch_size]
            parsed = self.ask(self.contexts(batch), counts=dict.fromkeys(self.counts, 0))[0]
            answered.update(
                (t["task_id"], s) for t, (s, r) in zip(batch, parsed, strict=True) if usable(s, r)
            )
        return answered

    # -- context ---------------------------------------------------------------------------------------
    def context(self, task: dict) -> dict:
        return self.contexts([task])[0]

    def contexts(self, tasks: list[dict]) -> list[dict]:
        """What the agent may see for each task: only reviews strictly older than its target (the store
        hides the task pairs). Shown reviews are ranked by relevance, then put oldest first."""
        k_user, k_item = self.config.k_user, self.config.k_item
        if self.config.kind == "asc-baseline":
            k_user, k_item = 0, 1
        contexts, requests = [], []
        for task in tasks:
            before = task["date"]
            user, item = self.store.get_user(task["user_id"]), self.store.get_item(task["item_id"])
            history = self.store.get_reviews(user_id=task["user_id"], before=before)
            item_pool = self.store.get_reviews(item_id=task["item_id"], before=before)
            item_pool = item_pool[-self.config.item_candidates :]  # the most recent ones
            item_text = describe_item(item)
            style = " ".join(r["text"] for r in history[-3:]) or item_text
            ctx = {"user": user, "item": item, "history": history, "item_pool": item_pool}
            ctx["item_text"] = item_text
            contexts.append(ctx)
            if self.config.kind == "stats":  # only the fallback review is needed
                requests += [(item_text, history, 1), (item_text, item_pool, 0 if history else 1)]
            else:
                requests += [(item_text, history, k_user), (style, item_pool, k_item)]
        ranked = self.retriever.rank_many(requests)
        by_age = lambda reviews: sorted(reviews, key=lambda r: (r["date"], r["review_id"]))  # noqa: E731
        for n, ctx in enumerate(contexts):
            ctx["user_reviews"], ctx["item_reviews"] = by_age(ranked[2 * n]), by_age(ranked[2 * n + 1])
        return contexts

    def messages(self, ctx: dict) -> list[dict]:
        if self.tokenizer is not None:
            messages, _, _ = fit_messages(
                self.tokenizer,
                ctx["user"],
                ctx["user_reviews"],
                ctx["item"],
                ctx["item_reviews"],
                self.config.prompt_tokens,
            )
            return messages
        return build_messages(ctx["user"], ctx["user_reviews"], ctx["item"], ctx["item_reviews"])

    def fallback_review(self, ctx: dict) -> str:
        """The most relevant past review of the user, else of the item, else a neutral sentence."""
        for pool in (ctx["history"], ctx["item_pool"]):
            best = self.retriever.rank(ctx["item_text"], pool, 1)
            if best:
                return best[0]["text"]
        return "It was fine."

    # -- prediction ------------------------------------------------------------------------------------
    def predict(self, tasks: list[dict]) -> list[Prediction]:
        contexts = self.contexts(tasks)
        if self.llm is None:
            return [
                Prediction(
                    t["task_id"],
                    self.stars.predict(t["user_id"], t["item_id"]),
                    self.fallback_review(c),
                    "stats",
                )
                for t, c in zip(tasks, contexts, strict=True)
            ]
        parsed, answers, sources, unusable, cut = self.ask(contexts)
        out = []
        for task, ctx, (stars, review), answer, source, rejected, cut_short in zip(
            tasks, contexts, parsed, answers, sources, unusable, cut, strict=True
        ):
            if not usable(stars, review):
                self.counts["fallbacks"] += 1
                calibrated = self.stars.predict(task["user_id"], task["item_id"])
                # keep what was usable: LLM stars in range, or its review text
                stars = stars if stars is not None and 1 <= stars <= 5 else calibrated
                if not (review and review.strip()):
                    review, cut_short = self.fallback_review(ctx), False
                source = "fallback"
            if self.config.kind == "tuned":
                stars = self.stars.predict(task["user_id"], task["item_id"], llm_stars=stars)
            self.counts["cut_short"] += cut_short
            out.append(
                Prediction(task["task_id"], float(stars), review.strip(), source, answer, rejected, cut_short)
            )
        return out

    def ask(
        self, contexts: list[dict], counts: dict | None = None
    ) -> tuple[list, list[str], list[str], list[list[str]], list[bool]]:
        """The LLM's parsed answers (stars, review), raw answers, sources, unusable answers and whether
        each answer stopped at max_new_tokens; an unusable answer is asked once more, stricter.
        Answers, failures and retries are added to ``counts`` (default: the agent's)."""
        counts = self.counts if counts is None else counts
        sampling = Sampling(self.config.max_new_tokens, self.config.temperature, seed=self.config.seed)
        conversations = [self.messages(c) for c in contexts]
        answers = self.llm.generate(conversations, sampling)
        cut = list(self.llm.cut_short)
        counts["llm_answers"] += len(answers)
        parsed = [parse_completion(a) for a in answers]
        sources = ["llm"] * len(contexts)
        bad = [i for i, (s, r) in enumerate(parsed) if not usable(s, r)]
        unusable = [[answers[i]] if i in bad else [] for i in range(len(answers))]
        counts["parse_failures"] += len(bad)
        if bad:  # one retry, stricter
            retry = [
                conversations[i]
                + [{"role": "assistant", "content": answers[i]}, {"role": "user", "content": STRICT}]
                for i in bad
            ]
            counts["retries"] += len(bad)
            again = self.llm.generate(retry, sampling)
            for i, answer, answer_cut in zip(bad, again, self.llm.cut_short, strict=True):
                stars, review = parse_completion(answer)
                if usable(stars, review):
                    parsed[i], answers[i], sources[i], cut[i] = (
                        (stars, review),
                        answer,
                        "llm_retry",
                        answer_cut,
                    )
                    counts["retry_successes"] += 1
                else:
                    unusable[i].append(answer)
        return parsed, answers, sources, unusable, cut
