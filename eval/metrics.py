"""The AgentSociety Challenge user-modelling metrics, as pure functions over aligned arrays.

Per task, prediction (stars', text') against ground truth (stars, text):

- star error       |clip(stars', 0, 5) - stars| / 5;            PE = 1 - mean star error
- sentiment error  |c(text') - c(text)| / 2, c = VADER compound
- emotion error    mean over the 4 labels of |p - q|, p and q the emotion classifier's label scores on
                   the first 300 characters of each text (labels matched by name)
- topic error      (1 - cos(e(text'), e(text))) / 2, e = sentence embedding, not normalised first
- RG = 1 - (0.25 * sentiment + 0.25 * emotion + 0.5 * topic), each term averaged over tasks
- overall = (PE + RG) / 2

This follows the official ``websocietysimulator/tools/evaluation_tool.py``; it differs only in never
truncating mismatched lists (callers align predictions to tasks first, see eval/review/predictions.py).
"""

from __future__ import annotations

import numpy as np

from agents.emotion import EMOTION_CHARS, EMOTION_LABELS  # noqa: F401 (the official classifier's)

STAR_RANGE = (0.0, 5.0)


def clip_stars(stars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Stars clipped to [0, 5] as the official evaluator does, and which ones were outside."""
    stars = np.asarray(stars, dtype=np.float64)
    outside = (stars < STAR_RANGE[0]) | (stars > STAR_RANGE[1])
    return np.clip(stars, *STAR_RANGE), outside


def star_errors(predicted: np.ndarray, truth: np.ndarray) -> np.ndarray:
    clipped, _ = clip_stars(predicted)
    return np.abs(clipped - np.asarray(truth, dtype=np.float64)) / 5


def sentiment_errors(predicted: np.ndarray, truth: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(predicted, np.float64) - np.asarray(truth, np.float64)) / 2


def emotion_errors(predicted: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """predicted, truth: (n, 4) label scores in EMOTION_LABELS order."""
    return np.mean(np.abs(np.asarray(predicted, np.float64) - np.asarray(truth, np.float64)), axis=1)


def topic_errors(predicted: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """(1 - cosine similarity) / 2 row by row, in float64; a zero vector is an error, not a NaN."""
    a, b = np.asarray(predicted, np.float64), np.asarray(truth, np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    if np.any(norms == 0):
        raise ValueError("topic: an embedding is all zeros, its cosine is undefined")
    cosine = np.einsum("ij,ij->i", a, b) / norms
    return np.clip(1.0 - cosine, 0.0, 2.0) / 2


def cut_for_emotion(texts: list[str]) -> list[str]:
    return [t[:EMOTION_CHARS] for t in texts]


def aggregate(star: np.ndarray, sentiment: np.ndarray, emotion: np.ndarray, topic: np.ndarray) -> dict:
    """The headline numbers from per-task terms (all arrays of one length n > 0)."""
    n = len(star)
    if not n or not len(sentiment) == len(emotion) == len(topic) == n:
        raise ValueError("aggregate needs per-task terms of one non-zero length")
    pe = 1 - float(np.mean(star))
    sent, emo, top = float(np.mean(sentiment)), float(np.mean(emotion)), float(np.mean(topic))
    rg = 1 - (0.25 * sent + 0.25 * emo + 0.5 * top)
    return {
        "n": n,
        "preference_estimation": pe,
        "review_generation": rg,
        "overall": (pe + rg) / 2,
        "star_error": float(np.mean(star)),
        "sentiment_error": sent,
        "emotion_error": emo,
        "topic_error": top,
    }


def per_task_scores(terms: dict[str, np.ndarray], metric: str) -> np.ndarray:
    """Each task's contribution to a headline metric: the metric is the mean of these (all three are
    linear in the per-task terms), which is what makes a per-task paired comparison exact."""
    pe = 1 - np.asarray(terms["star"], np.float64)
    rg = 1 - (
        0.25 * np.asarray(terms["sentiment"], np.float64)
        + 0.25 * np.asarray(terms["emotion"], np.float64)
        + 0.5 * np.asarray(terms["topic"], np.float64)
    )
    per_task = {"preference_estimation": pe, "review_generation": rg, "overall": (pe + rg) / 2}
    if metric not in per_task:
        raise ValueError(f"unknown metric {metric!r}: one of {sorted(per_task)}")
    return per_task[metric]


def bca_interval(
    values, resamples: int | None = None, seed: int = 0, confidence: float = 0.95
) -> tuple[float, float, float]:
    """The BCa bootstrap interval (95% unless ``confidence`` says otherwise: a Bonferroni-corrected
    family) of the mean of ``values`` (scipy.stats.bootstrap) and the share of resamples whose mean is
    above zero. Resamples: 2,000, or enough for 50 beyond each tail of a stricter interval. When every resample has the same mean (fewer than 2 values, or all equal) the interval
    is that mean and the share 0 or 1."""
    from scipy.stats import bootstrap

    if resamples is None:
        resamples = max(2000, int(np.ceil(100 / (1 - confidence))))
    values = np.asarray(values, dtype=float)
    mean = float(values.mean())
    if len(values) < 2 or np.ptp(values) == 0:
        return mean, mean, float(mean > 0)
    result = bootstrap(
        (values,), np.mean, n_resamples=resamples, confidence_level=confidence, method="BCa", rng=seed
    )
    low, high = result.confidence_interval
    return float(low), float(high), float(np.mean(result.bootstrap_distribution > 0))


def paired_bootstrap(
    a: dict[str, np.ndarray], b: dict[str, np.ndarray], metric: str, resamples: int = 2000, seed: int = 0
) -> dict:
    """metric(a) - metric(b) on the same tasks, with a 95% paired BCa bootstrap interval over tasks
    (scipy.stats.bootstrap on the per-task differences).

    a, b: per-task terms ("star", "sentiment", "emotion", "topic"), row k of both being the same task.
    """
    if len(a["star"]) != len(b["star"]):
        raise ValueError("paired_bootstrap needs the same tasks on both sides")
    diff = per_task_scores(a, metric) - per_task_scores(b, metric)
    n, mean = len(diff), float(np.mean(diff))
    low, high, share = bca_interval(diff, resamples, seed)
    return {
        "metric": metric,
        "difference": mean,
        "ci95": [float(low), float(high)],
        "method": "paired BCa bootstrap over tasks (scipy.stats.bootstrap)",
        "resamples": resamples,
        "share_of_resamples_above_zero": share,
        "n": n,
    }


def paired_claim(a, b, confidence: float = 0.95) -> dict:
    """One paired claim "a > b" over the same units (users, tasks): the mean difference with its BCa
    interval at ``confidence`` (a Bonferroni level when the caller makes several claims), the share of
    resamples above zero, and the number of units. The record every test of the simulators reports."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    low, high, share = bca_interval(diff, confidence=confidence)
    return {
        "difference": round(float(diff.mean()), 4),
        "ci": [round(low, 4), round(high, 4)],
        "confidence": round(confidence, 5),
        "resamples_above_zero": round(share, 4),
        "users": len(diff),
    }


def claims_lines(
    claims: list[dict],
    columns: dict | None = None,
    title: str = "claim",
    after: dict | None = None,
    digits: int = 3,
    interval: str | None = None,
) -> list[str]:
    """One markdown table of ``paired_claim`` records, each with its "claim" name: a blank line, the header
    and a row per claim (none without claims). ``title`` heads the name's column. ``columns`` adds cells
    after the name, ``after`` at the end of the row: header -> a function of the record giving the cell.
    ``digits``: decimals of the difference and its interval. ``interval`` heads the interval's column;
    by default it names the records' Bonferroni level over the table's claims."""
    if not claims:
        return []
    columns, after = columns or {}, after or {}
    confidence = claims[0]["confidence"]
    header = [
        title,
        *columns,
        "difference",
        interval or f"{confidence:.2%} CI (paired BCa, Bonferroni over {len(claims)})",
        "resamples > 0",
        *after,
    ]
    lines = ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in claims:
        low, high = c["ci"]
        cells = [c["claim"], *(cell(c) for cell in columns.values()), f"{c['difference']:+.{digits}f}"]
        cells += [f"[{low:+.{digits}f}, {high:+.{digits}f}]", f"{c['resamples_above_zero']:.1%}"]
        cells += [cell(c) for cell in after.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return lines
