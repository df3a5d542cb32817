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

from dataclasses import dataclass, field

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


@dataclass
class Prediction:
    task_id: int
    stars: float
    review: str
    source: str  # llm | llm_retry | fallback | stats
    raw: str | None = None


def usable(stars: float | None, review: str | None) -> bool:
    return stars is not None and 1 <= stars <= 5 and bool(review and review.strip())


class ReviewAgent:
    def __init__(self, config: AgentConfig, llm_config: LLMConfig | None, store, encoder=None):
        if config.kind not in KINDS:
            raise ValueError(f"unknown agent kind {config.kind!r}: one of {KINDS}")
        self.config, self.store = config, store
        self.retriever = Retriever(encoder if config.retrieval == "embedding" else None)
        self.llm = load_llm(llm_config) if config.kind != "stats" else None
        self.tokenizer = getattr(self.llm, "tokenizer", None)
        self.stars = StarModel().fit(list(store.visible_reviews()))
        self.counts = {
            "llm_answers": 0,
            "parse_failures": 0,
            "retries": 0,
            "retry_successes": 0,
            "fallbacks": 0,
        }

    # -- context ---------------------------------------------------------------------------------------
    def context(self, task: dict) -> dict:
        """What the agent may see for a task: only reviews strictly older than its target."""
        before = task["date"]
        user, item = self.store.get_user(task["user_id"]), self.store.get_item(task["item_id"])
        history = self.store.get_reviews(user_id=task["user_id"], before=before)
        item_reviews = self.store.get_reviews(item_id=task["item_id"], before=before)
        item_text = describe_item(item)
        style = " ".join(r["text"] for r in history[-3:]) or item_text
        k_user, k_item = self.config.k_user, self.config.k_item
        if self.config.kind == "asc-baseline":
            k_user, k_item = 0, 1
        return {
            "user": user,
            "item": item,
            "history": history,
            "user_reviews": self.retriever.rank(item_text, history, k_user),
            "item_reviews": self.retriever.rank(style, item_reviews, k_item),
            "item_text": item_text,
        }

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
        for pool, query in ((ctx["history"], ctx["item_text"]), (ctx["item_reviews"], ctx["item_text"])):
            best = self.retriever.rank(query, pool, 1)
            if best:
                return best[0]["text"]
        return "It was fine."

    # -- prediction ------------------------------------------------------------------------------------
    def predict(self, tasks: list[dict]) -> list[Prediction]:
        contexts = [self.context(t) for t in tasks]
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
        sampling = Sampling(self.config.max_new_tokens, self.config.temperature, seed=self.config.seed)
        conversations = [self.messages(c) for c in contexts]
        answers = self.llm.generate(conversations, sampling)
        self.counts["llm_answers"] += len(answers)
        parsed = [parse_completion(a) for a in answers]
        sources = ["llm"] * len(tasks)
        bad = [i for i, (s, r) in enumerate(parsed) if not usable(s, r)]
        self.counts["parse_failures"] += len(bad)
        if bad:  # one retry, stricter
            retry = [
                conversations[i]
                + [{"role": "assistant", "content": answers[i]}, {"role": "user", "content": STRICT}]
                for i in bad
            ]
            self.counts["retries"] += len(bad)
            for i, answer in zip(bad, self.llm.generate(retry, sampling), strict=True):
                stars, review = parse_completion(answer)
                if usable(stars, review):
                    parsed[i], answers[i], sources[i] = (stars, review), answer, "llm_retry"
                    self.counts["retry_successes"] += 1
        out = []
        for task, ctx, (stars, review), answer, source in zip(
            tasks, contexts, parsed, answers, sources, strict=True
        ):
            if not usable(stars, review):
                self.counts["fallbacks"] += 1
                calibrated = self.stars.predict(task["user_id"], task["item_id"])
                # keep what was usable: LLM stars in range, or its review text
                stars = stars if stars is not None and 1 <= stars <= 5 else calibrated
                review = review if review and review.strip() else self.fallback_review(ctx)
                source = "fallback"
            if self.config.kind == "tuned":
                stars = self.stars.predict(task["user_id"], task["item_id"], llm_stars=stars)
            out.append(Prediction(task["task_id"], float(stars), review.strip(), source, answer))
        return out
