"""What every task metric of the training check shares (eval.training; one module per simulator):
the greedy answers kept per evaluation, their restore after a resume, and the card's paired comparisons.

Each evaluation's answers are kept in output_dir/task_eval/step_N.jsonl. A resumed run scores those of
the step it keeps and of step 0 again, so its card compares them as an unbroken run's would.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from data_prep.io import read_jsonl
from eval.metrics import paired_claim


def write_answers(output_dir: Path, step: int, rows: list[dict], texts: list[str], key: str) -> None:
    """output_dir/task_eval/step_N.jsonl: each example's id (``key``), the greedy answer, the truth."""
    folder = output_dir / "task_eval"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({key: r[key], "answer": t, "truth": r["completion"][0]["content"]}) + "\n"
        for r, t in zip(rows, texts, strict=True)
    ]
    (folder / f"step_{step}.jsonl").write_text("".join(lines))


NOT_KEPT = (
    "the kept step was evaluated before this process resumed and its answers are not in task_eval/: "
    "no paired comparison"
)


def restore(metric, steps, key: str) -> None:
    """Evaluations made by an earlier process of a resumed run: score again the greedy answers it saved
    in output_dir/task_eval/step_N.jsonl, so the card's paired comparisons survive a restart. A step is
    restored only when its file holds the same examples (``key``) with the same truths, in order; else it
    stays unknown. Scoring is deterministic, so a restored step scores as it did."""
    have = {h["step"] for h in metric.history}
    for step in sorted({s for s in steps if s is not None} - have):
        path = metric.output_dir / "task_eval" / f"step_{step}.jsonl"
        if not path.exists():
            continue
        saved = read_jsonl(path)  # a last line cut by a kill is left out: then the examples differ
        same = [(s[key], s["truth"]) for s in saved] == [
            (r[key], r["completion"][0]["content"]) for r in metric.rows
        ]
        if same:
            metric([s["answer"] for s in saved], step, write=False)
    metric.history.sort(key=lambda h: h["step"])


def kept_and_references(history: list[dict], best_step: int | None, key: str, baseline: tuple[str, object]):
    """The evaluation kept (the best step's; without one, the last) and what the card compares it with,
    by name: the base model (step 0, where the adapter's B matrices start at zero) when the kept step is
    another one, then ``baseline`` (name, per-example values). ``key``: the per-example values of a
    history entry. None and {} when the kept step is in neither the history nor task_eval/ (restore)."""
    by_step = {h["step"]: h for h in history}
    kept = by_step.get(best_step) if best_step is not None else (history[-1] if history else None)
    if kept is None:
        return None, {}
    references = {"adapter_minus_base": by_step[0][key]} if 0 in by_step and kept["step"] != 0 else {}
    return kept, {**references, baseline[0]: baseline[1]}


def paired_share(a: np.ndarray, b: np.ndarray) -> dict:
    """a - b for per-example 0/1 (or shared-credit) scores (eval.metrics.paired_claim), as the card
    writes it: the mean difference, its BCa 95% interval, n."""
    claim = paired_claim(a, b)
    return {"difference": claim["difference"], "ci95": claim["ci"], "n": claim["users"]}
