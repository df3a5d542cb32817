"""Sandbox figures a person can rerun.

    python -m bench.sandbox_bench pareto   # the activity law fitted to MovieLens per-user rating counts

``pareto``: alpha of a Pareto law fitted by maximum likelihood (x_min = the smallest count) to the
number of ratings per user, with the Kolmogorov-Smirnov distance of the data from the fitted law, and
the same for the counts above a few larger x_min (the tail is where a power law is usually judged).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter

import numpy as np

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("pareto")
    fit.add_argument("--data", default="../shared/data/raw/movielens_latest_small")
    args = parser.parse_args(argv)
    pareto(args)


if __name__ == "__main__":
    main()
