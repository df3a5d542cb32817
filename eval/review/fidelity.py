"""How the simulated population compares with the real one, beside the official metric: a method that
raises the metric by writing generic, metric-shaped text (or by copying) shows it here.

- ``star_wasserstein``: Wasserstein-1 distance between the predicted (clipped to [0, 5]) and the real
  star distributions; 0 when the histograms match.
- ``length_ks``: the two-sample Kolmogorov-Smirnov statistic between predicted and real review lengths
  in words (and its p-value), with the mean lengths.
- ``distinct_1`` / ``distinct_2``: unique uni- and bigrams over all uni- and bigrams of the predictions
  (the same for the real reviews, ``real_distinct_*``); a collapsed population scores low.
- ``vocabulary_overlap``: |words used by both| / |words used by either| (Jaccard of the vocabularies).
- ``repeated_share``: predictions whose text (whitespace-normalised, case-folded) equals another
  prediction's.
- ``looping_share``: predictions that repeat a 4-word span of their own (a text stuck in a loop), beside
  the same share of the real reviews (``real_looping_share``).
- ``copied_share``: predictions that copy a review of the store (agents.review.write.copies: an 8-word
  span shared, or a prediction under 8 words equal to a review; only with a store: the reviews it shows,
  task pairs blocked, of any time); None without one.

Words are ``\\w+`` runs, lower-cased.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import numpy as np
from scipy.stats import ks_2samp, wasserstein_distance

from agents.review.write import copied_spans, copies, short_texts
from agents.text import distinct, normalise, repeats_ngram, spans, words  # noqa: F401 (re-exported)


def fidelity(
    pred_stars: Iterable[float],
    pred_texts: list[str],
    true_stars: Iterable[float],
    true_texts: list[str],
    store_texts: Iterable[str] | None = None,
) -> dict:
    """The figures above for one run. ``store_texts``: every review text a prediction could have copied."""
    pred_words, true_words = [words(t) for t in pred_texts], [words(t) for t in true_texts]
    pred_len = np.array([len(w) for w in pred_words])
    true_len = np.array([len(w) for w in true_words])
    ks = ks_2samp(pred_len, true_len)
    vocab_pred = {w for ws in pred_words for w in ws}
    vocab_true = {w for ws in true_words for w in ws}
    union = vocab_pred | vocab_true
    seen = Counter(normalise(t) for t in pred_texts)
    out = {
        "star_wasserstein": round(
            float(wasserstein_distance(np.clip(list(pred_stars), 0, 5), list(true_stars))), 4
        ),
        "length_ks": round(float(ks.statistic), 4),
        "length_ks_p": float(ks.pvalue),
        "mean_words": round(float(pred_len.mean()), 1),
        "real_mean_words": round(float(true_len.mean()), 1),
        "distinct_1": round(distinct(pred_words, 1), 4),
        "distinct_2": round(distinct(pred_words, 2), 4),
        "real_distinct_1": round(distinct(true_words, 1), 4),
        "real_distinct_2": round(distinct(true_words, 2), 4),
        "vocabulary_overlap": round(len(vocab_pred & vocab_true) / len(union), 4) if union else 0.0,
        "repeated_share": round(sum(seen[normalise(t)] > 1 for t in pred_texts) / len(pred_texts), 4),
        "copied_share": None,
    }
    out["looping_share"] = round(float(np.mean([repeats_ngram(w, 4) for w in pred_words])), 4)
    out["real_looping_share"] = round(float(np.mean([repeats_ngram(w, 4) for w in true_words])), 4)
    if store_texts is not None:
        store_texts = list(store_texts)
        stored, short = copied_spans(store_texts), short_texts((t, 0) for t in store_texts)
        copied = [copies(t, stored, short) for t in pred_texts]
        out["copied_share"] = round(sum(copied) / len(pred_texts), 4)
    return out
