"""The recommender sandbox's training check (eval.training:choice_task_metric).

For choice pairs: the top-1 accuracy of the greedy answer (the number of a film on the page) on
``task_examples`` validation pages, beside two references on the same pages: the most-rated film on the
page (the counts the page shows, all older than the page's moment; ties share the credit) and chance
(1 / the page's size). The sandbox's popularity baseline picks the most-rated film before the moment,
so on a page it is the first reference. An answer that names no film of the page is wrong and counted.
Rating pairs among them (data_prep.choice_pairs --ratings): the mean absolute error of the greedy digit
against the real stars, beside the user's mean before the moment; an answer without a digit 1-5 is
counted and scored as 3. The best checkpoint is kept by the choice accuracy.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from eval.task_check import NOT_KEPT, kept_and_references, paired_share, restore, write_answers

CHOICE_PLOT = {
    "ylabel": "top-1 accuracy on validation pages",
    "title": "dotted: the most-rated film on the page, and chance",
    "series": {"top-1": ["task_accuracy", "most_rated_accuracy"], "chance": [None, "chance_accuracy"]},
}
RATING_SERIES = {"rating MAE (stars)": ["task_rating_mae", "user_mean_rating_mae"]}


def first_number(text: str) -> int | None:
    found = re.search(r"\d+", text)
    return int(found.group()) if found else None


class ChoiceTaskMetric:
    """Top-1 accuracy of greedy answers on validation pages, beside the most-rated film on the page
    and chance; rating MAE beside the user's mean where rating pairs are among them (module docstring)."""

    def __init__(self, pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 4):
        if not rows:
            raise ValueError("the task metric needs validation pairs")
        self.choices = [i for i, r in enumerate(rows) if r.get("task", "choice") == "choice"]
        self.ratings = [i for i, r in enumerate(rows) if r.get("task") == "rating"]
        if not self.choices:
            raise SystemExit(f"error: {pairs}/validation.jsonl has no choice pairs to score")
        if any("page_counts" not in rows[i] for i in self.choices):
            raise SystemExit(
                f"error: {pairs}/validation.jsonl has no page_counts: rebuild the pairs (data_prep.choice_pairs)"
            )
        self.rows, self.output_dir, self.max_new_tokens = rows, Path(output_dir), max_new_tokens
        self.truth = np.array([int(rows[i]["completion"][0]["content"]) for i in self.choices])
        counts = [np.asarray(rows[i]["page_counts"]) for i in self.choices]
        # the most-rated film's credit: 1 / (films tied at the top) when the real one is among them
        self.most_rated = np.array(
            [
                float(c[t - 1] == c.max()) / float((c == c.max()).sum())
                for c, t in zip(counts, self.truth, strict=True)
            ]
        )
        self.chance = np.array([1.0 / len(c) for c in counts])
        self.stars = np.array([rows[i]["stars"] for i in self.ratings], dtype=float)
        means = [rows[i]["user_mean_before"] for i in self.ratings]
        self.user_mean_error = np.abs(np.array([3.0 if m is None else m for m in means]) - self.stars)
        self.history: list[dict] = []

    @property
    def prompts(self) -> list[str]:
        return [r["rendered"] for r in self.rows]

    def __call__(self, texts: list[str], step: int, write: bool = True) -> dict[str, float]:
        picks = [first_number(texts[i]) for i in self.choices]
        pages = [len(self.rows[i]["page"]) for i in self.choices]
        unreadable = sum(p is None or not 1 <= p <= n for p, n in zip(picks, pages, strict=True))
        correct = np.array([float(p == t) for p, t in zip(picks, self.truth, strict=True)])
        metrics = {
            "task_accuracy": round(float(correct.mean()), 4),
            "most_rated_accuracy": round(float(self.most_rated.mean()), 4),
            "chance_accuracy": round(float(self.chance.mean()), 4),
        }
        if self.ratings:
            digits = [first_number(texts[i]) for i in self.ratings]
            bad = [d is None or not 1 <= d <= 5 for d in digits]
            given = np.array([3.0 if b else float(d) for d, b in zip(digits, bad, strict=True)])
            metrics["task_rating_mae"] = round(float(np.abs(given - self.stars).mean()), 4)
            metrics["user_mean_rating_mae"] = round(float(self.user_mean_error.mean()), 4)
            unreadable += sum(bad)
        metrics["task_unreadable"] = int(unreadable)
        self.history.append({"step": step, **metrics, "correct": correct})
        if write:
            write_answers(self.output_dir, step, self.rows, texts, "example_id")
        return metrics

    def summary(self, best_step: int | None) -> dict:
        """The curve and, at the kept step, the paired accuracy difference (BCa, over pages) against the
        base model (step 0) and against the most-rated film on the page."""
        restore(self, best_step, "example_id")
        curve = [{k: v for k, v in h.items() if k != "correct"} for h in self.history]
        plot = (
            CHOICE_PLOT
            if not self.ratings
            else {**CHOICE_PLOT, "series": {**CHOICE_PLOT["series"], **RATING_SERIES}}
        )
        out = {"examples": len(self.rows), "curve": curve, "plot": plot}
        kept, others = kept_and_references(
            self.history, best_step, "correct", ("adapter_minus_most_rated", self.most_rated)
        )
        if kept is None:
            return {**out, "kept_step": best_step, "note": NOT_KEPT}
        out["kept_step"] = kept["step"]
        for name, other in others.items():
            out[name] = {"accuracy": paired_share(kept["correct"], other)}
        return out
