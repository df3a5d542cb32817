"""How each raw dump maps onto the one schema (see schema.py).

A source says which role each input file plays (review / item / user / ratings) from its name, and
maps one parsed JSON object of each role to a schema record. Mapping follows the official
AgentSociety ``data_process.py`` renames (business_id/parent_asin/book_id -> item_id,
rating -> stars, review_text -> text, asin -> sub_item_id) so that the processed layout is identical.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from data_prep.schema import Filtered, Reject, parse_epoch, parse_goodreads, review_time

# Official Yelp filter of the AgentSociety Challenge (data_process.py keeps these three cities).
YELP_CITIES = ("Philadelphia", "Tampa", "Tucson")


def _stem(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".jsonl", ".json", ".csv"):
        name = name.removesuffix(suffix)
    return name


def _content_id(*parts: object) -> str:
    """A deterministic review id for dumps that have none (the official code uses uuid4, which makes
    two builds of the same dump disagree)."""
    return hashlib.sha1("\x1f".join(map(str, parts)).encode()).hexdigest()[:24]


def _rename(record: dict, renames: dict[str, str]) -> dict:
    return {renames.get(key, key): value for key, value in record.items()}


# -- AgentSociety processed layout ---------------------------------------------------------------------


def asc_role(path: Path) -> str | None:
    stem = _stem(path).lower()
    for role in ("review", "item", "user"):
        if stem.startswith(role):
            return role
    return None


def asc_review(obj: dict, category: str) -> tuple[dict, int]:
    record = dict(obj)
    record.setdefault("type", "review")
    return record, review_time(record)


def asc_passthrough(obj: dict, category: str) -> dict:
    return obj


# -- Yelp Open Dataset ---------------------------------------------------------------------------------


def yelp_role(path: Path) -> str | None:
    stem = _stem(path).lower()
    for key, role in (("business", "item"), ("review", "review"), ("user", "user")):
        if key in stem:
            return role
    return None


def yelp_review(obj: dict, category: str) -> tuple[dict, int]:
    record = _rename(obj, {"business_id": "item_id"})
    record["source"], record["type"] = "yelp", "review"
    return record, review_time(record)


def yelp_item(obj: dict, category: str) -> dict:
    record = _rename(obj, {"business_id": "item_id"})
    record["source"], record["type"] = "yelp", "business"
    return record


def yelp_user(obj: dict, category: str) -> dict:
    return {**obj, "source": "yelp"}


# -- Amazon Reviews 2023 -------------------------------------------------------------------------------


def amazon2023_role(path: Path) -> str | None:
    name = path.name.lower()
    if name.startswith("meta_"):
        return "item"
    if ".csv" in name:
        return "ratings"
    if ".jsonl" in name or ".json" in name:
        return "review"
    return None


def amazon2023_review(obj: dict, category: str) -> tuple[dict, int]:
    record = _rename(obj, {"asin": "sub_item_id", "parent_asin": "item_id", "rating": "stars"})
    record["source"], record["type"], record["category"] = "amazon", "review", category
    if record.get("timestamp") is None:
        raise Reject("missing_field:timestamp")
    ts = parse_epoch(record["timestamp"], millis=True)
    if "review_id" not in record and record.get("user_id") and record.get("text") is not None:
        record["review_id"] = _content_id(record["user_id"], record.get("item_id"), ts, record["text"])
    return record, ts


def amazon_item(key: str) -> Callable[[dict, str], dict]:
    def mapper(obj: dict, category: str) -> dict:
        record = _rename(obj, {key: "item_id"})
        record["source"], record["type"], record["category"] = "amazon", "product", category
        return record

    return mapper


# -- Amazon Reviews 2018 (5-core) ----------------------------------------------------------------------


def amazon2018_role(path: Path) -> str | None:
    name = path.name.lower()
    if name.startswith("meta_"):
        return "item"
    if ".json" in name:
        return "review"
    return None


def amazon2018_review(obj: dict, category: str) -> tuple[dict, int]:
    """The 2018 files copy one review onto every variant ASIN of a product. The review id is a hash of
    (reviewer, time, stars, text), so the copies share one id and the build counts them as duplicates.
    The copies differ in the ASIN, ``style``, votes and images, so those stay out of the key; the stars
    stay in it: two reviews with one text and time but different stars are two reviews (9 such groups
    in the shared sample)."""
    record = _rename(
        obj, {"reviewerID": "user_id", "asin": "item_id", "overall": "stars", "reviewText": "text"}
    )
    record["source"], record["type"], record["category"] = "amazon", "review", category
    if record.get("unixReviewTime") is None:
        raise Reject("missing_field:unixReviewTime")
    ts = parse_epoch(record["unixReviewTime"], millis=False)
    if record.get("user_id") and record.get("text") is not None:
        record["review_id"] = _content_id(record["user_id"], ts, record.get("stars"), record["text"])
    return record, ts


# -- UCSD Book Graph (Goodreads) -----------------------------------------------------------------------


def goodreads_role(path: Path) -> str | None:
    stem = _stem(path).lower()
    if stem.startswith("goodreads_books"):
        return "item"
    if stem.startswith("goodreads_reviews"):
        return "review"
    return None


def goodreads_review(obj: dict, category: str) -> tuple[dict, int]:
    record = _rename(obj, {"book_id": "item_id", "rating": "stars", "review_text": "text"})
    record["source"], record["type"], record["category"] = "goodreads", "review", category
    if record.get("stars") == 0:
        raise Filtered("not_rated")  # Goodreads stores "shelved, no rating" as 0
    stamp = record.get("date_added") or record.get("date_updated")
    if not stamp:
        raise Reject("missing_field:date_added")
    return record, parse_goodreads(stamp)


def goodreads_item(obj: dict, category: str) -> dict:
    record = _rename(obj, {"book_id": "item_id"})
    record["source"], record["type"], record["category"] = "goodreads", "book", category
    return record


def derived_user(source: str) -> Callable[[dict, str], dict]:
    def mapper(obj: dict, category: str) -> dict:
        return {**obj, "source": source}

    return mapper


# -- registry ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    name: str
    role: Callable[[Path], str | None]
    review: Callable[[dict, str], tuple[dict, int]]
    item: Callable[[dict, str], dict] | None
    user: Callable[[dict, str], dict] | None
    expected: str  # what input files look like, for error messages
    category_pattern: str = r"(.+)"  # how a file name gives the category / genre


SOURCES: dict[str, Source] = {
    "asc": Source(
        "asc",
        asc_role,
        asc_review,
        asc_passthrough,
        asc_passthrough,
        "review*.json / item*.json / user*.json (JSON lines, optionally .gz)",
    ),
    "yelp": Source(
        "yelp",
        yelp_role,
        yelp_review,
        yelp_item,
        yelp_user,
        "yelp_academic_dataset_{review,business,user}.json (optionally .gz)",
    ),
    "amazon2023": Source(
        "amazon2023",
        amazon2023_role,
        amazon2023_review,
        amazon_item("parent_asin"),
        None,
        "{Category}.jsonl, meta_{Category}.jsonl, optional {Category}.csv 5-core ratings (optionally .gz)",
        r"(?:meta_)?([^.]+)",
    ),
    "amazon2018": Source(
        "amazon2018",
        amazon2018_role,
        amazon2018_review,
        amazon_item("asin"),
        None,
        "{Category}_5.json.gz and optional meta_{Category}.json.gz",
        r"(?:meta_)?(.+?)(?:_5)?$",
    ),
    "goodreads": Source(
        "goodreads",
        goodreads_role,
        goodreads_review,
        goodreads_item,
        None,
        "goodreads_reviews_{genre}.json(.gz) and goodreads_books_{genre}.json(.gz)",
        r"goodreads_(?:books|reviews)_(.+)",
    ),
}


def category_of(source: Source, path: Path) -> str:
    match = re.fullmatch(source.category_pattern, _stem(path))
    return match.group(1) if match else _stem(path)
