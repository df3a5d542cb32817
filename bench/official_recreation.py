"""A faithful re-creation of the official AgentSociety approach, for side-by-side benchmarks only.

Phase 1 is ``data_process.py`` for Yelp: every raw file read line by line into a list of dicts, then a
pandas DataFrame; the three-city filter; ``DataFrame.to_json(orient='records', lines=True)``.
Phase 2 is ``InteractionTool.__init__``: the processed files read back into Python dicts, with
user -> reviews and item -> reviews index dicts. Everything lives in memory, which is the point of
the comparison. Written here from the official description; none of its code is copied.

    python -m bench.official_recreation --input runs/bench/yelp_200k --work /tmp/official --lookups 1000
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
from tqdm import tqdm

CITIES = ["Philadelphia", "Tampa", "Tucson"]


def load_df(path: Path) -> pd.DataFrame:
    rows = []
    with open(path) as f:
        for line in tqdm(f, desc=f"official: loading {path.name}", unit=" lines", mininterval=2):
            rows.append(json.loads(line))
    return pd.DataFrame(rows)


def process(raw_dir: Path, out: Path) -> None:
    business = load_df(raw_dir / "yelp_academic_dataset_business.json")
    users = load_df(raw_dir / "yelp_academic_dataset_user.json")
    reviews = load_df(raw_dir / "yelp_academic_dataset_review.json")
    business = business[business["city"].isin(CITIES)]
    reviews = reviews[reviews["business_id"].isin(business["business_id"])]
    users = users[users["user_id"].isin(reviews["user_id"])]
    out.mkdir(parents=True, exist_ok=True)
    business.rename(columns={"business_id": "item_id"}).assign(source="yelp", type="business").to_json(
        out / "item.json", orient="records", lines=True
    )
    reviews.rename(columns={"business_id": "item_id"}).assign(source="yelp", type="review").to_json(
        out / "review.json", orient="records", lines=True
    )
    users.assign(source="yelp").to_json(out / "user.json", orient="records", lines=True)


class InteractionTool:
    def __init__(self, data_dir: Path):
        self.item_data = {r["item_id"]: r for r in self._load(data_dir / "item.json")}
        self.user_data = {r["user_id"]: r for r in self._load(data_dir / "user.json")}
        self.review_data, self.user_reviews, self.item_reviews = {}, defaultdict(list), defaultdict(list)
        for r in self._load(data_dir / "review.json"):
            self.review_data[r["review_id"]] = r
            self.user_reviews[r["user_id"]].append(r)
            self.item_reviews[r["item_id"]].append(r)

    @staticmethod
    def _load(path: Path) -> list[dict]:
        with open(path) as f:
            return [json.loads(line) for line in f]

    def get_reviews(self, item_id=None, user_id=None, review_id=None) -> list[dict]:
        if review_id:
            return [self.review_data[review_id]] if review_id in self.review_data else []
        if item_id:
            return self.item_reviews.get(item_id, [])
        return self.user_reviews.get(user_id, [])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--input", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--lookups", type=int, default=1000)
    args = parser.parse_args()
    started = time.perf_counter()
    process(args.input, args.work)
    tool = InteractionTool(args.work)
    elapsed = time.perf_counter() - started
    users = sorted(tool.user_reviews)
    sample = random.Random(0).choices(users, k=args.lookups)
    times = []
    for user in sample:
        t0 = time.perf_counter()
        tool.get_reviews(user_id=user)
        times.append(time.perf_counter() - t0)
    print(
        json.dumps(
            {
                "seconds": elapsed,
                "reviews": len(tool.review_data),
                "lookup_median_ms": statistics.median(times) * 1e3,
            }
        )
    )
