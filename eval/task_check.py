"""What every task metric of the training check shares (eval.training; one module per simulator):
the greedy answers kept per evaluation, their restore after a resume, and the card's paired comparisons.

Each evaluation's answers are kept in output_dir/task_eval/step_N.jsonl. A resumed run scores those of
the step it keeps and of step 0 again, so its card compares them as an unbroken run's would.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from data_prep.io import read_jsonl, write_atomic
from eval.metrics import paired_claim


def write_answers(output_dir: Path, step: int, rows: list[dict], texts: list[str], key: str) -> None:
    """output_dir/task_eval/step_N.jsonl: each example's id (``key``), the greedy answer, the truth.
    Written whole (write_atomic): a kill leaves the old file or the new one."""
    folder = output_dir / "task_eval"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({key: r[key], "answer": t, "truth": r["completion"][0]["content"]}) + "\n"
        for r, t in zip(rows, texts, strict=True)
    ]
    write_atomic(folder / f"step_{step}.jsonl", "".join(lines))


NOT_KEPT = "task_eval/ holds no answers of these examples for the kept step: no paired comparison"


def saved_answers(metric, step: int, key: str) -> list[str] | None:
    """The greedy answers output_dir/task_eval/step_N.jsonl holds for the metric's examples: None when
    the file is missing, unreadable, or holds other examples (``key``) or other truths, or another order."""
    path = metric.output_dir / "task_eval" / f"step_{step}.jsonl"
    if not path.exists():
        return None
    try:
        saved = read_jsonl(path)
    except ValueError:  # a damaged line: the step stays unknown rather than the card being lost
        return None
    expected = [(r[key], r["completion"][0]["content"]) for r in metric.rows]
    if [(s.get(key), s.get("truth")) for s in saved] != expected:
        return None
    return [s.get("answer", "") for s in saved]


def restore(metric, best_step: int | None, key: str) -> None:
    """Evaluations made by an earlier process of a resumed run: score again the greedy answers it saved
    (saved_answers), so the card's paired comparisons survive a restart. The kept step first (without a
    best step, the kept one is this process's last evaluation, and none is restored for it); then step
    0, only when there is a kept step to compare with it. With the same code, a restored step scores as
    it did: scoring is deterministic. train.sft starts a run from step 0 without the answers of an
    earlier one, so the files are this run's."""
    have = {h["step"] for h in metric.history}
    kept = best_step if best_step is not None else (metric.history[-1]["step"] if metric.history else None)
    if kept is None:
        return
    for step in (kept, 0):
        if step in have:
            continue
        answers = saved_answers(metric, step, key)
        if answers is None:
            if step == kept:
                return  # no kept step: nothing to compare step 0 with
            continue
        metric(answers, step, write=False)
        have.add(step)
    metric.history.sort(key=lambda h: h["step"])


def kept_and_references(history: list[dict], best_step: int | None, key: str, baseline: tuple[str, object]):
    """The evaluation kept (the best step's; without one, the last) and what the card compares it with,
    by name: the base model (step 0, where the adapter's B matrices start at zero) when the kept step is
    another one, then ``baseline`` (name, per-example values). ``key``: the per-example values of a
    history entry. None and {} when the kept step is not in the history (after restore)."""
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
