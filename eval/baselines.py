"""Reference predictions that need no model, for sanity checks of the evaluator and the agents.

    python -m eval.baselines previous-review --data runs/data/yelp --tasks runs/tasks/yelp --out runs/pred/prev.jsonl
    python -m eval.baselines user-mean --data runs/data/yelp --tasks runs/tasks/yelp --out runs/pred/mean.jsonl
    python -m eval.baselines truth --tasks runs/tasks/yelp --out runs/pred/truth.jsonl   # must score PE = RG = 1

``previous-review``: the stars and text of the user's latest review strictly older than the target;
``user-mean``: the mean stars of all the user's reviews strictly older than the target, with the text
of the latest one (the star baseline the ``stats`` agent must beat). Both read the store with the task
pairs blocked, so they can never see a target. Tasks whose user has no older review get no prediction
and are listed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_prep.store import ReviewStore
from data_prep.tasks import read_groundtruth, read_targets, read_tasks


def from_history(data: Path, task_dir: Path, kind: str = "previous-review") -> tuple[list[dict], list[int]]:
    store = ReviewStore.open(data, tasks=task_dir)
    targets = read_targets(task_dir)
    rows, without = [], []
    for task in read_tasks(task_dir):
        before = targets[task["task_id"]]["ts"] if task["task_id"] in targets else None
        history = store.get_reviews(user_id=task["user_id"], before=before) if before else []
        if not history:
            without.append(task["task_id"])
            continue
        last = history[-1]
        stars = (
            last["stars"] if kind == "previous-review" else sum(r["stars"] for r in history) / len(history)
        )
        rows.append({"task_id": task["task_id"], "stars": stars, "review": last["text"]})
    return rows, without


def truth(task_dir: Path) -> list[dict]:
    return [
        {"task_id": t["task_id"], **read_groundtruth(task_dir, t["task_id"])} for t in read_tasks(task_dir)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=["previous-review", "user-mean", "truth"])
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--data", type=Path, help="build folder (previous-review, user-mean)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.kind != "truth":
        if not args.data:
            parser.error(f"{args.kind} needs --data")
        rows, without = from_history(args.data, args.tasks, args.kind)
        if without:
            print(f"note: {len(without)} tasks have no older review to copy and get no prediction: {without}")
    else:
        rows = truth(args.tasks)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{len(rows)} predictions -> {args.out}")


if __name__ == "__main__":
    main()
