"""Reference predictions that need no model, for sanity checks of the evaluator and the agents.

    python -m eval.review.baselines previous-review --data runs/data/yelp --tasks runs/tasks/yelp --out runs/pred/prev.jsonl
    python -m eval.review.baselines user-mean --data runs/data/yelp --tasks runs/tasks/yelp --out runs/pred/mean.jsonl
    python -m eval.review.baselines user-mean ... --visibility official     # the leaderboard's visibility
    python -m eval.review.baselines nearest-centroid --data runs/data/yelp --tasks runs/tasks/yelp --out runs/pred/nc.jsonl
    python -m eval.review.baselines truth --tasks runs/tasks/yelp --out runs/pred/truth.jsonl   # must score PE = RG = 1

``previous-review``: the stars and text of the user's latest review strictly older than the target;
``user-mean``: the mean stars of all the user's reviews strictly older than the target, with the text
of the latest one (the star baseline the ``stats`` agent must beat); ``nearest-centroid``: the item's
visible review nearest the centroid of the user's visible reviews (all-MiniLM-L6-v2 embeddings, unit
length, cosine), with the median of the user's visible stars: the strongest model-free text baseline
we know (a user whose item has no visible review gets their own review nearest their centroid,
counted as ``no_item_review``). All read the store with the task pairs blocked, so they never see a
target; with ``--visibility official`` "older than the target" is dropped (everything but the task
pairs is visible), as on the AgentSociety leaderboard.

A task whose user has no visible review still gets a prediction (a fallback, counted and listed): the
mean of all visible stars older than the target and the item's latest older review (else the store's
latest older review). OUT.summary.json records the kind, the visibility and the fallbacks.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data_prep.provenance import provenance
from data_prep.store import ReviewStore
from data_prep.tasks import read_groundtruth, read_targets, read_tasks
from eval.review.predictions import summary_path

VISIBILITY = ("time-aware", "official")
KINDS = ("previous-review", "user-mean", "nearest-centroid")


def fallback(store: ReviewStore, item_id: str, before: int | None) -> tuple[float, str]:
    """For a user with no visible review: the mean visible stars, and the item's latest review text
    (else the store's latest), all older than ``before``."""
    mean = store.mean_stars(before)
    item = store.get_reviews(item_id=item_id, before=before)
    latest = item[-1] if item else store.latest_review(before)
    return (mean if mean is not None else 3.0), (latest["text"] if latest else "")


def from_history(
    data: Path,
    task_dir: Path,
    kind: str = "previous-review",
    visibility: str = "time-aware",
    encoder=None,
    counts: dict | None = None,
) -> tuple[list[dict], list[int]]:
    """Predictions for every task, and the ids of the tasks that needed the fallback. ``encoder``
    (nearest-centroid): texts -> embeddings, default the packaged all-MiniLM-L6-v2; ``counts`` gets
    the nearest-centroid's ``no_item_review``."""
    if visibility not in VISIBILITY:
        raise ValueError(f"unknown visibility {visibility!r}: one of {VISIBILITY}")
    if kind not in KINDS:
        raise ValueError(f"unknown baseline {kind!r}: one of {KINDS}")
    store = ReviewStore.open(data, tasks=task_dir)
    targets = read_targets(task_dir)
    rows, fell_back, centroid_tasks = [], [], []
    for task in tqdm(read_tasks(task_dir), desc=kind, unit=" task", leave=False):
        if visibility == "time-aware" and task["task_id"] not in targets:
            raise SystemExit(
                f"error: {task_dir}/targets.jsonl has no time for task {task['task_id']}: time-aware "
                "visibility needs it (make the tasks with data_prep.split, or use --visibility official)"
            )
        before = targets[task["task_id"]]["ts"] if visibility == "time-aware" else None
        history = store.get_reviews(user_id=task["user_id"], before=before)
        row = {"task_id": task["task_id"], "user_id": task["user_id"], "item_id": task["item_id"]}
        if not history:
            stars, text = fallback(store, task["item_id"], before)
            rows.append({**row, "stars": stars, "review": text, "fallback": True})
            fell_back.append(task["task_id"])
        elif kind == "nearest-centroid":
            rows.append(row)  # filled below, all texts encoded together
            centroid_tasks.append((row, history, store.get_reviews(item_id=task["item_id"], before=before)))
        else:
            last = history[-1]
            stars = (
                last["stars"]
                if kind == "previous-review"
                else sum(r["stars"] for r in history) / len(history)
            )
            rows.append({**row, "stars": stars, "review": last["text"]})
    if centroid_tasks:
        nearest_centroid(centroid_tasks, encoder, counts if counts is not None else {})
    return rows, fell_back


def nearest_centroid(todo: list[tuple[dict, list[dict], list[dict]]], encoder, counts: dict) -> None:
    """Fill each (row, user's visible reviews, item's visible reviews) with the user's median stars and
    the item's review nearest the centroid of the user's reviews (cosine of unit embeddings; ties: the
    older review); with no item review, the user's own review nearest the centroid."""
    from agents.retrieval import Retriever

    if encoder is None:
        from eval.backends import packaged_minilm

        encoder = packaged_minilm("cpu", 64)
    retriever = Retriever(encoder)
    texts = [r["text"] for _, history, pool in todo for r in (*history, *pool)]
    retriever.embed(texts)  # every text once, in one encoder call (cached for the lookups below)
    counts.setdefault("no_item_review", 0)
    for row, history, pool in todo:
        counts["no_item_review"] += not pool
        best = retriever.centroid_review(history, pool)  # what selection: mbr always has in its pool
        row.update(stars=float(np.median([r["stars"] for r in history])), review=best["text"])


def truth(task_dir: Path) -> list[dict]:
    return [
        {"task_id": t["task_id"], **read_groundtruth(task_dir, t["task_id"])} for t in read_tasks(task_dir)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("kind", choices=[*KINDS, "truth"])
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--data", type=Path, help="build folder (every kind but truth)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--visibility", choices=VISIBILITY, default="time-aware")
    args = parser.parse_args(argv)
    fell_back: list[int] = []
    counts: dict = {}
    if args.kind != "truth":
        if not args.data:
            parser.error(f"{args.kind} needs --data")
        rows, fell_back = from_history(args.data, args.tasks, args.kind, args.visibility, counts=counts)
        if fell_back:
            print(
                f"note: {len(fell_back)} tasks have no visible review of their user: fallback used for {fell_back}"
            )
    else:
        rows = truth(args.tasks)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    summary = {
        "kind": args.kind,
        "visibility": args.visibility if args.kind != "truth" else "the ground truth itself",
        "tasks": len(rows),
        "fallbacks": len(fell_back),
        "fallback_task_ids": fell_back,
        **counts,
        "provenance": provenance(),
    }
    summary_path(args.out).write_text(json.dumps(summary, indent=2))
    print(f"{len(rows)} predictions -> {args.out}")


if __name__ == "__main__":
    main()
