"""How the tuned-write agent chooses among the reviews its model wrote: a utility built from what the
agent may see, never from the ground truth.

Every candidate is a review the model wrote after the decided stars (its greedy answer and ``samples``
sampled ones). Each gets six features, higher is better:

- ``consensus``: mean cosine to the other candidates (minimum Bayes risk's agreement; 0 for a pool of one);
- ``user_topic`` / ``item_topic``: cosine to the centroid of the user's / the item's older reviews;
- ``sentiment``: -|VADER compound - the compound expected for the decided stars| / 2 (SentimentByStars);
- ``user_emotion`` / ``item_emotion``: -mean |emotion scores - the mean scores of the user's / item's
  older reviews| over the four labels (agents.emotion, on the first 300 characters, as the metric reads);
- ``user_length``: -|log((1 + words) / (1 + the median words of the user's older reviews))|.

Cosines are on unit all-MiniLM-L6-v2 embeddings, the agent's retrieval encoder. A feature the task
cannot have (no older review of the item) is 0 for every candidate, so it does not move the choice.
The utility is the weighted sum; the weights come from the agent's config or from a rule chosen on
validation tasks (eval.review.selection --utility). Ties go to the earlier candidate (the greedy answer first).

Two checks come before the utility: a candidate that copies an older review (``copied``) or repeats a
4-word span of its own (``loops``) is chosen only when every candidate is; both are kept with the pool
and counted. A copy is one definition, shared with eval.review.fidelity (``copies``): a text of 8 words or more
that shares an 8-word span with a known review, or a shorter text equal (case and spacing aside) to one.
The agent knows the older reviews of the user and the item for spans, and every review of the store
written before the task's moment for short texts ("Great gift card." is a copy when someone wrote it
before). eval.review.fidelity knows the whole store at any time, so it can count a copy the agent could not see.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from agents.retrieval import TIE
from agents.text import normalise, repeats_ngram, spans, words

FEATURES = (
    "consensus",
    "user_topic",
    "item_topic",
    "sentiment",
    "user_emotion",
    "item_emotion",
    "user_length",
)
COPY_WORDS = 8  # a candidate sharing this many consecutive words with an older review is a copy
LOOP_WORDS = 4  # a candidate repeating this many consecutive words of its own loops


def copied_spans(texts: Iterable[str], n: int = COPY_WORDS) -> set[tuple[str, ...]]:
    """Every n-word span of these texts (the older reviews a candidate must not copy)."""
    out: set[tuple[str, ...]] = set()
    for text in texts:
        out |= spans(words(text), n)
    return out


def short_texts(reviews: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Each (text, time) under COPY_WORDS words, normalised, with the earliest time it was written."""
    out: dict[str, int] = {}
    for text, ts in reviews:
        tokens = words(text)
        if 0 < len(tokens) < COPY_WORDS:  # an empty review is no text to copy
            key = normalise(" ".join(tokens))
            out[key] = min(ts, out.get(key, ts))
    return out


def copies(
    text: str,
    known: set[tuple[str, ...]],
    short: dict[str, int] | None = None,
    before: int | None = None,
) -> bool:
    """Whether ``text`` copies a review: an 8-word span in ``known`` (copied_spans), or, for a text under
    8 words, a review in ``short`` (short_texts) written before ``before`` (any time when None)."""
    tokens = words(text)
    if len(tokens) >= COPY_WORDS:
        return not spans(tokens, COPY_WORDS).isdisjoint(known)
    written = (short or {}).get(normalise(" ".join(tokens)))
    return written is not None and (before is None or written < before)


def loops(text: str) -> bool:
    return repeats_ngram(words(text), LOOP_WORDS)


def unit_mean(vectors: np.ndarray) -> np.ndarray | None:
    if not len(vectors):
        return None
    mean = np.asarray(vectors, np.float64).mean(axis=0)
    norm = np.linalg.norm(mean)
    return mean / norm if norm > 0 else None


def features(
    vectors: np.ndarray,
    compounds: np.ndarray,
    emotions: np.ndarray,
    target_compound: float,
    user_vectors: np.ndarray,
    item_vectors: np.ndarray,
    user_emotions: np.ndarray,
    item_emotions: np.ndarray,
    lengths: np.ndarray | None = None,
    user_lengths: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The features above for one pool: candidates' unit embeddings, VADER compounds, emotion scores
    and word counts; the older reviews' unit embeddings, emotion scores and the user's word counts
    (empty where there are none)."""
    n = len(vectors)
    out = {}
    if n > 1:
        similarity = vectors @ vectors.T
        out["consensus"] = (similarity.sum(axis=1) - np.diag(similarity)) / (n - 1)
    else:
        out["consensus"] = np.zeros(n)
    for name, older in (("user_topic", user_vectors), ("item_topic", item_vectors)):
        centre = unit_mean(older)
        out[name] = np.zeros(n) if centre is None else vectors @ centre
    out["sentiment"] = -np.abs(np.asarray(compounds, np.float64) - target_compound) / 2
    for name, older in (("user_emotion", user_emotions), ("item_emotion", item_emotions)):
        if not len(older):
            out[name] = np.zeros(n)
        else:
            out[name] = -np.abs(np.asarray(emotions) - np.asarray(older).mean(axis=0)).mean(axis=1)
    if lengths is None or user_lengths is None or not len(user_lengths):
        out["user_length"] = np.zeros(n)
    else:
        typical = 1.0 + float(np.median(user_lengths))
        out["user_length"] = -np.abs(np.log((1.0 + np.asarray(lengths, np.float64)) / typical))
    return {k: out[k] for k in FEATURES}


def utility(values: dict[str, list[float]] | dict[str, np.ndarray], weights: dict[str, float]) -> np.ndarray:
    unknown = set(weights) - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown utility features {sorted(unknown)}: the features are {FEATURES}")
    n = len(next(iter(values.values())))
    total = np.zeros(n)
    for name, weight in weights.items():
        total += weight * np.asarray(values[name], np.float64)
    return total


def choose(values: dict, weights: dict[str, float], eligible: list[bool]) -> int:
    """The candidate of highest utility among the eligible ones (all, when none is); the earlier one
    within agents.retrieval.TIE."""
    scores = utility(values, weights)
    rows = [i for i, ok in enumerate(eligible) if ok] or list(range(len(scores)))
    best = max(scores[i] for i in rows)
    return next(i for i in rows if scores[i] >= best - TIE)


def check_weights(weights: dict) -> dict[str, float]:
    if not isinstance(weights, dict) or not weights:
        raise ValueError(f"utility weights are a mapping of some of {FEATURES} to numbers >= 0")
    for name, weight in weights.items():
        if name not in FEATURES or not isinstance(weight, int | float) or weight < 0:
            raise ValueError(f"utility weight {name}: {weight!r}: the features are {FEATURES}, weights >= 0")
    return {k: float(v) for k, v in weights.items()}
