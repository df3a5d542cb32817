"""The conversational simulator's training check (eval.training:converse_task_metric).

For the conversational simulator's pairs (data_prep.converse_pairs): on the action examples, the share
of greedy answers whose actions are the real turn's actions (as a set), beside the most common action
set of the training pairs on the same examples; on every example, the share of answers the simulator
can parse (the JSON it asks for: a non-empty ``actions`` list or a non-empty ``message``). An answer it
cannot parse is wrong and counted. The best checkpoint is kept by the action accuracy.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from data_prep.io import read_jsonl
from eval.task_check import NOT_KEPT, kept_and_references, paired_share, restore, write_answers


def answer_json(text: str) -> dict | None:
    """The first JSON object of an answer, or None."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def action_set(text: str) -> frozenset | None:
    value = answer_json(text)
    actions = value.get("actions") if value else None
    if not isinstance(actions, list) or not actions or not all(isinstance(a, str) for a in actions):
        return None
    return frozenset(actions)


CONVERSE_PLOT = {
    "ylabel": "greedy answers on validation turns",
    "title": "dotted: the training pairs' most common action set",
    "series": {
        "actions": ["task_action_accuracy", "majority_action_accuracy"],
        "parsed": ["task_parsed", None],
    },
}


class ConverseTaskMetric:
    """Action accuracy of greedy answers on validation turns beside the training pairs' most common
    action set, and the share of answers the simulator can parse (module docstring)."""

    def __init__(self, pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 64):
        self.actions = [i for i, r in enumerate(rows) if r.get("kind") == "action"]
        if not self.actions:
            raise SystemExit(f"error: {pairs}/validation.jsonl has no action examples to score")
        train = Path(pairs) / "train.jsonl"
        if not train.exists():
            raise SystemExit(
                f"error: {train} is missing: the majority baseline is read from the training pairs"
            )
        sets = Counter(
            action_set(row["completion"][0]["content"])
            for row in read_jsonl(train, whole=True)
            if row.get("kind") == "action"
        )
        self.majority = sets.most_common(1)[0][0] if sets else frozenset()
        self.truth = [action_set(rows[i]["completion"][0]["content"]) for i in self.actions]
        self.majority_correct = np.array([float(t == self.majority) for t in self.truth])
        self.rows, self.output_dir, self.max_new_tokens = rows, Path(output_dir), max_new_tokens
        self.history: list[dict] = []

    @property
    def prompts(self) -> list[str]:
        return [r["rendered"] for r in self.rows]

    def parsed(self, row: dict, text: str) -> bool:
        if row.get("kind") == "action":
            return action_set(text) is not None
        value = answer_json(text)
        return bool(value and isinstance(value.get("message"), str) and value["message"].strip())

    def __call__(self, texts: list[str], step: int, write: bool = True) -> dict[str, float]:
        correct = np.array(
            [float(action_set(texts[i]) == t) for i, t in zip(self.actions, self.truth, strict=True)]
        )
        parsed = [self.parsed(r, x) for r, x in zip(self.rows, texts, strict=True)]
        metrics = {
            "task_action_accuracy": round(float(correct.mean()), 4),
            "majority_action_accuracy": round(float(self.majority_correct.mean()), 4),
            "task_parsed": round(float(np.mean(parsed)), 4),
            "task_unreadable": int(len(parsed) - sum(parsed)),
        }
        self.history.append({"step": step, **metrics, "correct": correct})
        if write:
            write_answers(self.output_dir, step, self.rows, texts, "example_id")
        return metrics

    def summary(self, best_step: int | None) -> dict:
        """The curve and, at the kept step, the paired action-accuracy difference (BCa, over turns)
        against the base model (step 0) and against the majority action set."""
        restore(self, best_step, "example_id")
        curve = [{k: v for k, v in h.items() if k != "correct"} for h in self.history]
        out = {"examples": len(self.rows), "curve": curve, "plot": CONVERSE_PLOT,
               "majority_actions": sorted(self.majority)}  # fmt: skip
        kept, others = kept_and_references(
            self.history, best_step, "correct", ("adapter_minus_majority", self.majority_correct)
        )
        if kept is None:
            return {**out, "kept_step": best_step, "note": NOT_KEPT}
        out["kept_step"] = kept["step"]
        for name, other in others.items():
            out[name] = {"action_accuracy": paired_share(kept["correct"], other)}
        return out
