"""Calibrated star predictors, fitted on the reviews the store shows and chosen on a validation split
carved from them (each user's latest visible review), never on the evaluation tasks.

Candidates: the global mean; the user's mean shrunk towards the global mean (strength chosen); the
user's median; a regularised bias model mu + b_user + b_item (strength chosen); each also rounded to
whole stars (PE rewards it when ratings are integers); and, when the agent gives LLM stars for the
validation reviews, blends of the best model with them. Every candidate's validation PE is reported.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import numpy as np


def pe(predicted: np.ndarray, truth: np.ndarray) -> float:
    return float(1 - np.mean(np.abs(np.clip(predicted, 0, 5) - truth)) / 5)


def split_visible(reviews: list[dict]) -> tuple[list[dict], list[dict]]:
    """Train: all but each user's latest review; validation: that latest review (users with >= 2)."""
    by_user: dict[str, list[dict]] = defaultdict(list)
    for r in reviews:
        by_user[r["user_id"]].append(r)
    train, validation = [], []
    for rows in by_user.values():
        rows.sort(key=lambda r: (r["date"], r["review_id"]))
        if len(rows) >= 2:
            validation.append(rows[-1])
            rows = rows[:-1]
        train.extend(rows)
    return train, validation


class BiasModel:
    """mu + b_user + b_item with L2 strength lam, by alternating least squares."""

    def __init__(self, lam: float, iterations: int = 10):
        self.lam, self.iterations = lam, iterations

    def fit(self, rows: list[dict]) -> BiasModel:
        self.mu = float(np.mean([r["stars"] for r in rows]))
        self.bu: dict[str, float] = defaultdict(float)
        self.bi: dict[str, float] = defaultdict(float)
        by_user, by_item = defaultdict(list), defaultdict(list)
        for r in rows:
            by_user[r["user_id"]].append(r)
            by_item[r["item_id"]].append(r)
        for _ in range(self.iterations):
            for u, rs in by_user.items():
                self.bu[u] = sum(r["stars"] - self.mu - self.bi[r["item_id"]] for r in rs) / (
                    len(rs) + self.lam
                )
            for i, rs in by_item.items():
                self.bi[i] = sum(r["stars"] - self.mu - self.bu[r["user_id"]] for r in rs) / (
                    len(rs) + self.lam
                )
        return self

    def predict(self, user: str, item: str) -> float:
        return self.mu + self.bu.get(user, 0.0) + self.bi.get(item, 0.0)


def _user_stats(rows: list[dict]):
    stars = defaultdict(list)
    for r in rows:
        stars[r["user_id"]].append(r["stars"])
    return stars


def candidates(train: list[dict]) -> dict[str, Callable[[str, str], float]]:
    mu = float(np.mean([r["stars"] for r in train]))
    stars = _user_stats(train)
    out: dict[str, Callable[[str, str], float]] = {"global_mean": lambda u, i: mu}
    for lam in (0.0, 1.0, 3.0, 10.0):
        out[f"user_mean_shrink{lam:g}"] = lambda u, i, lam=lam: (
            (sum(stars[u]) + lam * mu) / (len(stars[u]) + lam) if stars[u] or lam else mu
        )
    out["user_median"] = lambda u, i: float(np.median(stars[u])) if stars[u] else mu
    for lam in (1.0, 5.0, 20.0):
        model = BiasModel(lam).fit(train)
        out[f"bias_lambda{lam:g}"] = model.predict
    for name in list(out):
        base = out[name]
        out[f"{name}_rounded"] = lambda u, i, base=base: float(np.clip(np.rint(base(u, i)), 1, 5))
    return out


class StarModel:
    """Chooses a star predictor on validation, then refits it on all visible reviews."""

    def fit(self, visible: list[dict], llm_validation: dict[str, float] | None = None) -> StarModel:
        train, validation = split_visible(visible)
        self.validation = validation
        truth = np.array([r["stars"] for r in validation])
        scores, predictions = {}, {}
        for name, predict in candidates(train).items():
            predictions[name] = np.array([predict(r["user_id"], r["item_id"]) for r in validation])
            scores[name] = pe(predictions[name], truth)
        best = chosen = max(scores, key=scores.get)
        self.blend_weight, self.blend_rounded = None, False
        if llm_validation:  # blends of the best model with the LLM's stars, where the LLM answered
            have = [k for k, r in enumerate(validation) if r["review_id"] in llm_validation]
            llm = np.array([llm_validation[validation[k]["review_id"]] for k in have])
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
        self.predict_fn = candidates(train + validation)[best]  # refit on everything visible
        return self

    def predict(self, user: str, item: str, llm_stars: float | None = None) -> float:
        value = self.predict_fn(user, item)
        if self.blend_weight is not None and llm_stars is not None:
            value = self.blend_weight * value + (1 - self.blend_weight) * llm_stars
            value = np.rint(value) if self.blend_rounded else value
        return float(np.clip(value, 1, 5))
