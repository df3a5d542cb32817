"""Write evaluation tasks (official AgentSociety layout) with real held-out reviews as ground truth.

    # each user's latest review is the target, for users with >= 3 older reviews; 200 tasks
    python -m data_prep.split --data runs/data/yelp --out runs/tasks/yelp \\
        --strategy leave-last-out --min-history 3 --max-tasks 200 --seed 0
    # every review on or after a date is a target (first per user-item pair)
    python -m data_prep.split --data runs/data/yelp --out runs/tasks/yelp_2019 \\
        --strategy temporal --cutoff 2019-01-01 --min-history 3 --seed 0
    # the latest day that still leaves at least 100 eligible targets on or after it (the manifest says which)
    python -m data_prep.split --data runs/data/yelp --out runs/tasks/yelp_late --strategy temporal \\
        --cutoff latest:100 --min-history 2
    # official task folders: keep their (user, item) pairs, take the targets from the store
    python -m data_prep.split --data data/yelp --out runs/tasks/official --import-official example/track1/yelp
    # validation tasks like a task folder's, from before it: each task user's latest earlier review
    python -m data_prep.split --data runs/data/yelp --out runs/tasks/yelp_val --validation-for runs/tasks/yelp \
        --min-history 2

Besides tasks/ and groundtruth/, writes ``targets.jsonl`` (each task's review_id and time, which is
what "strictly older than the target" means for retrieval and training pairs) and ``manifest.json``
(strategy, seed, counts, the hash of the source data, the command).

``--validation-for TASKS`` draws validation tasks for choosing settings (eval.review.selection) the way TASKS
were drawn, from before them. Leave-last-out TASKS: for each of their users, the latest review strictly
older than the user's task. Temporal TASKS: a temporal split of the reviews before TASKS's cutoff, at
the latest day that leaves as many eligible targets as TASKS has (``--cutoff latest:N`` for N; the
manifest says which day). Either way with at least --min-history older visible reviews. TASKS's pairs are hidden from the validation folder
as its own are (blocked_pairs.json), and its manifest keeps TASKS's cutoff, so training pairs built
with it as --tasks (data_prep.pairs) keep out both folders' targets and the test period. Both folders'
manifests count the tasks whose item has no older visible review ("new items"), which eval.review.selection
and the star model treat as their own group.

The official example ground truth is written by an LLM, not by the users: an import never copies it.
Deterministic: the same store, options and seed give the same tasks.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from data_prep.fingerprint import task_folder_digest
from data_prep.provenance import provenance
from data_prep.schema import format_utc
from data_prep.store import ReviewStore
from data_prep.tasks import blocked_pairs, read_targets, read_tasks, write_tasks

# A candidate target with the number of the user's reviews strictly older than it on other items.
_HISTORY = """
    (SELECT COUNT(*) FROM reviews h
      WHERE h.user_id = t.user_id AND h.ts < t.ts AND h.item_id != t.item_id) AS history
"""

LEAVE_LAST_OUT = f"""
WITH last AS (
    SELECT review_id, user_id, item_id, ts, stars, data,
           ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY ts DESC, review_id DESC) AS rn
    FROM reviews)
SELECT t.review_id, t.user_id, t.item_id, t.ts, t.stars, t.data, {_HISTORY}
FROM last t WHERE t.rn = 1
"""


# History counts only reviews that stay visible to a prediction: before the cutoff, and not of an item
# the user has a candidate target on (that pair may be blocked as a task, which hides all its reviews).
def temporal_sql(reviews: str = "reviews", prefix: str = "") -> str:
    """Temporal candidates over the table ``reviews`` (a CTE of ``prefix``, e.g. what stays visible)."""
    return f"""
WITH {prefix}firsts AS (
    SELECT review_id, user_id, item_id, ts, stars, data,
           ROW_NUMBER() OVER (PARTITION BY user_id, item_id ORDER BY ts, review_id) AS rn
    FROM {reviews} WHERE ts >= :cutoff)
SELECT t.review_id, t.user_id, t.item_id, t.ts, t.stars, t.data,
    (SELECT COUNT(*) FROM {reviews} h WHERE h.user_id = t.user_id AND h.ts < :cutoff
       AND NOT EXISTS (SELECT 1 FROM firsts f WHERE f.user_id = h.user_id AND f.item_id = h.item_id)) AS history
FROM firsts t WHERE t.rn = 1
"""


TEMPORAL = temporal_sql()
# A temporal split of what a validation folder may use: the reviews before :until (the tasks' cutoff)
# that the block set (the tasks' pairs) leaves visible.
TEMPORAL_BEFORE = temporal_sql(
    "visible",
    "visible AS (SELECT * FROM reviews r WHERE r.ts < :until AND NOT EXISTS "
    "(SELECT 1 FROM temp.block b WHERE b.user_id = r.user_id AND b.item_id = r.item_id)), ",
)


def _target(row) -> dict:
    review_id, user_id, item_id, ts, stars, data, history = row
    record = json.loads(data)
    return {
        "review_id": review_id,
        "user_id": user_id,
        "item_id": item_id,
        "ts": ts,
        "stars": stars,
        "text": record["text"],
        "history": history,
        "source": record.get("source"),
        "category": record.get("category"),
    }


def candidates(store: ReviewStore, strategy: str, cutoff: int | None) -> list[dict]:
    if strategy == "leave-last-out":
        rows = store.conn.execute(LEAVE_LAST_OUT)
    else:
        rows = store.conn.execute(TEMPORAL, {"cutoff": cutoff})
    return sorted((_target(r) for r in rows), key=lambda t: (t["user_id"], t["item_id"], t["review_id"]))


def latest_cutoff(
    store: ReviewStore, at_least: int, min_history: int, points: int = 64, until: int | None = None
) -> int:
    """A late UTC day boundary with at least ``at_least`` eligible temporal targets on or after it.
    The count is not monotone in the cutoff (an early cutoff leaves users without history), so: the
    latest of ``points`` evenly spaced days that qualifies, then bisection between it and the next
    one, which does not. The chosen day qualifies and the day after it does not; a later qualifying
    day between two grid points that bisection does not visit is possible, though unlikely. ``until``:
    only the visible reviews before it count (a temporal validation folder's, TEMPORAL_BEFORE)."""
    first, last = store.conn.execute("SELECT MIN(ts), MAX(ts) FROM reviews").fetchone()
    last = last if until is None else min(last, until - 1)
    day = 86400

    def eligible(cutoff_day: int) -> int:  # counted in SQL: no review text is read
        sql = f"SELECT COUNT(*) FROM ({TEMPORAL if until is None else TEMPORAL_BEFORE}) WHERE history >= :min_history"
        bind = {"cutoff": cutoff_day * day, "min_history": min_history, "until": until}
        return store.conn.execute(sql, bind).fetchone()[0]

    begin, end = first // day + 1, last // day + 1  # days since the epoch
    grid = sorted({begin + (end - begin) * k // points for k in range(points + 1)})
    qualifying = [d for d in grid if eligible(d) >= at_least]
    if not qualifying:
        raise SystemExit(
            f"error: fewer than {at_least} eligible targets at any cutoff: lower N or --min-history"
        )
    low = qualifying[-1]
    high = next((d for d in grid if d > low), end + 1) - 1  # the next grid day does not qualify
    while low < high:  # invariant: low qualifies
        middle = (low + high + 1) // 2
        if eligible(middle) >= at_least:
            low = middle
        else:
            high = middle - 1
    return low * day


LATEST_BEFORE = """
SELECT r.review_id, r.user_id, r.item_id, r.ts, r.stars, r.data FROM reviews r
WHERE r.user_id = :user AND r.ts < :before
  AND NOT EXISTS (SELECT 1 FROM temp.block b WHERE b.user_id = r.user_id AND b.item_id = r.item_id)
ORDER BY r.ts DESC, r.review_id DESC LIMIT 1
"""
# visible reviews older than the validation target on other items (its own pair is blocked too)
HISTORY_BEFORE = """
SELECT COUNT(*) FROM reviews r WHERE r.user_id = :user AND r.ts < :ts AND r.item_id != :item
  AND NOT EXISTS (SELECT 1 FROM temp.block b WHERE b.user_id = r.user_id AND b.item_id = r.item_id)
"""


def validation_candidates(
    store: ReviewStore, task_dir: Path, at_least: int | None, min_history: int
) -> tuple[list[dict], dict]:
    """Validation candidates for ``task_dir`` (whose pairs ``store`` blocks), drawn as its tasks were,
    and what was decided on the way. Leave-last-out: per user of the tasks, their latest visible review
    strictly older than their earliest task. Temporal: a temporal split of the visible reviews before
    the tasks' cutoff, at the latest day that leaves ``at_least`` eligible targets (default: as many
    as the tasks)."""
    from data_prep.store import to_epoch

    manifest = json.loads((task_dir / "manifest.json").read_text())
    targets = read_targets(task_dir)
    tasks = read_tasks(task_dir)
    if manifest.get("strategy") == "temporal":
        until, wanted = to_epoch(manifest["cutoff"]), at_least or len(tasks)
        cutoff = latest_cutoff(store, wanted, min_history, until=until)
        rows = store.conn.execute(TEMPORAL_BEFORE, {"cutoff": cutoff, "until": until})
        found = sorted((_target(r) for r in rows), key=lambda t: (t["user_id"], t["item_id"], t["review_id"]))
        return found, {"validation_cutoff": format_utc(cutoff), "at_least": wanted}
    if manifest.get("strategy") != "leave-last-out":
        raise SystemExit(f"error: --validation-for takes a leave-last-out or temporal folder, not {task_dir}")
    bound: dict[str, int] = {}
    for task in tasks:
        if task["task_id"] not in targets:
            raise SystemExit(f"error: {task_dir}/targets.jsonl has no time for task {task['task_id']}")
        user, ts = task["user_id"], targets[task["task_id"]]["ts"]
        bound[user] = min(bound.get(user, ts), ts)
    out = []
    for user, before in sorted(bound.items()):
        row = store.conn.execute(LATEST_BEFORE, {"user": user, "before": before}).fetchone()
        if row is None:
            continue
        history = store.conn.execute(HISTORY_BEFORE, {"user": user, "ts": row[3], "item": row[2]}).fetchone()[
            0
        ]
        out.append(_target((*row, history)))
    return out, {"task_users": len(bound)}


def new_item_share(store: ReviewStore, targets: list[dict]) -> dict:
    """How many targets' items have no visible review older than the target (eval.review's new items);
    ``store`` must block the targets' own pairs."""
    new = sum(not store.has_reviews(item_id=t["item_id"], before=t["ts"]) for t in targets)
    return {"new_items": new, "new_item_share": round(new / len(targets), 4) if targets else None}


def choose(targets: list[dict], max_tasks: int | None, seed: int) -> list[dict]:
    """A seeded shuffle, so any prefix of the tasks (an evaluator's --limit) is a random sample."""
    chosen = list(targets)
    random.Random(seed).shuffle(chosen)
    return chosen[:max_tasks] if max_tasks else chosen


def import_official(store: ReviewStore, official_dir: Path) -> tuple[list[dict], list[dict]]:
    """Targets for an official task folder: the latest real review of each (user, item) in the store."""
    matched, unmatched = [], []
    for task in read_tasks(official_dir):
        reviews = store.get_reviews(user_id=task["user_id"], item_id=task["item_id"])
        if not reviews:
            unmatched.append(
                {
                    "task_file": f"task_{task['task_id']}.json",
                    "user_id": task["user_id"],
                    "item_id": task["item_id"],
                }
            )
            continue
        row = store.conn.execute(
            "SELECT review_id, user_id, item_id, ts, stars, data, 0 FROM reviews WHERE review_id = ?",
            (reviews[-1]["review_id"],),
        ).fetchone()
        matched.append(_target(row))
    return matched, unmatched


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", required=True, type=Path, help="a build folder (python -m data_prep.build)")
    parser.add_argument("--out", required=True, type=Path, help="the task folder to write")
    parser.add_argument("--strategy", choices=["leave-last-out", "temporal"], default="leave-last-out")
    parser.add_argument("--min-history", type=int, default=1, help="older reviews a user needs (default 1)")
    parser.add_argument(
        "--cutoff",
        help="temporal: first date of the test period, e.g. 2019-01-01, or latest:N, the latest day that "
        "leaves at least N eligible targets",
    )
    parser.add_argument("--max-tasks", type=int, help="sample at most this many tasks")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--import-official", type=Path, metavar="DIR", help="take the (user, item) pairs of DIR"
    )
    parser.add_argument(
        "--validation-for",
        type=Path,
        metavar="TASKS",
        help="validation tasks drawn like TASKS, from before them (see above)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace the tasks already in --out")
    args = parser.parse_args(argv)
    if args.validation_for and (args.import_official or args.strategy != "leave-last-out"):
        parser.error("--validation-for takes its strategy from TASKS: give no --strategy")
    if args.validation_for and args.cutoff and not args.cutoff.startswith("latest:"):
        parser.error("--validation-for takes --cutoff latest:N only (a temporal TASKS: N validation targets)")
    if args.validation_for and args.cutoff:
        drawn = json.loads((args.validation_for / "manifest.json").read_text()).get("strategy")
        if drawn != "temporal":
            parser.error(f"--cutoff latest:N is for a temporal TASKS; {args.validation_for} is {drawn}")

    if args.strategy == "temporal" and not args.cutoff and not args.import_official:
        parser.error("--strategy temporal needs --cutoff")
    if args.cutoff and args.strategy != "temporal" and not args.validation_for:
        parser.error("--cutoff is for --strategy temporal")
    if args.min_history < 0:
        parser.error("--min-history must be >= 0")
    if (args.out / "tasks").exists() and not args.overwrite:
        sys.exit(f"error: {args.out} already holds tasks; use another --out or --overwrite")
    if args.overwrite:
        for sub in ("tasks", "groundtruth"):
            for f in (args.out / sub).glob("*.json") if (args.out / sub).exists() else []:
                f.unlink()

    store = ReviewStore.open(args.data, tasks=args.validation_for)  # validation: the tasks' pairs hidden
    meta = store.meta()
    counts: dict[str, int] = {
        "reviews_in_store": store.conn.execute("SELECT COUNT(*) FROM reviews").fetchone()[0]
    }
    unmatched: list[dict] = []
    if args.import_official:
        chosen, unmatched = import_official(store, args.import_official)
        counts.update(official_tasks=len(chosen) + len(unmatched), unmatched=len(unmatched))
        if unmatched:
            print(
                f"warning: {len(unmatched)} official tasks have no review in the store; listed in manifest.json"
            )
        strategy = "import-official"
    elif args.validation_for:
        at_least = int(args.cutoff.split(":", 1)[1]) if args.cutoff else None
        pool, decided = validation_candidates(store, args.validation_for, at_least, args.min_history)
        eligible = [t for t in pool if t["history"] >= args.min_history]
        chosen = choose(eligible, args.max_tasks, args.seed)
        counts.update(
            **decided,
            candidates=len(pool),
            eligible=len(eligible),
            too_little_history=len(pool) - len(eligible),
        )
        strategy = "validation"
        drawn_for = json.loads((args.validation_for / "manifest.json").read_text())
    else:
        cutoff = None
        if args.cutoff and args.cutoff.startswith("latest:"):
            cutoff = latest_cutoff(store, int(args.cutoff.split(":", 1)[1]), args.min_history)
            counts["cutoff_chosen"] = format_utc(cutoff)
            print(f"cutoff {args.cutoff}: {format_utc(cutoff)}")
        elif args.cutoff:
            from data_prep.store import to_epoch

            cutoff = to_epoch(args.cutoff)
        pool = candidates(store, args.strategy, cutoff)
        eligible = [t for t in pool if t["history"] >= args.min_history]
        chosen = choose(eligible, args.max_tasks, args.seed)
        counts.update(
            candidates=len(pool), eligible=len(eligible), too_little_history=len(pool) - len(eligible)
        )
        strategy = args.strategy
    counts["tasks"] = len(chosen)
    if not chosen:
        sys.exit("error: no task qualifies; lower --min-history or move --cutoff")

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "blocked_pairs.json").unlink(missing_ok=True)
    if args.validation_for:
        pairs = sorted(set(blocked_pairs(args.validation_for)))  # its tasks' and what they hide
        (args.out / "blocked_pairs.json").write_text(json.dumps([list(p) for p in pairs]))
    write_tasks(args.out, chosen)
    counts.update(new_item_share(ReviewStore.open(args.data, tasks=args.out), chosen))
    with open(args.out / "targets.jsonl", "w") as f:
        for i, t in enumerate(chosen):
            row = {
                "task_id": i,
                "review_id": t["review_id"],
                "user_id": t["user_id"],
                "item_id": t["item_id"],
                "ts": t["ts"],
                "date": format_utc(t["ts"]),
                "history": t["history"],
                "source": t["source"],
                "category": t["category"],
            }
            f.write(json.dumps(row) + "\n")
    manifest = {
        "strategy": strategy,
        "seed": args.seed,
        "min_history": args.min_history,
        # the first moment of the test period; a latest:N request is resolved to its day here and kept
        # as asked in cutoff_requested. A validation folder keeps its tasks' cutoff here, and where its
        # own period starts in validation_for.validation_cutoff (what data_prep.pairs trains before)
        "cutoff": drawn_for.get("cutoff")
        if args.validation_for
        else counts.get("cutoff_chosen", args.cutoff),
        "cutoff_requested": None if args.validation_for else args.cutoff,
        "max_tasks": args.max_tasks,
        "validation_for": {
            "dir": str(args.validation_for),
            "strategy": drawn_for.get("strategy"),
            "validation_cutoff": counts.get("validation_cutoff"),  # where its own period starts
            "cutoff_requested": args.cutoff,
            "tasks_digest": task_folder_digest(args.validation_for),  # what eval.review.suite checks
        }
        if args.validation_for
        else None,
        "counts": counts,
        "data": {"dir": str(args.data), "source_sha256": meta.get("source_sha256")},
        "official_dir": str(args.import_official) if args.import_official else None,
        "official_groundtruth": "ignored: written by an LLM, not by the users"
        if args.import_official
        else None,
        "unmatched": unmatched,
        "provenance": provenance(),
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    print(f"{len(chosen)} tasks ({strategy}) -> {args.out}  counts: {counts}")
    return manifest


if __name__ == "__main__":
    main()
