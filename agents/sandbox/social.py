"""Who acts and who knows whom: Pareto activity levels (drawn, or mapped from each user's real count
through the maximum-likelihood fit of alpha to every user's count) and the social graph (from a CSV of name pairs, or generated, with
optional homophily by interests). Every draw comes from the run's one generator."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np


def activity_levels(n: int, alpha: float, xmin: float, rng: np.random.Generator) -> np.ndarray:
    """Each agent's probability of acting in a round: Pareto(alpha, xmin) draws, capped at 1."""
    return np.minimum(1.0, xmin * (1 + rng.pareto(alpha, size=n)))


def levels_from_counts(
    counts: list[int], population: list[int], alpha: float, xmin: float
) -> tuple[dict, np.ndarray]:
    """Activity levels from real counts: the Pareto law fitted to the population's counts (``fit_pareto``)
    gives each count its quantile q, and the level is the same quantile of the activity law
    Pareto(alpha, xmin), capped at 1: xmin * (count / x_min) ** (alpha_counts / alpha). Returns the fit
    and the levels. A count below the fit's x_min (the smallest population count) is an error."""
    fit = fit_pareto(population)
    x = np.asarray(counts, dtype=float)
    if (x < fit["xmin"]).any():
        raise ValueError(f"a count of {x.min():g} is below the population's smallest, {fit['xmin']:g}")
    return fit, np.minimum(1.0, xmin * (x / fit["xmin"]) ** (fit["alpha"] / alpha))


def fit_pareto(counts: list[int] | np.ndarray) -> dict:
    """Maximum-likelihood alpha of a Pareto law with x_min = min(counts) (Hill's estimator), and the
    Kolmogorov-Smirnov distance of the data from the fitted law as the goodness-of-fit figure."""
    from scipy import stats

    x = np.asarray(counts, dtype=float)
    xmin = x.min()
    alpha = len(x) / np.log(x / xmin).sum()
    ks = stats.kstest(x, stats.pareto(b=alpha, scale=xmin).cdf)
    return {"alpha": float(alpha), "xmin": float(xmin), "n": len(x), "ks_statistic": float(ks.statistic)}


class GraphError(ValueError):
    pass


def load_edges(path: str | Path, names: list[str]) -> dict[str, set[str]]:
    """An undirected graph from a CSV with columns a,b (agent names); an edge to an unknown agent is an
    error naming the file and row."""
    graph = {name: set() for name in names}
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if not {"a", "b"} <= set(reader.fieldnames or []):
            raise GraphError(f"{path}: expected columns a,b (agent names)")
        for row_number, row in enumerate(reader, start=2):
            for end in (row["a"], row["b"]):
                if end not in graph:
                    raise GraphError(f"{path} row {row_number}: unknown agent {end!r}")
            if row["a"] != row["b"]:
                graph[row["a"]].add(row["b"])
                graph[row["b"]].add(row["a"])
    return graph


def generate_graph(
    names: list[str],
    interests: list[list[str]],
    mean_degree: float,
    homophily: float,
    rng: np.random.Generator,
) -> dict[str, set[str]]:
    """About n * mean_degree / 2 undirected edges; with homophily h, each edge joins agents sharing an
    interest with probability h (when such a pair exists), else any two agents."""
    graph = {name: set() for name in names}
    n = len(names)
    if n < 2:
        return graph
    shared = [(i, j) for i in range(n) for j in range(i + 1, n) if set(interests[i]) & set(interests[j])]
    target = min(int(round(n * mean_degree / 2)), n * (n - 1) // 2)
    attempts = 0
    while sum(map(len, graph.values())) // 2 < target and attempts < 100 * max(target, 1):
        attempts += 1
        if shared and rng.random() < homophily:
            i, j = shared[int(rng.integers(len(shared)))]
        else:
            i, j = (int(v) for v in rng.choice(n, size=2, replace=False))
        graph[names[i]].add(names[j])
        graph[names[j]].add(names[i])
    return graph
