"""The main job end to end on the embedded default samples (what `make demo` runs).

    python demo.py --shared ../shared/data/raw --out runs/demo

Today: build the Amazon 2018 and Yelp samples into review stores, print their reports, and write
leave-last-out evaluation tasks for each. Where ../shared/data/raw is absent it fetches a small public
Amazon Reviews 2023 sample instead (needs the Hugging Face Hub) and says so.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_prep import build, split
from data_prep.store import ReviewStore


def samples(shared: Path, out: Path) -> dict[str, list[str]]:
    """name -> build arguments, from the shared samples when present, else a fetched public sample."""
    amazon, yelp = shared / "amazon2018_5core_small", shared / "yelp_asc_sample"
    if amazon.is_dir() and yelp.is_dir():
        print(f"samples: {amazon} and {yelp}")
        return {
            "amazon": ["--source", "amazon2018", "--input", str(amazon)],
            "yelp": ["--source", "asc", "--platform", "yelp", "--input", str(yelp)],
        }
    from data_prep.fetch_sample import fetch

    print(
        f"{shared} not found: fetching a public Amazon Reviews 2023 sample (Magazine_Subscriptions) instead"
    )
    files = fetch("Magazine_Subscriptions", 20_000, out / "raw")
    return {"amazon": ["--source", "amazon2023", "--input", *map(str, files)]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shared", type=Path, default=Path("../shared/data/raw"))
    parser.add_argument("--out", type=Path, default=Path("runs/demo"))
    args = parser.parse_args()

    for name, build_args in samples(args.shared, args.out).items():
        data, tasks = args.out / "data" / name, args.out / "tasks" / name
        print(f"\n=== {name}: build")
        report = build.main([*build_args, "--out", str(data)])
        keys = (
            "reviews_read",
            "reviews_kept",
            "reviews_rejected",
            "reviews_filtered",
            "users",
            "items",
            "reasons",
        )
        print(json.dumps({k: report[k] for k in keys}, indent=2))
        print(f"=== {name}: split (leave-last-out, min history 2, 50 tasks)")
        split.main(
            [
                "--data",
                str(data),
                "--out",
                str(tasks),
                "--min-history",
                "2",
                "--max-tasks",
                "50",
                "--seed",
                "0",
                "--overwrite",
            ]
        )
        store = ReviewStore.open(data, tasks=tasks)
        task = json.loads((tasks / "tasks" / "task_0.json").read_text())
        history = store.get_reviews(user_id=task["user_id"])
        print(
            f"task_0: user {task['user_id']} has {len(history)} visible reviews; the target stays hidden "
            f"({len(store.get_reviews(user_id=task['user_id'], item_id=task['item_id']))} visible for the pair)"
        )


if __name__ == "__main__":
    main()
