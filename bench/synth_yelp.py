"""Synthetic dumps in the Yelp Open Dataset raw format, for benchmarks at sizes the samples don't reach.

    python -m bench.synth_yelp --reviews 2000000 --out runs/bench/yelp_2m

Writes yelp_academic_dataset_{business,user,review}.json. Review texts are drawn from a word list to
the length of real Yelp reviews (median about 570 characters); ids look like Yelp's 22-character ids;
70% of businesses are in the three official cities. Deterministic under --seed.
"""

from __future__ import annotations

import argparse
import json
import random
import string
from pathlib import Path

from tqdm import tqdm

WORDS = [
    "the",
    "food",
    "was",
    "great",
    "service",
    "slow",
    "friendly",
    "staff",
    "pizza",
    "burger",
    "tacos",
    "coffee",
    "place",
    "ordered",
    "table",
    "delicious",
    "never",
    "again",
    "amazing",
    "best",
    "worst",
    "price",
    "cheap",
    "expensive",
    "wait",
    "minutes",
    "atmosphere",
    "cozy",
    "loud",
    "recommend",
    "definitely",
    "back",
    "menu",
    "fresh",
    "cold",
    "hot",
    "portion",
    "small",
    "huge",
    "dessert",
    "drinks",
    "bar",
    "happy",
    "hour",
    "parking",
    "location",
    "clean",
    "dirty",
    "owner",
    "manager",
    "rude",
    "helpful",
    "quick",
    "lunch",
    "dinner",
    "brunch",
    "weekend",
    "night",
]
CITIES = [
    "Philadelphia",
    "Tampa",
    "Tucson",
    "Reno",
    "Boise",
    "Nashville",
    "Tampa",
    "Philadelphia",
    "Tucson",
    "Tucson",
]
ID_CHARS = string.ascii_letters + string.digits + "-_"


def yelp_id(rng: random.Random) -> str:
    return "".join(rng.choices(ID_CHARS, k=22))


def generate(n_reviews: int, out: Path, seed: int = 0) -> Path:
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    n_items, n_users = max(n_reviews // 30, 10), max(n_reviews // 8, 10)
    items = [yelp_id(rng) for _ in range(n_items)]
    users = [yelp_id(rng) for _ in range(n_users)]
    with open(out / "yelp_academic_dataset_business.json", "w") as f:
        for i, item in enumerate(items):
            f.write(
                json.dumps(
                    {
                        "business_id": item,
                        "name": f"Place {i}",
                        "city": rng.choice(CITIES),
                        "state": "PA",
                        "stars": rng.choice([3.0, 3.5, 4.0, 4.5]),
                        "review_count": 30,
                        "is_open": 1,
                        "attributes": {"WiFi": "u'free'"},
                        "categories": "Restaurants, Pizza",
                    }
                )
                + "\n"
            )
    with open(out / "yelp_academic_dataset_user.json", "w") as f:
        for i, user in enumerate(users):
            f.write(
                json.dumps(
                    {
                        "user_id": user,
                        "name": f"User{i}",
                        "review_count": 8,
                        "yelping_since": "2012-01-01 00:00:00",
                        "useful": 3,
                        "funny": 1,
                        "cool": 0,
                        "elite": "",
                        "friends": "None",
                        "fans": 0,
                        "average_stars": 3.8,
                    }
                )
                + "\n"
            )
    with open(out / "yelp_academic_dataset_review.json", "w") as f:
        for _ in tqdm(range(n_reviews), desc=f"synthesising {out.name}", unit=" reviews", mininterval=2):
            words = rng.choices(WORDS, k=rng.randint(20, 200))
            f.write(
                json.dumps(
                    {
                        "review_id": yelp_id(rng),
                        "user_id": rng.choice(users),
                        "business_id": rng.choice(items),
                        "stars": float(rng.randint(1, 5)),
                        "useful": rng.randint(0, 5),
                        "funny": 0,
                        "cool": 0,
                        "text": " ".join(words).capitalize() + ".",
                        "date": f"20{rng.randint(10, 21):02d}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} "
                        f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}",
                    }
                )
                + "\n"
            )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reviews", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    generate(args.reviews, args.out, args.seed)
