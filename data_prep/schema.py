"""The one review schema every source maps to, and its validation.

Records are a superset of the AgentSociety processed layout (``user.json``, ``item.json``,
``review.json``): the official field names (``review_id``, ``user_id``, ``item_id``, ``stars``,
``text``, ...) plus ``source`` (yelp / amazon / goodreads), ``type`` (review / business / product /
book) and a normalised ``date`` (``YYYY-MM-DD HH:MM:SS``, UTC). Every other field of the raw record is
kept under its official name, so the official task files and agents work unchanged.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

STAR_RANGE = (1.0, 5.0)


class Reject(Exception):
    """A record that is invalid: it goes to rejects.jsonl with this reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Filtered(Exception):
    """A valid record that a documented rule leaves out (city filter, 5-core, unrated, duplicate copy)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def require_str(record: dict, field: str) -> str:
    value = record.get(field)
    if value is None or value == "":
        raise Reject(f"missing_field:{field}")
    if not isinstance(value, str):
        raise Reject(f"not_a_string:{field}")
    if not value.strip():
        raise Reject(f"missing_field:{field}")
    return value


def check_stars(record: dict) -> float:
    if record.get("stars") is None:
        raise Reject("missing_field:stars")
    stars = record["stars"]
    if isinstance(stars, bool) or not isinstance(stars, int | float) or math.isnan(stars):
        raise Reject("stars_not_numeric")
    if not STAR_RANGE[0] <= stars <= STAR_RANGE[1]:
        raise Reject("stars_out_of_range")
    return float(stars)


def check_text(record: dict) -> str:
    text = record.get("text")
    if text is None:
        raise Reject("missing_field:text")
    if not isinstance(text, str):
        raise Reject("not_a_string:text")
    if not text.strip():
        raise Reject("empty_text")
    return text


def check_review(record: dict) -> None:
    """Raise Reject with the first problem found; the order makes the reported reason the root cause."""
    require_str(record, "user_id")
    require_str(record, "item_id")
    check_stars(record)
    check_text(record)
    require_str(record, "review_id")


# -- time ---------------------------------------------------------------------------------------------


def format_utc(epoch_seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(epoch_seconds))


def parse_iso(value: object) -> int:
    """'2005-07-15 16:50:15' (Yelp, naive = UTC) or any ISO-8601 string -> epoch seconds."""
    if not isinstance(value, str):
        raise Reject("bad_timestamp")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise Reject("bad_timestamp") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp())


def parse_epoch(value: object, *, millis: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise Reject("bad_timestamp")
    return int(value // 1000) if millis else int(value)


def parse_goodreads(value: object) -> int:
    """'Mon Aug 25 13:59:37 -0700 2014' -> epoch seconds."""
    if not isinstance(value, str):
        raise Reject("bad_timestamp")
    try:
        return int(datetime.strptime(value, "%a %b %d %H:%M:%S %z %Y").timestamp())
    except ValueError:
        raise Reject("bad_timestamp") from None


def review_time(record: dict) -> int:
    """Epoch seconds of a review in any supported layout (used for the processed layout, whose
    records keep the time field of the source they came from)."""
    if record.get("date") is not None:
        return parse_iso(record["date"])
    if record.get("timestamp") is not None:  # Amazon 2023: milliseconds
        return parse_epoch(record["timestamp"], millis=True)
    if record.get("unixReviewTime") is not None:  # Amazon 2018: seconds
        return parse_epoch(record["unixReviewTime"], millis=False)
    for field in ("date_added", "date_updated"):  # Goodreads
        if record.get(field):
            return parse_goodreads(record[field])
    raise Reject("missing_field:date")
