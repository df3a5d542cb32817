"""Score aligned (prediction, ground truth) lists with a set of scorers: batched, each distinct text
embedded once, every per-task term kept.

Model outputs per text can be kept in a ``ScoreCache`` (one SQLite file, keyed by the exact scorer and
the text's sha256): evaluating several runs against the same ground truth then encodes it only once.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import numpy as np

from eval.backends import Scorers
from eval.metrics import (
    EMOTION_LABELS,
    aggregate,
    clip_stars,
    cut_for_emotion,
    emotion_errors,
    sentiment_errors,
    star_errors,
    topic_errors,
)


class ScoreCache:
    """text -> model output (a float64 vector), per scorer identity, on disk."""

    def __init__(self, path: Path):
        self.conn = sqlite3.connect(path, timeout=60)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS outputs (scorer TEXT, text_sha TEXT, value BLOB, PRIMARY KEY (scorer, text_sha))"
        )
        self.hits = self.misses = 0

    @staticmethod
    def scorer_key(info: dict) -> str:
        return hashlib.sha256(json.dumps(info, sort_keys=True).encode()).hexdigest()[:32]

    def get(self, scorer: str, shas: list[str]) -> dict[str, np.ndarray]:
        found = {}
        for start in range(0, len(shas), 500):
            part = shas[start : start + 500]
            rows = self.conn.execute(
                f"SELECT text_sha, value FROM outputs WHERE scorer = ? AND text_sha IN ({','.join('?' * len(part))})",
                (scorer, *part),
            )
            found.update((sha, np.frombuffer(value, dtype=np.float64)) for sha, value in rows)
        return found

    def put(self, scorer: str, values: dict[str, np.ndarray]) -> None:
        with self.conn:
            self.conn.executemany(
                "INSERT OR REPLACE INTO outputs VALUES (?, ?, ?)",
                ((scorer, sha, np.asarray(v, np.float64).tobytes()) for sha, v in values.items()),
            )


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _unique_apply(
    fn, texts: list[str], cache: ScoreCache | None = None, info: dict | None = None
) -> np.ndarray:
    """fn over the distinct texts not already cached, rows put back in the order of ``texts``."""
    unique = list(dict.fromkeys(texts))
    shas = [_sha(t) for t in unique]
    key = ScoreCache.scorer_key(info) if cache is not None else ""
    known = cache.get(key, shas) if cache is not None else {}
    todo = [t for t, sha in zip(unique, shas, strict=True) if sha not in known]
    if todo:
        computed = np.asarray(fn(todo), dtype=np.float64)
        new = {_sha(t): row for t, row in zip(todo, computed.reshape(len(todo), -1), strict=True)}
        if cache is not None:
            cache.put(key, new)
        known = {**known, **new}
    if cache is not None:
        cache.hits += len(unique) - len(todo)
        cache.misses += len(todo)
    out = np.stack([np.atleast_1d(known[sha]) for sha in shas])
    position = {t: i for i, t in enumerate(unique)}
    rows = out[[position[t] for t in texts]]
    return rows[:, 0] if rows.shape[1] == 1 else rows


def score_pairs(
    pred_stars: list[float],
    pred_texts: list[str],
    true_stars: list[float],
    true_texts: list[str],
    scorers: Scorers,
    cache: ScoreCache | None = None,
) -> dict[str, np.ndarray]:
    """Per-task terms and the raw model outputs behind them, for lists of one length."""
    n = len(pred_stars)
    if not n or not len(pred_texts) == len(true_stars) == len(true_texts) == n:
        raise ValueError("score_pairs needs four lists of one non-zero length")
    texts = list(pred_texts) + list(true_texts)
    cut = cut_for_emotion(texts)

    compound = _unique_apply(scorers.sentiment, texts, cache, scorers.sentiment.info)
    standin = getattr(scorers.emotion, "encoder", None) is scorers.topic
    if standin:  # one embedding pass serves topic (full texts) and the emotion stand-in (cut texts)
        embedded = _unique_apply(scorers.topic, texts + cut, cache, scorers.topic.info)
        embeddings, emotions = embedded[: 2 * n], scorers.emotion.probabilities(embedded[2 * n :])
    else:
        embeddings = _unique_apply(scorers.topic, texts, cache, scorers.topic.info)
        emotions = _unique_apply(scorers.emotion, cut, cache, scorers.emotion.info)

    clipped, outside = clip_stars(pred_stars)
    return {
        "star_error": star_errors(pred_stars, true_stars),
        "sentiment_error": sentiment_errors(compound[:n], compound[n:]),
        "emotion_error": emotion_errors(emotions[:n], emotions[n:]),
        "topic_error": topic_errors(embeddings[:n], embeddings[n:]),
        "stars_clipped": clipped,
        "stars_out_of_range": outside,
        "sentiment_pred": compound[:n],
        "sentiment_true": compound[n:],
        "emotion_pred": emotions[:n],
        "emotion_true": emotions[n:],
    }


def summarise(terms: dict[str, np.ndarray], mask: np.ndarray | None = None) -> dict:
    mask = np.ones(len(terms["star_error"]), bool) if mask is None else mask
    return aggregate(
        *(terms[k][mask] for k in ("star_error", "sentiment_error", "emotion_error", "topic_error"))
    )


def emotion_dict(row: np.ndarray) -> dict[str, float]:
    return {label: round(float(v), 6) for label, v in zip(EMOTION_LABELS, row, strict=True)}
