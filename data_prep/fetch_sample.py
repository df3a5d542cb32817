"""Fetch a small public sample (Amazon Reviews 2023) for machines without ../shared/data/raw.

    python -m data_prep.fetch_sample --category Magazine_Subscriptions --reviews 20000 --out data/raw/amazon2023

Streams the first --reviews reviews of one category and that category's metadata through the
``datasets`` library (no full download) and writes them as ``{Category}.jsonl`` and
``meta_{Category}.jsonl``, ready for ``python -m data_prep.build --source amazon2023``.
Needs access to the Hugging Face Hub.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tqdm import tqdm

REPO = "hf://datasets/McAuley-Lab/Amazon-Reviews-2023/raw"


def fetch(category: str, reviews: int, out: Path) -> list[Path]:
    try:
        return _fetch(category, reviews, out)
    except Exception as err:  # network, auth, a renamed file: say what was tried and why it failed
        raise SystemExit(
            f"error: could not fetch Amazon Reviews 2023 {category} from {REPO} ({type(err).__name__}: {err}). "
            "This needs access to the Hugging Face Hub; or place real data in ../shared/data/raw."
        ) from err


def _fetch(category: str, reviews: int, out: Path) -> list[Path]:
    from datasets import load_dataset  # imported here: the rest of data_prep does not need it

    out.mkdir(parents=True, exist_ok=True)
    review_path, meta_path = out / f"{category}.jsonl", out / f"meta_{category}.jsonl"
    stream = load_dataset(
        "json", data_files=f"{REPO}/review_categories/{category}.jsonl", split="train", streaming=True
    )
    items: set[str] = set()
    with open(review_path, "w") as f:
        for row in tqdm(stream.take(reviews), total=reviews, desc=f"reviews {category}", unit=" reviews"):
            items.add(row["parent_asin"])
            f.write(json.dumps(row) + "\n")
    meta = load_dataset(
        "json", data_files=f"{REPO}/meta_categories/meta_{category}.jsonl", split="train", streaming=True
    )
    with open(meta_path, "w") as f:
        for row in tqdm(meta, desc=f"metadata {category}", unit=" items"):
            if row["parent_asin"] in items:
                f.write(json.dumps(row) + "\n")
    return [review_path, meta_path]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--category", default="Magazine_Subscriptions")
    parser.add_argument("--reviews", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=Path("data/raw/amazon2023"))
    args = parser.parse_args()
    for path in fetch(args.category, args.reviews, args.out):
        print(path)
