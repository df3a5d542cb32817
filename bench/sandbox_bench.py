"""Sandbox figures a person can rerun.

    python -m bench.sandbox_bench pareto       # the activity law fitted to MovieLens per-user rating counts
    python -m bench.sandbox_bench efficiency   # wall time per round against the number of agents

``pareto``: alpha of a Pareto law fitted by maximum likelihood (x_min = the smallest count) to the
number of ratings per user, with the Kolmogorov-Smirnov distance of the data from the fitted law, and
the same for the counts above a few larger x_min (the tail is where a power law is usually judged).

``efficiency``: one round's wall time for 1 to 1,000 agents (every agent active) against a fake backend
with a fixed latency per call plus a cost per answered row, batched (the world's one call per step for
all agents) and one request at a time (the same answers, each its own call), side by side in one run;
LLM calls per agent per round. The fake stands for a remote server; the sentence encoder is replaced
by a hashed bag of words and the recommender is popularity, so the figures are the world's own
overhead plus the modelled LLM time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections import Counter

import numpy as np

from agents.retrieval import hashed_bag_of_words
from agents.sandbox import movielens
from agents.sandbox.social import fit_pareto


def pareto(args) -> dict:
    data = movielens.load(args.data)
    counts = np.array(sorted(Counter(r.user for r in data.ratings).values()))
    rows = {}
    for xmin in (counts.min(), 50, 100, 200):
        tail = counts[counts >= xmin]
        rows[int(xmin)] = fit_pareto(tail)
    print(json.dumps(rows, indent=1))
    return rows


class FakeBackend:
    """Valid answers by rule, after sleeping latency + per_row * rows (a remote server's cost)."""

    def __init__(self, latency: float, per_row: float):
        self.latency, self.per_row, self.calls = latency, per_row, 0

    def generate(self, conversations, sampling, constraint=None):
        self.calls += 1
        time.sleep(self.latency + self.per_row * len(conversations))
        return [self.answer(c, constraint) for c in conversations]

    @staticmethod
    def answer(conversation, constraint) -> str:
        name = conversation[0]["content"].removeprefix("You are ").split(";")[0]
        turn = int(hashlib.md5(name.encode()).hexdigest(), 16) % 3
        if constraint.kind == "choice":
            return ("recommender", "social", "nothing")[turn]
        keys = set(json.loads(constraint.schema)["properties"])
        if "summary" in keys:
            return json.dumps({"summary": conversation[-1]["content"][-60:], "importance": 7})
        if "items" in keys:
            return json.dumps({"action": "watch", "items": [1], "query": "", "feeling": "fine"})
        if "action" in keys:
            return json.dumps({"action": ("chat", "post")[turn % 2], "contact": 1, "text": "hello"})
        if "insight" in keys:
            return json.dumps({"insight": "a pattern"})
        return json.dumps({"say": "sure"})


class OneAtATime:
    """The same backend asked one conversation per call."""

    def __init__(self, backend):
        self.backend = backend

    def generate(self, conversations, sampling, constraint=None):
        return [self.backend.generate([c], sampling, constraint)[0] for c in conversations]


def one_round(data, n: int, backend, seed: int = 0) -> tuple[float, int]:
    from agents.sandbox.config import load_config
    from agents.sandbox.profiles import Profile
    from agents.sandbox.social import generate_graph
    from agents.sandbox.world import World

    config = load_config(None, ["recommender.kind=popularity", "activity.pareto_xmin=1", f"seed={seed}"])
    rng = np.random.default_rng(seed)
    genres = sorted({g for m in data.movies.values() for g in m.genres})
    profiles = [
        Profile(10_000 + i, f"Agent {i}", interests=[genres[i % len(genres)]], source="handcrafted")
        for i in range(n)
    ]
    names = [p.name for p in profiles]
    graph = generate_graph(names, [p.interests for p in profiles], 3, 0.0, rng)
    history = [(r.user, r.movie) for r in data.ratings]
    world = World(
        config, profiles, data.movies, history, backend, lambda t: hashed_bag_of_words(t, 64), graph, rng
    )
    start = time.perf_counter()
    world.step()
    answers = (
        sum(v for k, v in world.counts.items() if k.startswith("llm_calls:"))
        + world.model.counts["llm_calls"]
    )
    return time.perf_counter() - start, answers


def efficiency(args) -> dict:
    data = movielens.load(args.data)
    rows = []
    for n in args.agents:
        fake = FakeBackend(args.latency, args.per_row)
        seconds, answers = one_round(data, n, fake)
        row = {
            "agents": n,
            "batched_s": round(seconds, 3),
            "calls": fake.calls,
            "answers_per_agent": round(answers / n, 2),
        }
        if n <= args.max_single:
            single = FakeBackend(args.latency, args.per_row)
            single_s, _ = one_round(data, n, OneAtATime(single))
            row.update(
                one_at_a_time_s=round(single_s, 3),
                single_calls=single.calls,
                ratio=round(single_s / seconds, 2),
            )
        rows.append(row)
        print(json.dumps(row))
    return {"latency_s": args.latency, "per_row_s": args.per_row, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("pareto")
    fit.add_argument("--data", default="../shared/data/raw/movielens_latest_small")
    speed = sub.add_parser("efficiency")
    speed.add_argument("--data", default="../shared/data/raw/movielens_latest_small")
    speed.add_argument("--agents", type=int, nargs="+", default=[1, 10, 100, 1000])
    speed.add_argument("--latency", type=float, default=0.05, help="seconds per call")
    speed.add_argument("--per-row", type=float, default=0.002, help="seconds per answered row")
    speed.add_argument("--max-single", type=int, default=100, help="largest size also run one at a time")
    args = parser.parse_args(argv)
    (pareto if args.command == "pareto" else efficiency)(args)


if __name__ == "__main__":
    main()
