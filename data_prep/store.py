"""One embedded single-file store (SQLite) of users, items and reviews, with indexes.

Why SQLite: it ships with Python, needs no server, holds a 2M-review dump in one file that any tool can
open, answers an indexed ``get_reviews(user_id=...)`` in well under a millisecond, and gives atomic
commits, which is what lets a build stop and resume without losing or mixing work.

``ReviewStore`` is the read side. Its API matches the official AgentSociety ``InteractionTool``
(``get_user``, ``get_item``, ``get_reviews(user_id= | item_id= | review_id=)``) plus:

- ``before=``: only reviews strictly older than a time (epoch seconds or ``YYYY-MM-DD HH:MM:SS``);
- a block set of (user_id, item_id) pairs, normally the evaluation tasks: their reviews are invisible
  to every read, so nothing that reads the store for prediction can see a target.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

import orjson

from data_prep.schema import parse_iso

STORE_FILE = "store.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS reviews (
    review_id TEXT PRIMARY KEY,
    user_id   TEXT NOT NULL,
    item_id   TEXT NOT NULL,
    ts        INTEGER NOT NULL,  -- epoch seconds, UTC
    stars     REAL NOT NULL,
    data      BLOB NOT NULL      -- the full record as JSON
);
CREATE TABLE IF NOT EXISTS items (item_id TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS users (user_id TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta  (key TEXT PRIMARY KEY, value TEXT NOT NULL);
-- id sets used by filters during a build (Yelp city filter, Amazon 5-core), dropped when it ends
CREATE TABLE IF NOT EXISTS keep  (kind TEXT NOT NULL, id TEXT NOT NULL, PRIMARY KEY (kind, id)) WITHOUT ROWID;
"""

INDEXES = (
    "CREATE INDEX IF NOT EXISTS reviews_by_user ON reviews (user_id, ts)",
    "CREATE INDEX IF NOT EXISTS reviews_by_item ON reviews (item_id, ts)",
)

# Stay under SQLite's limit on bound variables in one statement.
_CHUNK = 500


def _chunks(values: Sequence, size: int = _CHUNK):
    for start in range(0, len(values), size):
        yield values[start : start + size]


def to_epoch(moment: int | float | str | datetime) -> int:
    if isinstance(moment, datetime):
        return parse_iso(moment.isoformat())
    if isinstance(moment, str):
        return parse_iso(moment)
    return int(moment)


class StoreWriter:
    """The write side, used by data_prep.build. Each ``commit`` is atomic.

    WAL with ``synchronous=NORMAL``: a commit survives a crash of the process, and an OS crash or power
    loss can at most lose the last commits, never corrupt the file (``OFF`` could corrupt a finished
    store). Cost against ``OFF``: see bench/README.md (``python -m bench.build_bench --synchronous``)."""

    SYNCHRONOUS = "NORMAL"  # the benchmark's child processes set OFF to measure the difference

    def __init__(self, path: Path):
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.executescript(
            f"PRAGMA page_size=16384; PRAGMA journal_mode=WAL; PRAGMA synchronous={self.SYNCHRONOUS}; "
            "PRAGMA cache_size=-65536;" + SCHEMA
        )
        self.conn.execute("BEGIN")

    def commit(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.execute("BEGIN")

    def insert_unique(self, table: str, rows: list[tuple]) -> list[int]:
        """Insert rows whose first column is the table's key; return the indices of rows whose key was
        already there (or earlier in ``rows``): those are not inserted."""
        placeholders = ",".join("?" * len(rows[0])) if rows else ""
        sql = f"INSERT OR IGNORE INTO {table} VALUES ({placeholders})"
        before = self.conn.total_changes
        self.conn.execute("SAVEPOINT batch")
        self.conn.executemany(sql, rows)
        if self.conn.total_changes - before == len(rows):
            self.conn.execute("RELEASE batch")
            return []
        # Rare path: redo this batch row by row to learn exactly which rows were duplicates.
        self.conn.execute("ROLLBACK TO batch")
        duplicates = [i for i, row in enumerate(rows) if self.conn.execute(sql, row).rowcount == 0]
        self.conn.execute("RELEASE batch")
        return duplicates

    # -- filter sets -----------------------------------------------------------------------------------
    def keep_add(self, kind: str, ids: Iterable[str]) -> None:
        self.conn.executemany("INSERT OR IGNORE INTO keep VALUES (?, ?)", ((kind, i) for i in ids))

    def keep_has(self, kind: str) -> bool:
        return self.conn.execute("SELECT 1 FROM keep WHERE kind = ? LIMIT 1", (kind,)).fetchone() is not None

    def keep_contains(self, kind: str, ids: Sequence[str]) -> set[str]:
        found: set[str] = set()
        unique = list(set(ids))
        for part in _chunks(unique):
            sql = f"SELECT id FROM keep WHERE kind = ? AND id IN ({','.join('?' * len(part))})"
            found.update(row[0] for row in self.conn.execute(sql, (kind, *part)))
        return found

    # -- meta ------------------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self.conn.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    # -- end of build ----------------------------------------------------------------------------------
    def _stubs(self, key: str, table: str) -> list[tuple[str, str]]:
        """Minimal records ({id, source}, as the official processed layout has for Amazon users) for
        ids that reviews reference but the dump did not describe; source is taken from a review."""
        rows = self.conn.execute(
            f"SELECT {key}, MIN(json_extract(data, '$.source')) FROM reviews "
            f"WHERE {key} NOT IN (SELECT {key} FROM {table}) GROUP BY {key}"
        ).fetchall()
        self.conn.executemany(
            f"INSERT INTO {table} VALUES (?, ?)",
            ((i, orjson.dumps({key: i, "source": source})) for i, source in rows),
        )
        return rows

    def finalize(self, *, drop_users_without_reviews: bool) -> dict[str, int]:
        """Index, fill in stub users/items that reviews reference but the dump did not describe, and
        return what was done. Idempotent."""
        c = self.conn
        for statement in INDEXES:  # built once at the end: faster than maintaining them row by row
            c.execute(statement)
        stats = {"users_dropped_without_reviews": 0}
        if drop_users_without_reviews:
            stats["users_dropped_without_reviews"] = c.execute(
                "DELETE FROM users WHERE user_id NOT IN (SELECT user_id FROM reviews)"
            ).rowcount
        stub_users = self._stubs("user_id", "users")
        stub_items = self._stubs("item_id", "items")
        c.execute("DELETE FROM keep")
        stats["users_without_profile"] = len(stub_users)
        stats["items_without_metadata"] = len(stub_items)
        for table in ("reviews", "users", "items"):
            stats[table] = c.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        self.commit()
        return stats

    def close(self) -> None:
        if self.conn.in_transaction:
            self.conn.execute("COMMIT")
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self.conn.close()


class ReviewStore:
    """Read-only access in the shape of the official InteractionTool, with ``before=`` and a block set."""

    def __init__(self, path: str | Path, block: Iterable[tuple[str, str]] = ()):
        path = Path(path)
        if path.is_dir():
            path = path / STORE_FILE
        if not path.exists():
            raise FileNotFoundError(f"no review store at {path}: build one with python -m data_prep.build")
        self.path = path
        self.conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False)
        self.conn.execute("PRAGMA cache_size=-65536")
        self.conn.execute(
            "CREATE TEMP TABLE block (user_id TEXT, item_id TEXT, PRIMARY KEY (user_id, item_id))"
        )
        self.conn.executemany("INSERT OR IGNORE INTO temp.block VALUES (?, ?)", block)
        self.blocked = self.conn.execute("SELECT COUNT(*) FROM temp.block").fetchone()[0]

    @classmethod
    def open(cls, data_dir: str | Path, tasks: str | Path | None = None) -> ReviewStore:
        """The store of a build folder, with the (user, item) pairs of a task folder blocked (a
        validation folder's include the pairs of the tasks it was drawn for: blocked_pairs.json)."""
        from data_prep.tasks import blocked_pairs

        block = blocked_pairs(tasks) if tasks else []
        return cls(Path(data_dir) / STORE_FILE, block=block)

    def get_user(self, user_id: str) -> dict | None:
        row = self.conn.execute("SELECT data FROM users WHERE user_id = ?", (user_id,)).fetchone()
        return orjson.loads(row[0]) if row else None

    def get_item(self, item_id: str) -> dict | None:
        row = self.conn.execute("SELECT data FROM items WHERE item_id = ?", (item_id,)).fetchone()
        return orjson.loads(row[0]) if row else None

    def get_reviews(
        self,
        item_id: str | None = None,
        user_id: str | None = None,
        review_id: str | None = None,
        before: int | str | datetime | None = None,
        order: str = "time",
        not_user: str | None = None,
    ) -> list[dict]:
        """Reviews matching every given key, oldest first (``order="file"``: in the order the build read
        them, the official tool's order); never one of a blocked (user, item) pair. ``not_user``: leave
        out that user's reviews (an item's reviews by other users, as a prompt calls them)."""
        if review_id is None and user_id is None and item_id is None:
            raise ValueError("get_reviews needs item_id, user_id or review_id")
        where, args = self._where(
            before, review_id=review_id, user_id=user_id, item_id=item_id, not_user=not_user
        )
        by = {"time": "r.ts, r.review_id", "file": "r.rowid"}[order]
        sql = f"SELECT data FROM reviews r {where} ORDER BY {by}"
        return [orjson.loads(data) for (data,) in self.conn.execute(sql, args)]

    def ids(self, table: str, before: int | str | datetime | None = None) -> list[str]:
        """Every id of ``table`` (items, users, or reviews visible strictly before ``before`` and not
        blocked), in the order the build read them."""
        if table == "reviews":
            where, args = self._where(before)
            return [
                i
                for (i,) in self.conn.execute(
                    f"SELECT review_id FROM reviews r {where} ORDER BY r.rowid", args
                )
            ]
        key = {"items": "item_id", "users": "user_id"}[table]
        return [i for (i,) in self.conn.execute(f"SELECT {key} FROM {table} ORDER BY rowid")]

    def has_reviews(self, before: int | str | datetime | None = None, **keys) -> bool:
        """Whether any visible review matches the keys (strictly older than ``before``): one row read."""
        where, args = self._where(before, **keys)
        return self.conn.execute(f"SELECT 1 FROM reviews r {where} LIMIT 1", args).fetchone() is not None

    def _where(self, before=None, not_user: str | None = None, **keys) -> tuple[str, list]:
        """The WHERE clause over ``reviews r``: the given keys, strictly older than ``before``, not by
        ``not_user``, and never a review of a blocked (user, item) pair."""
        clauses, args = [], []
        for column, value in keys.items():
            if value is not None:
                clauses.append(f"r.{column} = ?")
                args.append(value)
        if not_user is not None:
            clauses.append("r.user_id != ?")
            args.append(not_user)
        if before is not None:
            clauses.append("r.ts < ?")
            args.append(to_epoch(before))
        if self.blocked:
            clauses.append(
                "NOT EXISTS (SELECT 1 FROM temp.block b WHERE b.user_id = r.user_id AND b.item_id = r.item_id)"
            )
        return ("WHERE " + " AND ".join(clauses)) if clauses else "", args

    def visible_reviews(self):
        """Every review not hidden by the block set, by user then time (streams; for training pairs)."""
        where, _ = self._where()
        for (data,) in self.conn.execute(
            f"SELECT data FROM reviews r {where} ORDER BY r.user_id, r.ts, r.review_id"
        ):
            yield orjson.loads(data)

    def visible_texts(self):
        """(text, ts) of every review not hidden by the block set (streams)."""
        where, _ = self._where()
        for ts, data in self.conn.execute(f"SELECT ts, data FROM reviews r {where}"):
            yield orjson.loads(data).get("text") or "", ts

    def visible_ratings(self) -> list[tuple[str, str, str, int, float]]:
        """(review_id, user_id, item_id, ts, stars) of every review not hidden by the block set: no texts,
        so star models fit on millions of reviews in little memory."""
        where, _ = self._where()
        return self.conn.execute(
            f"SELECT review_id, user_id, item_id, ts, stars FROM reviews r {where}"
        ).fetchall()

    def mean_stars(self, before: int | str | datetime | None = None) -> float | None:
        """The mean of every visible review's stars (strictly older than ``before``); None if none."""
        where, args = self._where(before)
        return self.conn.execute(f"SELECT AVG(stars) FROM reviews r {where}", args).fetchone()[0]

    def latest_ts_of(self, review_ids: Iterable[str]) -> int | None:
        """The latest time (epoch seconds) among those of ``review_ids`` that are in this store, blocked
        or not; None when none is."""
        sql = "SELECT MAX(ts) FROM reviews WHERE review_id IN (SELECT value FROM json_each(?))"
        return self.conn.execute(sql, (orjson.dumps(list(review_ids)).decode(),)).fetchone()[0]

    def latest_review(self, before: int | str | datetime | None = None) -> dict | None:
        """The most recent visible review of the whole store (strictly older than ``before``)."""
        where, args = self._where(before)
        row = self.conn.execute(
            f"SELECT data FROM reviews r {where} ORDER BY r.ts DESC, r.review_id DESC LIMIT 1", args
        ).fetchone()
        return orjson.loads(row[0]) if row else None

    def meta(self) -> dict[str, str]:
        return dict(self.conn.execute("SELECT key, value FROM meta"))

    def close(self) -> None:
        self.conn.close()
