"""The review simulator's training check (eval.training:review_task_metric).

train.sft calls it at step 0 (``eval_on_start``) and at every evaluation. It writes the greedy answer for
``task_examples`` validation pairs (users held out from training, spread over the file), scores the
stars and review with the offline evaluator (eval.scoring: PE, RG and overall, the stand-in scorers),
and scores beside them, on the same pairs, the copy baseline: another user's older review of the item
nearest the centroid of the user's older reviews, with the median of the user's older stars
(eval.review.baselines' nearest-centroid, time-aware: only reviews strictly older than the pair's
target, from the stores the pairs were built from, their task pairs blocked). An answer without
readable stars gets the user's median stars and is counted (``unreadable``); its text is scored as
written.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from agents.encoders import packaged_minilm
from agents.retrieval import Retriever
from data_prep.prompt import parse_completion
from data_prep.schema import parse_iso
from data_prep.store import ReviewStore
from eval.backends import build_scorers
from eval.metrics import paired_bootstrap
from eval.scoring import score_pairs, summarise
from eval.task_check import NOT_KEPT, kept_and_references, restore, write_answers

TERMS = {
    "star": "star_error",
    "sentiment": "sentiment_error",
    "emotion": "emotion_error",
    "topic": "topic_error",
}


def terms_of(scored: dict) -> dict[str, np.ndarray]:
    return {short: np.asarray(scored[long]) for short, long in TERMS.items()}


def headline(scored: dict) -> dict[str, float]:
    s = summarise(scored)
    return {
        "overall": round(s["overall"], 4),
        "review_generation": round(s["review_generation"], 4),
        "preference_estimation": round(s["preference_estimation"], 4),
    }


# what train.sft's loss.png draws of a metric's curve: each series beside its dotted reference
REVIEW_PLOT = {
    "ylabel": "greedy answer on validation pairs",
    "title": "dotted: the copy baseline (nearest-centroid review)",
    "series": {
        name: [f"task_{name}", f"copy_{name}"]
        for name in ("overall", "review_generation", "preference_estimation")
    },
}


class ReviewTaskMetric:
    """Greedy answers for some validation pairs, scored beside the copy baseline (module docstring)."""

    def __init__(self, pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 128):
        if not rows:
            raise ValueError("the task metric needs validation pairs")
        self.rows, self.output_dir, self.max_new_tokens = rows, Path(output_dir), max_new_tokens
        card = json.loads((Path(pairs) / "card.json").read_text())
        # each store with its task pairs blocked, as data_prep.pairs built the prompts: the copy sees what
        # the model was shown, no more
        stores = [ReviewStore.open(d["dir"], tasks=d.get("tasks")) for d in card["data"]]
        encoder = packaged_minilm("auto", 64)
        self.scorers = build_scorers("offline", device="cpu")
        retriever = Retriever(encoder)
        self.truth = [parse_completion(r["completion"][0]["content"]) for r in rows]
        copies, self.median = [], []
        for row in rows:
            store = next((s for s in stores if s.get_user(row["user_id"]) is not None), stores[0])
            before = parse_iso(row["date"])
            history = store.get_reviews(user_id=row["user_id"], before=before)
            # other users' reviews, as the prompt's item section and the agents' copy baseline
            item = store.get_reviews(item_id=row["item_id"], before=before, not_user=row["user_id"])
            best = retriever.centroid_review(history, item)
            median = float(np.median([r["stars"] for r in history])) if history else 3.0
            self.median.append(median)
            copies.append((median, best["text"] if best else ""))
        self.copies = copies  # the copy baseline's (stars, text) per pair
        self.copy = score_pairs(
            [c[0] for c in copies],
            [c[1] for c in copies],
            [t[0] for t in self.truth],
            [t[1] for t in self.truth],
            self.scorers,
        )
        self.history: list[dict] = []  # per evaluation: step, the headline and the per-pair terms

    @property
    def prompts(self) -> list[str]:
        """The rendered prompts train.sft answers greedily at each evaluation."""
        return [r["rendered"] for r in self.rows]

    def __call__(self, texts: list[str], step: int, write: bool = True) -> dict[str, float]:
        """The metrics of these greedy answers (one per row) at this step, beside the copy baseline's."""
        parsed = [parse_completion(t) for t in texts]
        unreadable = [s is None or not 1 <= s <= 5 for s, _ in parsed]
        stars = [m if bad else s for (s, _), m, bad in zip(parsed, self.median, unreadable, strict=True)]
        reviews = [r if r else t for (_, r), t in zip(parsed, texts, strict=True)]
        scored = score_pairs(
            stars, reviews, [t[0] for t in self.truth], [t[1] for t in self.truth], self.scorers
        )
        metrics = {f"task_{k}": v for k, v in headline(scored).items()}
        metrics |= {f"copy_{k}": v for k, v in headline(self.copy).items()}
        metrics["task_unreadable"] = int(sum(unreadable))
        self.history.append({"step": step, **metrics, "terms": terms_of(scored)})
        if write:
            write_answers(self.output_dir, step, self.rows, texts, "review_id")
        return metrics

    def summary(self, best_step: int | None) -> dict:
        """For the model card: the curve, and at the kept step the paired difference against the base
        model (step 0: the adapter's B matrices start at zero) and against the copy baseline."""
        restore(self, best_step, "review_id")
        curve = [{k: v for k, v in h.items() if k != "terms"} for h in self.history]
        out = {"examples": len(self.rows), "curve": curve, "plot": REVIEW_PLOT}
        kept, comparisons = kept_and_references(
            self.history, best_step, "terms", ("adapter_minus_copy", terms_of(self.copy))
        )
        if kept is None:
            return {**out, "kept_step": best_step, "note": NOT_KEPT}
        out["kept_step"] = kept["step"]
        for name, other in comparisons.items():
            out[name] = {
                metric: {
                    k: (round(v, 4) if isinstance(v, float) else v)
                    for k, v in paired_bootstrap(kept["terms"], other, metric).items()
                    if k in ("difference", "ci95", "n")
                }
                for metric in ("overall", "review_generation", "preference_estimation")
            }
            for value in out[name].values():
                value["ci95"] = [round(x, 4) for x in value["ci95"]]
        return out
