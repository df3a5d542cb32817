"""Predictions read and matched to tasks, with every problem named instead of silently skipped.

Accepted layouts:
- JSON lines, one ``{"task_id": i, "stars": s, "review": r}`` or ``{"user_id", "item_id", "stars", "review"}``
  per line (the runner in agents/ writes this);
- the official simulator's output, a JSON list of ``{"task": {"user_id", "item_id", ...}, "output":
  {"stars", "review"}}``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from data_prep.io import numbered_text


def summary_path(predictions: str | Path) -> Path:
    """Where the summary of the run that made a prediction file lives: summary.json beside an agent
    run's predictions.jsonl / output.json (the review runner), else NAME.summary.json beside NAME.jsonl
    (eval.review.baselines)."""
    path = Path(predictions)
    if path.name in ("predictions.jsonl", "output.json"):
        return path.parent / "summary.json"
    return path.with_name(path.stem + ".summary.json")


def run_visibility(predictions: str | Path) -> str:
    """The visibility the predictions were made under, from their run's summary."""
    path = summary_path(predictions)
    if not path.exists():
        return f"unknown (no {path.name} beside the predictions)"
    return json.loads(path.read_text()).get("visibility") or f"unknown (not recorded in {path})"


class PredictionError(ValueError):
    """A prediction file that cannot be scored as it is; the message lists every offending entry."""


def read_predictions(path: str | Path) -> list[dict]:
    """Entries {"where", "task_id" | ("user_id", "item_id"), "stars", "review"} in file order."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise PredictionError(f"{path}: not valid JSON ({err})") from None
        return [_official_entry(row, f"{path}[{i}]") for i, row in enumerate(rows)]
    try:
        rows = numbered_text(text, path, whole=True)
    except ValueError as err:
        raise PredictionError(str(err)) from None
    entries = []
    for number, _, row in rows:
        if not isinstance(row, dict):
            raise PredictionError(f"{path}:{number}: not a JSON object")
        entries.append({**row, "where": f"{path}:{number}"})
    return entries


def _official_entry(row: dict, where: str) -> dict:
    if (
        not isinstance(row, dict)
        or not isinstance(row.get("output"), dict)
        or not isinstance(row.get("task"), dict)
    ):
        raise PredictionError(f"{where}: expected {{'task': {{...}}, 'output': {{'stars', 'review'}}}}")
    task, output = row["task"], row["output"]
    return {"user_id": task.get("user_id"), "item_id": task.get("item_id"), **output, "where": where}


def _is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def align(
    tasks: list[dict], entries: list[dict], *, allow_missing: bool, limit: int | None = None
) -> tuple[list[dict | None], list[int], int]:
    """One prediction (or None) per task in scope (the first ``limit`` tasks, or all), the task ids in
    scope that had none, and how many predictions were for known tasks outside the scope.

    A prediction is matched by its ``task_id`` when it has one (and its user_id / item_id, when given,
    must be that task's), else by its (user_id, item_id) pair, which must then name exactly one task.

    Errors (all collected, then raised together): a prediction for an unknown task, ids that do not
    match the task, a pair shared by several tasks without a task_id, two predictions for one task,
    stars that are not a finite number, a review that is not a string, and (unless allow_missing)
    tasks without a prediction.
    """
    scope = {t["task_id"] for t in tasks[:limit]} if limit is not None else {t["task_id"] for t in tasks}
    outside = 0
    by_id = {t["task_id"]: t for t in tasks}
    by_pair: dict[tuple[str, str], list[int]] = {}
    for t in tasks:
        by_pair.setdefault((t["user_id"], t["item_id"]), []).append(t["task_id"])

    problems: list[str] = []
    matched: dict[int, dict] = {}
    for entry in entries:
        where = entry["where"]
        pair = (entry.get("user_id"), entry.get("item_id"))
        if entry.get("task_id") is not None:
            task_id = entry["task_id"]
            if task_id not in by_id:
                problems.append(f"{where}: unknown task_id {task_id!r}")
                continue
            task = by_id[task_id]
            for key, value in zip(("user_id", "item_id"), pair, strict=True):
                if value is not None and value != task[key]:
                    problems.append(
                        f"{where}: task {task_id} is {key}={task[key]!r}, the prediction says {value!r} "
                        "(predictions made for another task folder?)"
                    )
        else:
            ids = by_pair.get(pair)
            if not ids:
                problems.append(f"{where}: no task for user_id={pair[0]!r}, item_id={pair[1]!r}")
                continue
            if len(ids) > 1:
                problems.append(
                    f"{where}: tasks {ids} share the pair {pair}: this prediction needs its task_id"
                )
                continue
            task_id = ids[0]
        if task_id not in scope:
            outside += 1
            continue
        if task_id in matched:
            problems.append(
                f"{where}: a second prediction for task {task_id} (first at {matched[task_id]['where']})"
            )
            continue
        if not _is_number(entry.get("stars")):
            problems.append(f"{where}: stars {entry.get('stars')!r} is not a number")
        if not isinstance(entry.get("review"), str):
            problems.append(f"{where}: review {entry.get('review')!r} is not a string")
        matched[task_id] = entry
    in_scope = [t for t in tasks if t["task_id"] in scope]
    missing = [t["task_id"] for t in in_scope if t["task_id"] not in matched]
    if missing and not allow_missing:
        shown = ", ".join(map(str, missing[:50])) + (" ..." if len(missing) > 50 else "")
        problems.append(
            f"{len(missing)} tasks have no prediction: {shown} (use --allow-missing to score them "
            "as the official evaluator does: 0 stars and an empty review)"
        )
    if problems:
        raise PredictionError(f"{len(problems)} problem(s) with the predictions:\n  " + "\n  ".join(problems))
    return [matched.get(t["task_id"]) for t in in_scope], missing, outside
