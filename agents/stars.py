"""Calibrated star predictors, fitted on the reviews the store shows and chosen on a validation split
carved from them (each user's latest visible review), never on the evaluation tasks.

Candidates: the global mean; the user's mean shrunk towards the global mean (strength chosen); the
user's median; a regularised bias model mu + b_user + b_item (strength chosen); each also rounded to
whole stars (PE rewards it when ratings are integers); and, when the agent gives LLM stars for some
validation reviews, blends of the best model with them (raw and rounded). Every candidate's validation
PE is reported. Everything is numpy over rating columns (no review texts), so a store of millions of
reviews fits in seconds.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Rating = tuple[
    str, str, str, int, float
]  # review_id, user_id, item_id, ts, stars (ReviewStore.visible_ratings)


def pe(predicted: np.ndarray, truth: np.ndarray) -> float:
    return float(1 - np.mean(np.abs(np.clip(predicted, 0, 5) - truth)) / 5)


def split_visible(ratings: list[Rating]) -> tuple[list[Rating], list[Rating]]:
    """Train: all but each user's latest review; validation: that latest review (users with >= 2)."""
    if not ratings:
        raise ValueError("no visible reviews to fit a star model on")
    review, user, _, ts, _ = zip(*ratings, strict=True)
    order = np.lexsort((np.array(review), np.array(ts), np.array(user)))  # by user, then time
    users = np.array(user)[order]
    last = np.r_[users[1:] != users[:-1], True]  # the last row of each user
    first = np.r_[True, users[1:] != users[:-1]]
    held = last & ~first  # users with at least two reviews
    return [ratings[k] for k in order[~held]], [ratings[k] for k in order[held]]


class Tables:
    """Per-user and per-item statistics of a set of ratings; lookups by id (-1 = unseen)."""

    def __init__(self, ratings: list[Rating], lambdas: tuple[float, ...] = (1.0, 5.0, 20.0)):
        _, user, item, _, stars = zip(*ratings, strict=True)
        users, u = np.unique(np.array(user), return_inverse=True)
        items, i = np.unique(np.array(item), return_inverse=True)
        s = np.array(stars, dtype=np.float64)
        self.user_index = {k: n for n, k in enumerate(users.tolist())}
        self.item_index = {k: n for n, k in enumerate(items.tolist())}
        self.mu = float(s.mean())
        self.count_u = np.bincount(u, minlength=len(users)).astype(np.float64)
        self.sum_u = np.bincount(u, s, minlength=len(users))
        order = np.lexsort((s, u))  # each user's stars, sorted
        start = np.r_[0, np.cumsum(self.count_u)[:-1]].astype(int)
        count = self.count_u.astype(int)
        self.median_u = (s[order][start + (count - 1) // 2] + s[order][start + count // 2]) / 2
        self.bias = {lam: self._biases(u, i, s, lam) for lam in lambdas}

    def _biases(self, u, i, s, lam: float, iterations: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """mu + b_user + b_item with L2 strength lam, by alternating least squares."""
        count_i = np.bincount(i).astype(np.float64)
        bu, bi = np.zeros(len(self.count_u)), np.zeros(len(count_i))
        for _ in range(iterations):
            bu = np.bincount(u, s - self.mu - bi[i], minlength=len(bu)) / (self.count_u + lam)
            bi = np.bincount(i, s - self.mu - bu[u], minlength=len(bi)) / (count_i + lam)
        return bu, bi

    def indices(self, users: list[str], items: list[str]) -> tuple[np.ndarray, np.ndarray]:
        u = np.array([self.user_index.get(x, -1) for x in users], dtype=np.int64)
        i = np.array([self.item_index.get(x, -1) for x in items], dtype=np.int64)
        return u, i


Predictor = Callable[[np.ndarray, np.ndarray], np.ndarray]  # user and item indices -> stars


def candidates(t: Tables) -> dict[str, Predictor]:
    def per_user(values: np.ndarray) -> Predictor:
        return lambda u, i: np.where(u >= 0, values[u], t.mu)

    out: dict[str, Predictor] = {"global_mean": lambda u, i: np.full(len(u), t.mu)}
    for lam in (0.0, 1.0, 3.0, 10.0):
        out[f"user_mean_shrink{lam:g}"] = per_user((t.sum_u + lam * t.mu) / (t.count_u + lam))
    out["user_median"] = per_user(t.median_u)
    for lam, (bu, bi) in t.bias.items():
        out[f"bias_lambda{lam:g}"] = lambda u, i, bu=bu, bi=bi: (
            t.mu + np.where(u >= 0, bu[u], 0.0) + np.where(i >= 0, bi[i], 0.0)
        )
    for name in list(out):
        out[f"{name}_rounded"] = lambda u, i, base=out[name]: np.clip(np.rint(base(u, i)), 1, 5)
    return out


class StarModel:
    """Chooses a star predictor on validation, then refits it on all visible reviews."""

    def fit(self, ratings: list[Rating], llm_validation: dict[str, float] | None = None) -> StarModel:
        train, validation = split_visible(ratings)
        self.validation = validation
        truth = np.array([r[4] for r in validation])
        tables = Tables(train)
        u, i = tables.indices([r[1] for r in validation], [r[2] for r in validation])
        scores, predictions = {}, {}
        for name, predict in candidates(tables).items():
            predictions[name] = predict(u, i)
            scores[name] = pe(predictions[name], truth)
        best = chosen = max(scores, key=scores.get)
        self.blend_weight, self.blend_rounded = None, False
        if llm_validation:  # blends of the best model with the LLM's stars, where the LLM answered
            have = [k for k, r in enumerate(validation) if r[0] in llm_validation]
            llm = np.array([llm_validation[validation[k][0]] for k in have])
            reference = f"{best}_on_llm_subset"
            scores[reference] = pe(predictions[best][have], truth[have])
            blends = {}
            for w in (0.0, 0.25, 0.5, 0.75):  # w = weight of the model; 0 = the LLM's stars alone
                blended = w * predictions[best][have] + (1 - w) * llm
                for rounded in (False, True):
                    name = f"blend_{w:g}_{best}{'_rounded' if rounded else ''}"
                    scores[name] = pe(np.rint(blended) if rounded else blended, truth[have])
                    blends[name] = (w, rounded)
            blend = max(blends, key=scores.get)
            if scores[blend] > scores[reference]:
                self.blend_weight, self.blend_rounded = blends[blend]
                chosen = blend
        self.report = {
            "validation_reviews": len(validation),
            "train_reviews": len(train),
            "candidates_pe": {k: round(v, 4) for k, v in sorted(scores.items(), key=lambda kv: -kv[1])},
            "chosen": chosen,
            "blend_weight_on_model": self.blend_weight,
            "llm_validation_stars": len(llm_validation) if llm_validation else 0,
        }
        self.name = chosen
        self.tables = Tables(ratings)  # refit on everything visible
        self.predict_fn = candidates(self.tables)[best]
        return self

    def predict(self, user: str, item: str, llm_stars: float | None = None) -> float:
        value = float(self.predict_fn(*self.tables.indices([user], [item]))[0])
        if self.blend_weight is not None and llm_stars is not None:
            value = self.blend_weight * value + (1 - self.blend_weight) * llm_stars
            value = np.rint(value) if self.blend_rounded else value
        return float(np.clip(value, 1, 5))
