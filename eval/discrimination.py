"""The RecAgent paper's discrimination test: can a method tell the items a user watched next from
random ones?

For each sampled MovieLens user (seeded): the user's ratings in time order (ties by movie id); the
last ``a`` are held out (T); ``b`` random movies the user never rated join them; the method picks
``a`` of the a + b (S); p = mean over users of |T & S| / |T|, with a 95% bootstrap interval over users.
Everything a method sees is older than the user's first held-out rating (the cutoff): the user's
earlier ratings, and for popularity and MF every user's ratings before that moment (MF is trained per
user at the cutoff).

Methods: ``random`` (chance is a / (a + b)), ``popularity`` (most rated before the cutoff),
``embedding`` (cosine of each candidate's text to the mean embedding of the user's watched movies,
all-MiniLM-L6-v2 offline), ``mf`` (ALS, implicit), and ``agent`` (the sandbox's LLM, asked with its
profile and its last watched titles for a structured list of a numbers; an unusable answer is filled
at random and counted).

    python -m eval.discrimination --config configs/sandbox/movielens.yaml --out runs/discrimination \\
        --users 100 --methods random popularity embedding mf agent

Writes OUT/results.json (per setting and method: p, interval, users, fallbacks) and OUT/table.md.
"""

from __future__ import annotations

import argparse
import bisect
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agents.retrieval import top_indices
from eval.metrics import bca_interval

SETTINGS = ((1, 5), (3, 3), (3, 7), (1, 9))
PAPER = {  # the paper's Table 3 (20 MovieLens-1M users, ChatGPT), for reference
    "Embedding (paper)": (0.25, 0.55, 0.45, 0.30),
    "RecSim (paper)": (0.25, 0.53, 0.37, 0.10),
    "RecAgent (paper)": (0.55, 0.78, 0.68, 0.50),
    "real humans (paper)": (0.60, 0.81, 0.72, 0.58),
}


def make_cases(data, users: list[int], a: int, b: int, rng: np.random.Generator, skipped=None) -> list[dict]:
    """One case per user; a user with fewer than b possible distractors before the cutoff is left
    out and listed in ``skipped`` (reported in results.json)."""
    by_user = data.by_user()
    first_rated: dict[int, int] = {}
    for r in data.ratings:  # time order: the first rating of each movie
        first_rated.setdefault(r.movie, r.ts)
    cases = []
    for user in users:
        ratings = by_user[user]  # time order, ties by movie id
        held = [r.movie for r in ratings[-a:]]
        cutoff = ratings[-a].ts
        rated = {r.movie for r in ratings}
        # distractors: movies the user never rated that someone had rated before the cutoff (a film
        # released later would give itself away)
        unseen = [m for m in sorted(first_rated) if m not in rated and first_rated[m] < cutoff]
        if len(unseen) < b:
            if skipped is not None:
                skipped.append(user)
            continue
        distractors = [unseen[i] for i in rng.choice(len(unseen), size=b, replace=False)]
        candidates = [*held, *distractors]
        order = rng.permutation(len(candidates))
        cases.append(
            {
                "user": user,
                "cutoff": cutoff,
                "history": [r.movie for r in ratings[:-a] if r.ts < cutoff],  # strictly older
                "held": held,
                "candidates": [candidates[i] for i in order],
            }
        )
    return cases


def pick_random(cases, a, rng, **_):
    return [
        [c["candidates"][i] for i in rng.choice(len(c["candidates"]), size=a, replace=False)] for c in cases
    ]


def pick_popularity(cases, a, data, **_):
    times = defaultdict(list)
    for r in data.ratings:
        times[r.movie].append(r.ts)  # already in time order
    picks = []
    for case in cases:
        count = {m: bisect.bisect_left(times[m], case["cutoff"]) for m in case["candidates"]}
        picks.append(sorted(case["candidates"], key=lambda m: (-count[m], m))[:a])
    return picks


def pick_embedding(cases, a, data, encoder, **_):
    picks = []
    for case in cases:
        texts = [data.movies[m].text() for m in case["history"]] + [
            data.movies[m].text() for m in case["candidates"]
        ]
        vectors = np.asarray(encoder(texts), dtype=float)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        profile = vectors[: len(case["history"])].mean(axis=0)
        scores = vectors[len(case["history"]) :] @ profile
        picks.append([case["candidates"][i] for i in top_indices(scores, a)])
    return picks


def pick_mf(cases, a, data, config, rng, cache=None, **_):
    """ALS trained per user on every rating older than that user's cutoff (nothing later)."""
    from agents.sandbox.recommender import MFRecommender

    picks = []
    for case in tqdm(cases, desc="mf per user", leave=False):
        key = (case["user"], case["cutoff"])  # settings with the same a share their training
        if cache is None or key not in cache:
            clicks = [(r.user, r.movie) for r in data.ratings if r.ts < case["cutoff"]]
            mf = MFRecommender(list(data.movies), rng, config.recommender)
            mf.fit(clicks)
            cache = {} if cache is None else cache
            cache[key] = (mf.scores(case["user"]), mf.item_index)
        scores, index = cache[key]
        if scores is None:  # no rating before the cutoff: popularity
            picks.append(pick_popularity([case], a, data)[0])
            continue
        candidate = np.array([scores[index[m]] for m in case["candidates"]])
        picks.append([case["candidates"][i] for i in top_indices(candidate, a)])
    return picks


def pick_agent(cases, a, data, backend, rng, counts, history_titles: int = 10, **_):
    from agents.llm import Constraint, Sampling
    from agents.sandbox.prompts import frame

    size = len(cases[0]["candidates"])
    schema = Constraint.json_object(
        items={
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": size},
            "minItems": a,
            "maxItems": a,
        }
    )
    prompts = []
    for case in cases:
        recent = [data.movies[m].title for m in case["history"][-history_titles:]]
        listing = "\n".join(
            f"{k}. {data.movies[m].text()}" for k, m in enumerate(case["candidates"], start=1)
        )
        prompts.append(
            frame(
                f"User {case['user']}, a movie watcher",
                [f"I watched {t}" for t in recent],
                f"Which {a} of these movies will you watch next? Give their numbers.",
                f"The movies:\n{listing}",
            )
        )
    answers = backend.generate(
        prompts, Sampling(max_new_tokens=32, seed=int(rng.integers(2**31 - 1))), schema
    )
    picks = []
    for case, answer in zip(cases, answers, strict=True):
        try:
            numbers = list(dict.fromkeys(json.loads(answer)["items"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            numbers = []
        valid = [n for n in numbers if isinstance(n, int) and 1 <= n <= size][:a]
        if len(valid) < a:  # filled at random, counted
            counts["agent_fallbacks"] += 1
            rest = [k for k in range(1, size + 1) if k not in valid]
            valid += [rest[i] for i in rng.choice(len(rest), size=a - len(valid), replace=False)]
        picks.append([case["candidates"][k - 1] for k in valid])
    return picks


METHODS = {
    "random": pick_random,
    "popularity": pick_popularity,
    "embedding": pick_embedding,
    "mf": pick_mf,
    "agent": pick_agent,
}


def score(cases, picks) -> dict:
    hits = np.array(
        [len(set(c["held"]) & set(p)) / len(c["held"]) for c, p in zip(cases, picks, strict=True)]
    )
    mean = float(hits.mean())
    low, high, _ = bca_interval(hits)
    return {"p": round(mean, 4), "ci95": [round(low, 4), round(high, 4)], "users": len(hits)}


def run(config, out: Path, n_users: int, methods: list[str], backend=None, encoder=None) -> dict:
    from collections import Counter

    from data_prep import movielens

    data = movielens.load(config.data)
    rng = np.random.default_rng(config.seed)
    users = sorted(int(u) for u in rng.choice(sorted(data.by_user()), size=n_users, replace=False))
    if "embedding" in methods and encoder is None:
        from eval.backends import packaged_minilm

        encoder = packaged_minilm("cpu", 64)
    if "agent" in methods and backend is None:
        from agents.llm import load_llm

        backend = load_llm(config.llm)
    results = {"users": users, "seed": config.seed, "settings": {}}
    mf_cache: dict = {}
    for a, b in SETTINGS:
        # each setting and method its own generator from the seed: the cases and every method's draws
        # do not depend on which other methods ran
        skipped: list[int] = []
        cases = make_cases(data, users, a, b, np.random.default_rng([config.seed, a, b]), skipped)
        row = {"chance": round(a / (a + b), 4), "users_without_enough_distractors": skipped}
        for method in methods:
            counts = Counter()
            method_rng = np.random.default_rng([config.seed, a, b, list(METHODS).index(method)])
            picks = METHODS[method](
                cases, a, data=data, rng=method_rng, encoder=encoder, backend=backend, config=config,
                counts=counts, cache=mf_cache,
            )  # fmt: skip
            row[method] = {**score(cases, picks), **dict(counts)}
            print(f"a={a} b={b} {method}: p={row[method]['p']} {row[method]['ci95']}")
        results["settings"][f"{a},{b}"] = row
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(table(results, methods))
    print(table(results, methods))
    return results


def table(results: dict, methods: list[str]) -> str:
    keys = [f"{a},{b}" for a, b in SETTINGS]
    scored = results["settings"][keys[0]][methods[0]]["users"] if methods else 0
    left_out = len(results["settings"][keys[0]]["users_without_enough_distractors"])
    lines = [
        f"| method ({scored} users, {left_out} left out) | "
        + " | ".join(f"(a,b)=({k})" for k in keys)
        + " |",
        "|---|" + "---|" * len(keys),
        "| chance a/(a+b) | " + " | ".join(f"{results['settings'][k]['chance']:.2f}" for k in keys) + " |",
    ]
    for method in methods:
        cells = []
        for k in keys:
            r = results["settings"][k][method]
            cells.append(f"{r['p']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]")
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    for name, values in PAPER.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    from agents.sandbox.config import load_config

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--set", nargs="*", action="extend", default=[], help="config overrides")
    args = parser.parse_args(argv)
    run(load_config(args.config, args.set), args.out, args.users, args.methods)


if __name__ == "__main__":
    main()
