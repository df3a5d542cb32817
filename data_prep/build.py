"""Build one review store from a raw dump, streaming: nothing is loaded whole into memory.

    python -m data_prep.build --source asc --platform yelp --input ../shared/data/raw/yelp_asc_sample --out runs/data/yelp
    python -m data_prep.build --source amazon2018 --input ../shared/data/raw/amazon2018_5core_small --out runs/data/amazon
    python -m data_prep.build --source yelp --input ~/yelp_dataset --official-cities --out data/yelp
    python -m data_prep.build --source amazon2023 --input Video_Games.jsonl.gz meta_Video_Games.jsonl.gz \\
        Video_Games.csv --out data/amazon_vg        # the .csv (rating-only 5-core) turns on the 5-core filter
    python -m data_prep.build --source goodreads --input goodreads_reviews_poetry.json.gz \\
        goodreads_books_poetry.json.gz --out data/goodreads_poetry

Writes to ``--out``:
- ``store.sqlite``  the store (data_prep.store.ReviewStore reads it);
- ``report.json``   counts: reviews_read = reviews_kept + reviews_rejected + reviews_filtered, and why;
- ``rejects.jsonl`` every rejected line: file, line, reason and the raw text.

A build commits every batch together with its position in the input, so a stopped build resumes where
it stopped when run again with the same inputs and options. A folder that holds a build of other inputs
is refused (``--overwrite`` replaces it); two builds are never mixed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from tqdm import tqdm

from data_prep.io import LineReader, sha256_file
from data_prep.schema import Filtered, Reject, check_review, format_utc, require_str
from data_prep.sources import SOURCES, YELP_CITIES, Source, category_of
from data_prep.store import STORE_FILE, StoreWriter

BUILD_VERSION = 1
ROLE_ORDER = ("ratings", "item", "user", "review")  # filters (ratings, cities) must be known before reviews

# The headline counts of report.json (what the demo prints; a resumed build must reproduce them).
SUMMARY_KEYS = (
    "reviews_read",
    "reviews_kept",
    "reviews_rejected",
    "reviews_filtered",
    "users",
    "items",
    "reasons",
)


@dataclass
class Progress:
    """Everything a resumed build needs; committed in the same transaction as the rows it describes."""

    file_index: int = 0
    line: int = 0
    rejects_offset: int = 0
    reviews_read: int = 0
    reviews_kept: int = 0
    reviews_rejected: int = 0
    reviews_filtered: int = 0
    reasons: Counter = field(default_factory=Counter)
    other_rejects: Counter = field(default_factory=Counter)  # items, users, rating rows
    items_filtered: int = 0

    @classmethod
    def load(cls, text: str | None) -> Progress:
        if not text:
            return cls()
        data = orjson.loads(text)
        data["reasons"] = Counter(data["reasons"])
        data["other_rejects"] = Counter(data["other_rejects"])
        return cls(**data)


def plan_inputs(source: Source, inputs: list[str]) -> list[tuple[str, Path]]:
    """(role, path) for every input, in processing order. Directories contribute the files whose names
    the source recognises; an explicit file it does not recognise, or a missing path, is an error."""
    plan: list[tuple[str, Path]] = []
    for given in inputs:
        path = Path(given)
        if not path.exists():
            sys.exit(f"error: input {path} does not exist (expected {source.expected})")
        if path.is_dir():
            found = [(source.role(p), p) for p in sorted(path.iterdir()) if p.is_file()]
            used = [(role, p) for role, p in found if role]
            if not used:
                sys.exit(f"error: no {source.name} files in {path} (expected {source.expected})")
            ignored = [p.name for role, p in found if not role]
            if ignored:
                print(
                    f"note: ignoring files in {path} that are not {source.name} input: {', '.join(ignored)}"
                )
            plan.extend(used)
        else:
            role = source.role(path)
            if role is None:
                sys.exit(
                    f"error: cannot tell what {path} is for --source {source.name} (expected {source.expected})"
                )
            plan.append((role, path))
    if not any(role == "review" for role, _ in plan):
        sys.exit(f"error: no review file among the inputs (expected {source.expected})")
    if not source.item and any(role == "item" for role, _ in plan):
        sys.exit(f"error: --source {source.name} takes no item files")
    return sorted(plan, key=lambda rp: (ROLE_ORDER.index(rp[0]), str(rp[1])))


def fingerprint(source: str, plan: list[tuple[str, Path]], options: dict) -> dict:
    inputs = []
    for role, path in tqdm(plan, desc="hashing inputs", unit="file", leave=False):
        inputs.append(
            {
                "role": role,
                "path": str(path.resolve()),
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
            }
        )
    combined = hashlib.sha256(orjson.dumps([i["sha256"] for i in inputs])).hexdigest()
    return {
        "version": BUILD_VERSION,
        "source": source,
        "options": options,
        "inputs": inputs,
        "source_sha256": combined,
    }


def parse_line(raw: bytes) -> dict:
    if not raw.strip():
        raise Reject("empty_line")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            raise Reject("invalid_utf8") from None
        raise Reject("malformed_json") from None
    if not isinstance(obj, dict):
        raise Reject("not_a_json_object")
    return obj


@dataclass
class ParsedReviews:
    """One batch of review lines, mapped and validated; positions index into the batch."""

    rows: list[tuple] = field(default_factory=list)  # (review_id, user_id, item_id, ts, stars, json)
    positions: list[int] = field(default_factory=list)
    rejects: list[tuple[int, str]] = field(default_factory=list)
    filtered: list[str] = field(default_factory=list)


def parse_reviews(source_name: str, category: str, raws: list[bytes], defaults: dict) -> ParsedReviews:
    """Pure (no store access), so it runs in a worker process while the main one writes."""
    source, out = SOURCES[source_name], ParsedReviews()
    for position, raw in enumerate(raws):
        try:
            record, ts = source.review(parse_line(raw), category)
            for key, value in defaults.items():
                record.setdefault(key, value)
            check_review(record)
        except Filtered as why:
            out.filtered.append(why.reason)
            continue
        except Reject as why:
            out.rejects.append((position, why.reason))
            continue
        record["date"] = format_utc(ts)
        out.rows.append(
            (
                record["review_id"],
                record["user_id"],
                record["item_id"],
                ts,
                float(record["stars"]),
                orjson.dumps(record),
            )
        )
        out.positions.append(position)
    return out


def _exit_with_parent(interval: float = 0.5) -> None:
    """Worker initializer: end this worker as soon as the process that started it is gone (a ``kill
    -9``, an out-of-memory kill, a preempted job). Without it a worker blocked on its pipe stays
    behind, holding memory and the input file. A daemon thread, so it also fires while the worker's
    main thread is blocked writing a result. The parent is whoever started this worker (the build
    process under fork; the fork server, which ends with the build, under forkserver)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _run_now(fn, *args) -> Future:
    """Executor.submit's shape, run in this process (--workers 0)."""
    future: Future = Future()
    future.set_result(fn(*args))
    return future


class Builder:
    def __init__(self, source: Source, out: Path, plan, options: dict, batch_size: int, workers: int):
        self.source, self.out, self.plan, self.options = source, out, plan, options
        self.batch_size, self.workers = batch_size, workers
        # fields set on records that lack them (--platform for the processed layout, which may omit source)
        self.defaults = {"source": options["platform"]} if options.get("platform") else {}
        self.store = StoreWriter(out / STORE_FILE)
        self.state = Progress.load(self.store.get_meta("progress"))
        self.rejects = open(out / "rejects.jsonl", "ab")
        self.rejects.truncate(self.state.rejects_offset)  # drop rejects written after the last commit
        self.rejects.seek(self.state.rejects_offset)
        self.five_core = False

    # -- bookkeeping -----------------------------------------------------------------------------------
    def reject(self, path: Path, line: int, reason: str, raw: bytes, *, review: bool) -> None:
        entry = {
            "file": str(path),
            "line": line,
            "reason": reason,
            "raw": raw.decode("utf-8", "backslashreplace"),
        }
        self.rejects.write(orjson.dumps(entry) + b"\n")
        if review:
            self.state.reviews_rejected += 1
            self.state.reasons[reason] += 1
        else:
            self.state.other_rejects[reason] += 1

    def checkpoint(self, file_index: int, line: int) -> None:
        self.rejects.flush()
        self.state.file_index, self.state.line, self.state.rejects_offset = (
            file_index,
            line,
            self.rejects.tell(),
        )
        self.store.set_meta("progress", orjson.dumps(vars(self.state)).decode())
        self.store.commit()

    # -- parsing ---------------------------------------------------------------------------------------
    def parse(self, path: Path, batch: list[tuple[int, bytes]]):
        """Yield (line, raw, object) for each line that is a JSON object; reject the rest (items, users)."""
        for line, raw in batch:
            try:
                yield line, raw, parse_line(raw)
            except Reject as why:
                self.reject(path, line, why.reason, raw, review=False)

    # -- roles -----------------------------------------------------------------------------------------
    def reviews(self, path: Path, batch: list[tuple[int, bytes]], parsed: ParsedReviews) -> None:
        """Store one batch that parse_reviews has mapped: filters, duplicates, counts, rejects."""
        self.state.reviews_read += len(batch)
        for position, reason in parsed.rejects:
            self.reject(path, batch[position][0], reason, batch[position][1], review=True)
        for reason in parsed.filtered:
            self.state.reviews_filtered += 1
            self.state.reasons[reason] += 1
        rows, positions = self.apply_filters(parsed.rows, parsed.positions)
        duplicates = self.store.insert_unique("reviews", rows) if rows else []
        for index in duplicates:
            line, raw = batch[positions[index]]
            if self.source.name == "amazon2018":  # the same review copied onto another variant ASIN
                self.state.reviews_filtered += 1
                self.state.reasons["duplicate_variant"] += 1
            else:
                self.reject(path, line, "duplicate_review_id", raw, review=True)
        self.state.reviews_kept += len(rows) - len(duplicates)

    def apply_filters(self, rows: list[tuple], positions: list[int]) -> tuple[list[tuple], list[int]]:
        """Drop (and count) rows that the city filter or the 5-core filter leaves out."""
        rules = []
        if self.options.get("official_cities"):
            cities = self.store.keep_contains("yelp_business", [row[2] for row in rows])
            rules.append(("city_filter", lambda row: row[2] in cities))
        if self.five_core:
            users = self.store.keep_contains("five_core_user", [row[1] for row in rows])
            items = self.store.keep_contains("five_core_item", [row[2] for row in rows])
            rules.append(("not_in_5core", lambda row: row[1] in users and row[2] in items))
        if not rules:
            return rows, positions
        kept_rows, kept_positions = [], []
        for row, position in zip(rows, positions, strict=True):
            failed = next((reason for reason, ok in rules if not ok(row)), None)
            if failed:
                self.state.reviews_filtered += 1
                self.state.reasons[failed] += 1
            else:
                kept_rows.append(row)
                kept_positions.append(position)
        return kept_rows, kept_positions

    def items(self, path: Path, batch: list[tuple[int, bytes]]) -> None:
        category = category_of(self.source, path)
        rows, raws = [], []
        for line, raw, obj in self.parse(path, batch):
            try:
                record = {**self.defaults, **self.source.item(obj, category)}
                item_id = require_str(record, "item_id")
            except Reject as why:
                self.reject(path, line, f"item:{why.reason}", raw, review=False)
                continue
            if self.options.get("official_cities"):
                if record.get("city") not in YELP_CITIES:
                    self.state.items_filtered += 1
                    continue
                self.store.keep_add("yelp_business", [item_id])
            rows.append((item_id, orjson.dumps(record)))
            raws.append((line, raw))
        for index in self.store.insert_unique("items", rows) if rows else []:
            self.reject(path, raws[index][0], "item:duplicate_item_id", raws[index][1], review=False)

    def users(self, path: Path, batch: list[tuple[int, bytes]]) -> None:
        rows, raws = [], []
        for line, raw, obj in self.parse(path, batch):
            try:
                record = {**self.defaults, **self.source.user(obj, "")}
                user_id = require_str(record, "user_id")
            except Reject as why:
                self.reject(path, line, f"user:{why.reason}", raw, review=False)
                continue
            rows.append((user_id, orjson.dumps(record)))
            raws.append((line, raw))
        for index in self.store.insert_unique("users", rows) if rows else []:
            self.reject(path, raws[index][0], "user:duplicate_user_id", raws[index][1], review=False)

    def ratings(self, path: Path, batch: list[tuple[int, bytes]]) -> None:
        """Amazon 2023 rating-only CSV (user_id,parent_asin,rating,timestamp): the 5-core id sets."""
        users, items = [], []
        for line, raw in batch:
            if line == 1 and raw.startswith(b"user_id"):
                continue
            cells = raw.decode("utf-8", "replace").split(",")
            if len(cells) < 2 or not cells[0] or not cells[1]:
                self.reject(path, line, "ratings:malformed_csv", raw, review=False)
                continue
            users.append(cells[0])
            items.append(cells[1])
        self.store.keep_add("five_core_user", users)
        self.store.keep_add("five_core_item", items)

    # -- driver ----------------------------------------------------------------------------------------
    def finish(self, index: int, role: str, path: Path, batch: list, parsed: Future | None) -> None:
        """Store one batch and commit it together with the position after it."""
        if role == "review":
            self.reviews(path, batch, parsed.result())
        else:
            {"item": self.items, "user": self.users, "ratings": self.ratings}[role](path, batch)
        self.checkpoint(index, batch[-1][0])

    def show(self, bar: tqdm, reader: LineReader) -> None:
        bar.update(reader.position - bar.n)
        bar.set_postfix(kept=f"{self.state.reviews_kept:,}", rejected=self.state.reviews_rejected)

    def batches(self, reader: LineReader, skip: int):
        batch: list[tuple[int, bytes]] = []
        for number, raw in reader:
            if number > skip:
                batch.append((number, raw))
                if len(batch) == self.batch_size:
                    yield batch
                    batch = []
        if batch:
            yield batch

    def run(self) -> dict:
        self.five_core = any(role == "ratings" for role, _ in self.plan)
        started = time.perf_counter()
        resumed_at = self.state.reviews_read
        # Review lines are parsed in worker processes while this one writes; results are taken in
        # input order, with a bounded number in flight, so memory stays flat and checkpoints exact.
        pool = ProcessPoolExecutor(self.workers, initializer=_exit_with_parent) if self.workers else None
        submit = pool.submit if pool else _run_now
        try:
            for index, (role, path) in enumerate(self.plan):
                if index < self.state.file_index:
                    continue
                skip = self.state.line if index == self.state.file_index else 0
                if skip:
                    print(f"resuming {path.name} after line {skip:,}")
                category = category_of(self.source, path)
                size = path.stat().st_size
                with (
                    LineReader(path) as reader,
                    tqdm(total=size, unit="B", unit_scale=True, desc=f"{role:7s} {path.name}") as bar,
                ):
                    in_flight: deque = deque()
                    for batch in self.batches(reader, skip):
                        if role == "review":
                            raws = [raw for _, raw in batch]
                            in_flight.append(
                                (
                                    batch,
                                    submit(parse_reviews, self.source.name, category, raws, self.defaults),
                                )
                            )
                        else:
                            in_flight.append((batch, None))
                        while len(in_flight) > 2 * self.workers:
                            self.finish(index, role, path, *in_flight.popleft())
                            self.show(bar, reader)
                    while in_flight:
                        self.finish(index, role, path, *in_flight.popleft())
                    self.show(bar, reader)
                self.checkpoint(index + 1, 0)
        finally:
            if pool:
                pool.shutdown(cancel_futures=True)
        elapsed = time.perf_counter() - started
        stats = self.store.finalize(drop_users_without_reviews=bool(self.options.get("official_cities")))
        s = self.state
        assert s.reviews_read == s.reviews_kept + s.reviews_rejected + s.reviews_filtered, (
            "counts must reconcile"
        )
        assert stats["reviews"] == s.reviews_kept, "store and counters disagree"
        report = {
            "reviews_read": s.reviews_read,
            "reviews_kept": s.reviews_kept,
            "reviews_rejected": s.reviews_rejected,
            "reviews_filtered": s.reviews_filtered,
            "users": stats["users"],
            "items": stats["items"],
            "reasons": dict(sorted(s.reasons.items())),
            "other_rejects": dict(sorted(s.other_rejects.items())),
            "items_filtered": s.items_filtered,
            "users_without_profile": stats["users_without_profile"],
            "items_without_metadata": stats["items_without_metadata"],
            "users_dropped_without_reviews": stats["users_dropped_without_reviews"],
            "seconds": round(elapsed, 2),
            "reviews_per_second": round((s.reviews_read - resumed_at) / elapsed) if elapsed else None,
            "resumed": resumed_at > 0,
        }
        self.rejects.close()
        return report


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", required=True, choices=sorted(SOURCES))
    parser.add_argument("--input", required=True, nargs="+", help="files and/or folders of the dump")
    parser.add_argument("--out", required=True, type=Path, help="build folder (DATA_DIR)")
    parser.add_argument(
        "--official-cities",
        action="store_true",
        help=f"yelp: keep only businesses in {', '.join(YELP_CITIES)}",
    )
    parser.add_argument(
        "--platform",
        choices=["yelp", "amazon", "goodreads"],
        help="asc: the source of records that do not name one",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a build of other inputs in --out")
    parser.add_argument("--batch-size", type=int, default=5000)
    parser.add_argument(
        "--workers",
        type=int,
        default=min(2, os.cpu_count() or 1) - 1,
        help="parser processes (0: parse here)",
    )
    args = parser.parse_args(argv)

    source = SOURCES[args.source]
    if args.official_cities and args.source != "yelp":
        parser.error("--official-cities applies to --source yelp only")
    plan = plan_inputs(source, args.input)
    if args.official_cities and not any(role == "item" for role, _ in plan):
        sys.exit("error: --official-cities needs the Yelp business file among the inputs")
    print(f"{source.name}: " + ", ".join(f"{p.name} ({role})" for role, p in plan))

    if args.platform and args.source != "asc":
        parser.error("--platform applies to --source asc only (the other readers know their platform)")
    options = {"official_cities": args.official_cities, "platform": args.platform}
    identity = fingerprint(source.name, plan, options)
    out: Path = args.out
    store_path, report_path = out / STORE_FILE, out / "report.json"
    if store_path.exists():
        existing = StoreWriter(store_path)
        previous = existing.get_meta("fingerprint")
        existing.close()
        if previous != orjson.dumps(identity).decode():
            if not args.overwrite:
                sys.exit(
                    f"error: {out} holds a build of other inputs or options; use another --out or --overwrite"
                )
            for name in (
                STORE_FILE,
                STORE_FILE + "-wal",
                STORE_FILE + "-shm",
                "report.json",
                "rejects.jsonl",
            ):
                (out / name).unlink(missing_ok=True)
        elif report_path.exists():
            print(f"{out} already holds this build; nothing to do")
            return orjson.loads(report_path.read_bytes())
    out.mkdir(parents=True, exist_ok=True)

    builder = Builder(source, out, plan, options, args.batch_size, args.workers)
    builder.store.set_meta("fingerprint", orjson.dumps(identity).decode())
    builder.store.commit()
    report = builder.run()
    report = {
        **report,
        "source": source.name,
        "source_sha256": identity["source_sha256"],
        "inputs": identity["inputs"],
    }
    builder.store.set_meta("source_sha256", identity["source_sha256"])
    builder.store.set_meta("report", orjson.dumps(report).decode())
    builder.store.close()
    tmp = report_path.with_suffix(".tmp")
    tmp.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    tmp.replace(report_path)
    print(
        f"kept {report['reviews_kept']:,} of {report['reviews_read']:,} reviews "
        f"({report['reviews_rejected']:,} rejected, {report['reviews_filtered']:,} filtered); "
        f"{report['users']:,} users, {report['items']:,} items -> {out}"
    )
    if report["reasons"]:
        print("reasons: " + ", ".join(f"{k} {v:,}" for k, v in report["reasons"].items()))
    return report


if __name__ == "__main__":
    main()
