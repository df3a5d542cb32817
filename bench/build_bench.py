"""Benchmark: build throughput, peak memory and lookup latency of the review store, side by side with a
re-creation of the official load-everything-into-dicts approach, in one run.

    python -m bench.build_bench --out runs/bench                      # 200k and 2M reviews (~5 min)
    python -m bench.build_bench --out runs/bench --sizes 200000       # quick
    python -m bench.build_bench --out runs/bench --synchronous 500000  # SQLite synchronous NORMAL vs OFF

Each measurement runs in its own process, so peak RSS (from wait4) is that step's alone. Dumps are
synthetic Yelp raw files (bench/synth_yelp.py), made once and reused; every build uses the official
three-city filter, as the official pipeline does.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.synth_yelp import generate


def measure(cmd: list[str], env: dict | None = None) -> dict:
    """Run cmd (with ``env`` added to this process's environment); return wall seconds, peak RSS in MB,
    system CPU seconds, minor page faults and its stdout's last line parsed as JSON if it is."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}")
    last = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    parsed = json.loads(last) if last.startswith("{") else {}
    return {
        "wall_seconds": round(seconds, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "system_cpu_seconds": round(usage.ru_stime, 1),
        "minor_page_faults": usage.ru_minflt,
        **parsed,
    }


def lookup_latency(store_dir: str, lookups: int) -> None:
    """(Runs in a child process.) Median/p99 of get_reviews(user_id=...) over random users, without and
    with a block set the size of a large evaluation (10,000 real (user, item) pairs)."""
    from data_prep.store import ReviewStore

    plain = ReviewStore(store_dir)
    users = [u for (u,) in plain.conn.execute("SELECT user_id FROM users ORDER BY user_id")]
    pairs = plain.conn.execute(
        "SELECT user_id, item_id FROM reviews ORDER BY random() LIMIT 10000"
    ).fetchall()
    blocked = ReviewStore(store_dir, block=pairs)
    sample = random.Random(0).choices(users, k=lookups)
    result: dict = {"lookups": lookups}
    for name, store in (("lookup", plain), ("lookup_blocked", blocked)):
        times, found = [], 0
        for user in sample:
            t0 = time.perf_counter()
            found += len(store.get_reviews(user_id=user))
            times.append(time.perf_counter() - t0)
        times.sort()
        result[f"{name}_reviews_mean"] = round(found / lookups, 2)
        result[f"{name}_median_ms"] = round(statistics.median(times) * 1e3, 4)
        result[f"{name}_p99_ms"] = round(times[int(0.99 * len(times))] * 1e3, 4)
    print(json.dumps(result))


def build_with(synchronous: str, dump: Path, store: Path) -> dict:
    """One build in a child process with the store's SQLite synchronous level set to ``synchronous``."""
    shutil.rmtree(store, ignore_errors=True)
    code = (
        "import sys; from data_prep.store import StoreWriter; from data_prep import build; "
        f"StoreWriter.SYNCHRONOUS = {synchronous!r}; build.main(sys.argv[1:])"
    )
    run = measure([sys.executable, "-c", code, "--source", "yelp", "--input", str(dump), "--out", str(store)])
    run["reviews_per_second"] = round(
        json.loads((store / "report.json").read_text())["reviews_read"] / run["wall_seconds"]
    )
    return run


def compare_synchronous(size: int, out: Path, rounds: int = 2) -> dict:
    """Builds of one dump with synchronous=OFF and NORMAL, interleaved (OFF, NORMAL, NORMAL, OFF, ...)
    so that the machine's drift hits both alike; the ratio of median wall times."""
    dump = out / f"yelp_{size}"
    if not (dump / "yelp_academic_dataset_review.json").exists():
        generate(size, dump)
    walls: dict[str, list[float]] = {"OFF": [], "NORMAL": []}
    for r in range(rounds):
        for level in ("OFF", "NORMAL") if r % 2 == 0 else ("NORMAL", "OFF"):
            print(f"== build of {size:,} reviews with synchronous={level}", flush=True)
            walls[level].append(build_with(level, dump, out / f"store_sync_{size}")["wall_seconds"])
    shutil.rmtree(out / f"store_sync_{size}", ignore_errors=True)
    result = {
        "reviews": size,
        "wall_seconds": walls,
        "normal_over_off": round(statistics.median(walls["NORMAL"]) / statistics.median(walls["OFF"]), 3),
    }
    (out / "build_bench_synchronous.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/bench"))
    parser.add_argument("--sizes", type=int, nargs="+", default=[200_000, 2_000_000])
    parser.add_argument("--official-size", type=int, default=200_000)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--lookup-store", help=argparse.SUPPRESS)
    parser.add_argument(
        "--synchronous", type=int, metavar="REVIEWS", help="only compare SQLite synchronous NORMAL vs OFF"
    )
    args = parser.parse_args()
    if args.lookup_store:
        return lookup_latency(args.lookup_store, args.lookups)
    if args.synchronous:
        compare_synchronous(args.synchronous, args.out)
        return None

    py = sys.executable
    results = {"machine": {"cpus": os.cpu_count()}, "ours": {}, "official": {}}
    for size in sorted(set(args.sizes) | {args.official_size}):
        dump = args.out / f"yelp_{size}"
        if not (dump / "yelp_academic_dataset_review.json").exists():
            generate(size, dump)
        store = args.out / f"store_{size}"
        shutil.rmtree(store, ignore_errors=True)
        if size in args.sizes:
            print(f"== ours, {size:,} reviews", flush=True)
            run = measure(
                [
                    py,
                    "-m",
                    "data_prep.build",
                    "--source",
                    "yelp",
                    "--official-cities",
                    "--input",
                    str(dump),
                    "--out",
                    str(store),
                ]
            )
            report = json.loads((store / "report.json").read_text())
            run["reviews_read"] = report["reviews_read"]
            run["reviews_kept"] = report["reviews_kept"]
            run["reviews_per_second"] = round(report["reviews_read"] / run["wall_seconds"])
            lookup = measure(
                [py, "-m", "bench.build_bench", "--lookup-store", str(store), "--lookups", str(args.lookups)]
            )
            run.update({k: v for k, v in lookup.items() if k.startswith("lookup_")})
            results["ours"][size] = run
        if size == args.official_size:
            print(f"== official re-creation, {size:,} reviews", flush=True)
            work = args.out / f"official_{size}"
            shutil.rmtree(work, ignore_errors=True)
            run = measure(
                [
                    py,
                    "-m",
                    "bench.official_recreation",
                    "--input",
                    str(dump),
                    "--work",
                    str(work),
                    "--lookups",
                    str(args.lookups),
                ]
            )
            run["reviews_per_second"] = round(size / run["wall_seconds"])
            results["official"][size] = run
            shutil.rmtree(work, ignore_errors=True)

    size = args.official_size
    if size in results["ours"]:
        ours, official = results["ours"][size], results["official"][size]
        results["ratios_at_official_size"] = {
            "time_official_over_ours": round(official["wall_seconds"] / ours["wall_seconds"], 2),
            "memory_official_over_ours": round(official["peak_rss_mb"] / ours["peak_rss_mb"], 2),
        }
    (args.out / "build_bench.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
