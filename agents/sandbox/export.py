"""A sandbox run's interactions in the forms recsys libraries read.

    python -m agents.sandbox export RUN_DIR --format recbole      # RUN_DIR/export/recbole/<name>.inter, .item
    python -m agents.sandbox export RUN_DIR --format csv --out DIR  # DIR/interactions.csv
    python -m agents.sandbox export RUN_DIR --format csv --with-impressions  # and what the pages showed

One row per watch (with the agent's stars): what a recsys library should train on. With
``--with-impressions`` also one row per item a page or a search showed (``browse``, ``next``, ``search``;
no rating), told apart by the action column: a library that reads every row as a positive interaction
would learn from what the agents were shown, not what they chose, so they are left out by default.
Only rounds the checkpoint holds are exported (a round cut off by a kill is not). Columns: the user (the agent's MovieLens
user id, or a negative id of its own for an agent without one: the recommender's ids), the item
(MovieLens movie id), the rating (watches only), the timestamp (the simulated moment: the run's start
plus ``round x round_days`` days, Unix seconds), the round, the action and the agent's name.

- ``recbole``: RecBole's atomic files, ``<name>.inter`` (``user_id:token item_id:token rating:float
  timestamp:float round:float action:token``, tab-separated; an impression's rating is empty) and
  ``<name>.item`` (``item_id:token title:token_seq genres:token_seq``) in a folder ``<name>`` that
  RecBole's ``data_path`` points at (``dataset: <name>``);
- ``csv``: one ``interactions.csv`` with a header (``user_id,item_id,rating,timestamp,round,action,
  agent``), for pandas, Cornac's ``Reader`` or LensKit.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from agents.runs import read_jsonl
from data_prep import movielens

SHOWN = ("browse", "next", "search")
DAY = 86400


def interactions(run: Path, impressions: bool = False) -> list[dict]:
    """The run's watches (and with ``impressions`` the shown items), oldest round first."""
    config = json.loads((run / "config.json").read_text())
    state = json.loads((run / "checkpoint.json").read_text())
    users = {
        a["profile"]["name"]: a["profile"]["user"]
        if a["profile"]["user"] is not None
        else -1 - a["profile"]["id"]
        for a in state["agents"]
    }
    start, days = state["start"], config["round_days"]
    rows = []
    for event in read_jsonl(run / "interactions.jsonl"):
        if event["round"] > state["round"]:  # written before a kill, redone on resume
            continue
        if event["agent"] not in users:
            raise SystemExit(
                f"error: {run}/interactions.jsonl names agent {event['agent']!r}, not in the checkpoint"
            )
        base = {
            "user_id": users[event["agent"]],
            "timestamp": int(start + event["round"] * days * DAY),
            "round": event["round"],
            "action": event["action"],
            "agent": event["agent"],
        }
        if event["action"] == "watch":
            rows.append({**base, "item_id": event["item"], "rating": event.get("stars")})
        elif impressions and event["action"] in SHOWN:
            rows += [{**base, "item_id": item, "rating": None} for item in event.get("items") or []]
    return rows


COLUMNS = ("user_id", "item_id", "rating", "timestamp", "round", "action", "agent")


def write_recbole(out: Path, rows: list[dict], movies: dict) -> Path:
    """RecBole's atomic files ``<name>.inter`` and ``<name>.item`` in ``out`` (named after it). RecBole
    reads them with pandas' CSV reader (tab-separated, ``"`` as the quote character), so a field that
    holds a quote is quoted and its quotes doubled (a title such as ``"Great Performances" Cats (1998)``
    would otherwise open a quoted field and swallow the columns after it)."""
    name = out.name
    path = out / f"{name}.inter"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
        writer.writerow(
            [
                "user_id:token",
                "item_id:token",
                "rating:float",
                "timestamp:float",
                "round:float",
                "action:token",
            ]
        )
        for r in rows:
            rating = "" if r["rating"] is None else r["rating"]
            writer.writerow([r["user_id"], r["item_id"], rating, r["timestamp"], r["round"], r["action"]])
    with open(out / f"{name}.item", "w", newline="") as handle:
        writer = csv.writer(handle, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
        writer.writerow(["item_id:token", "title:token_seq", "genres:token_seq"])
        for item in sorted({r["item_id"] for r in rows}):
            movie = movies[item]
            title = " ".join(movie.title.split())  # tabs and line breaks become spaces
            writer.writerow([item, title, " ".join(g.replace(" ", "_") for g in movie.genres)])
    return path


def export(run: Path, fmt: str, out: Path | None = None, impressions: bool = False) -> Path:
    rows = interactions(run, impressions)
    out = out or run / "export" / fmt
    out.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        path = out / "interactions.csv"
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, COLUMNS)
            writer.writeheader()
            writer.writerows({**r, "rating": "" if r["rating"] is None else r["rating"]} for r in rows)
    elif fmt == "recbole":
        config = json.loads((run / "config.json").read_text())
        path = write_recbole(out, rows, movielens.load(config["data"]).movies)
    else:
        raise SystemExit(f"error: --format is recbole or csv, not {fmt!r}")
    watches = sum(r["action"] == "watch" for r in rows)
    print(f"{len(rows)} interactions ({watches} watches, {len(rows) - watches} shown) -> {path}")
    return path
