"""Calibrated star predictors that see only the past, chosen on validation reviews that are also past.

Every prediction is made *as of a moment t* and uses only ratings strictly older than t (the store's
block set already hides the task pairs). Under the official AgentSociety visibility, t is "after
everything" for the tasks: every visible rating counts.

Candidates, each clipped to the rating scale (1-5 by default; MovieLens's is 0.5-5) as delivered and also
rounded to whole stars (PE rewards it when ratings are integers):

- ``global_mean``: mu(t), the mean of all ratings before t;
- ``user_mean_shrinkL``: the user's mean before t shrunk towards mu(t) with strength L;
- ``user_median``: the median of the user's ratings before t (each counted on the half-star grid of the
  scale, which is exact for every platform here; the candidate set never depends on the data);
- ``bias_lambdaL``: mu(t) + b_user(t) + b_item(t), Koren's decoupled baseline: b_item(t) =
  sum(r - mu(t)) / (n + L) over the item's ratings before t; b_user(t) = sum(e) / (n + L) over the
  user's ratings before t, where e = r - mu(t_r) - b_item(t_r) is each rating's residual against the
  item's bias at that rating's own time.

All of these are time-ordered cumulative sums, so "as of t" is one binary search per statistic: a batch
of tasks at different moments costs microseconds each, and the whole model over millions of ratings is
built in seconds (bench/README.md).

**Validation, without the future, per group.** Every visible review whose user has an older visible
review is a validation row, predicted at its own time exactly as a task would be. Rows fall in two
groups, as tasks do: a *new item* (no rating of the item older than the row) and an *item with
history*; each group has its own choice, so the choice for a task about a new item is made on rows
about new items, whatever mix of the two the validation has. The user's median (``BASELINE``, what
the nearest-centroid baseline predicts) is kept unless another candidate beats it on the group's
validation rows strictly older than the task by a paired margin: the one with the lowest mean error
among those whose paired gain over the median has a one-sided lower bound above zero (normal
approximation, Bonferroni over the other 17 candidates, ``STAR_Z``); with fewer than
``min_validation`` such rows, the median. So adding reviews after t (a flood of later 1-star reviews)
changes nothing that a prediction at t uses, and a lower mean error on a handful of rows is not enough.

**The LLM's expected stars, calibrated.** Where the LLM's stars are an expected value over the five
digits (agents.llm.option_probs), they are mapped to the scale by an isotonic fit before they blend: for a
prediction at t, fitted on the LLM-answered validation reviews strictly older than t (at least
``min_calibration`` of them; with fewer, the LLM's stars are not used there and the count says so). A
validation review's own calibrated value comes from the reviews older than it, so the blends compete on
values calibrated without their own truth.

"""

from __future__ import annotations

from bisect import bisect_left

import numpy as np
from scipy.stats import norm

Rating = tuple[
    str, str, str, int, float
]  # review_id, user_id, item_id, ts, stars (ReviewStore.visible_ratings)

USER_SHRINK = (0.0, 1.0, 3.0, 10.0)
BIAS_STRENGTH = (1.0, 5.0, 20.0)
BLEND_WEIGHTS = (0.0, 0.25, 0.5, 0.75)  # weight of the model; 0 = the LLM's stars alone
BASELINE = "user_median"  # kept unless a candidate beats it by a paired margin on validation
# whether the item has a rating the prediction may see (time-aware: an older one, as eval.review counts
# new items; official visibility: any rating but the task pair's, so later ones count too)
GROUPS = ("new_item", "item_with_history")
EMPTY_PRIOR = 3.0  # mu before the first rating of the store
SCALE = (1.0, 5.0)  # the review platforms' stars; MovieLens (the sandbox) rates 0.5-5
CANDIDATES = 2 * (2 + len(USER_SHRINK) + len(BIAS_STRENGTH))  # History.candidates, raw and rounded
STAR_Z = float(norm.isf(0.05 / (CANDIDATES - 1)))  # one-sided 95%, Bonferroni over the non-baseline ones
BLENDS = 2 * len(BLEND_WEIGHTS)  # each weight raw and rounded
BLEND_Z = float(norm.isf(0.05 / BLENDS))  # one-sided 95%, Bonferroni over the blends


def errors(predicted: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """The official star error |clip(p, 0, 5) - s| / 5."""
    return np.abs(np.clip(predicted, 0, 5) - truth) / 5


class Segments:
    """Ratings grouped by a key (user or item), each group in time order, with prefix sums: how many of
    a key's ratings are strictly older than t, and the sum of any column over them, is one binary
    search."""

    def __init__(self, key: np.ndarray, n_keys: int, ts: np.ndarray, t0: int, span: int):
        self.order = np.lexsort((ts, key))
        self.t0, self.span = t0, span
        self.composite = key[self.order] * span + (ts[self.order] - t0)
        self.first = np.searchsorted(key[self.order], np.arange(n_keys))
        self.prefix: dict[str, np.ndarray] = {}

    def add(self, name: str, values: np.ndarray) -> None:
        self.prefix[name] = np.r_[0.0, np.cumsum(values[self.order])]

    def before(self, keys: np.ndarray, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """[start, end) positions of each key's ratings older than its time; unseen keys (-1) get none."""
        seen = keys >= 0
        k = np.where(seen, keys, 0)
        t = np.clip(times - self.t0, 0, self.span - 1)
        end = np.searchsorted(self.composite, k * self.span + t, side="left")
        start = self.first[k]
        return np.where(seen, start, 0), np.where(seen, end, 0)

    def total(self, name: str, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        return self.prefix[name][end] - self.prefix[name][start]


class History:
    """Every visible rating, indexed for "as of t" statistics."""

    def __init__(self, ratings: list[Rating], scale: tuple[float, float] = SCALE):
        if not ratings:
            raise ValueError("no visible reviews to fit a star model on")
        self.scale = scale
        self.grid = np.arange(scale[0], scale[1] + 0.01, 0.5)  # the median counts ratings on half stars
        review, user, item, ts, stars = zip(*ratings, strict=True)
        self.review_ids = np.array(review)
        users, self.u = np.unique(np.array(user), return_inverse=True)
        items, self.i = np.unique(np.array(item), return_inverse=True)
        self.user_names, self.item_names = users, items
        self.user_index = {k: n for n, k in enumerate(users.tolist())}
        self.item_index = {k: n for n, k in enumerate(items.tolist())}
        self.ts = np.array(ts, dtype=np.int64)
        self.stars = np.array(stars, dtype=np.float64)
        self.end = int(self.ts.max()) + 1  # a moment after every rating: the official visibility
        t0, span = int(self.ts.min()), int(self.ts.max() - self.ts.min()) + 2
        by_time = np.argsort(self.ts, kind="stable")
        self.global_ts = self.ts[by_time]
        self.global_sum = np.r_[0.0, np.cumsum(self.stars[by_time])]
        self.user = Segments(self.u, len(users), self.ts, t0, span)
        self.item = Segments(self.i, len(items), self.ts, t0, span)
        ones = np.ones(len(self.ts))
        for segments in (self.user, self.item):
            segments.add("n", ones)
            segments.add("sum", self.stars)
        on_grid = np.clip(np.rint(self.stars * 2) / 2, *scale)  # exact for whole and half-star scales
        for v in self.grid:
            self.user.add(f"count={v}", (on_grid == v).astype(np.float64))
        # each rating's residual against the item's bias at its own time, for b_user
        mu = self.mu(self.ts)
        start, end = self.item.before(self.i, self.ts)
        n, total = self.item.total("n", start, end), self.item.total("sum", start, end)
        for lam in BIAS_STRENGTH:
            self.user.add(f"residual{lam:g}", self.stars - mu - (total - n * mu) / (n + lam))

    def mu(self, times: np.ndarray) -> np.ndarray:
        n = np.searchsorted(self.global_ts, times, side="left")
        return np.where(n > 0, self.global_sum[n] / np.maximum(n, 1), EMPTY_PRIOR)

    def codes(self, users: list[str], items: list[str]) -> tuple[np.ndarray, np.ndarray]:
        u = np.array([self.user_index.get(x, -1) for x in users], dtype=np.int64)
        i = np.array([self.item_index.get(x, -1) for x in items], dtype=np.int64)
        return u, i

    def item_known(self, i: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Per (item code, moment): whether the item has a rating strictly older than the moment."""
        start, end = self.item.before(i, np.asarray(times, dtype=np.int64))
        return end > start

    def candidates(self, u: np.ndarray, i: np.ndarray, times: np.ndarray) -> dict[str, np.ndarray]:
        """Every candidate's prediction for (user code, item code, moment) rows, using only the ratings
        strictly older than each row's moment."""
        times = np.asarray(times, dtype=np.int64)
        mu = self.mu(times)
        us, ue = self.user.before(u, times)
        n_u, sum_u = self.user.total("n", us, ue), self.user.total("sum", us, ue)
        is_, ie = self.item.before(i, times)
        n_i, sum_i = self.item.total("n", is_, ie), self.item.total("sum", is_, ie)
        out = {"global_mean": mu}
        for lam in USER_SHRINK:
            out[f"user_mean_shrink{lam:g}"] = np.where(
                n_u > 0, (sum_u + lam * mu) / np.maximum(n_u + lam, 1e-12), mu
            )
        out["user_median"] = self._median(us, ue, n_u, mu)
        for lam in BIAS_STRENGTH:
            b_item = (sum_i - n_i * mu) / (n_i + lam)
            b_user = self.user.total(f"residual{lam:g}", us, ue) / (n_u + lam)
            out[f"bias_lambda{lam:g}"] = mu + b_user + b_item
        for name in list(out):  # every candidate as it is delivered: within the scale
            out[name] = np.clip(out[name], *self.scale)
            out[f"{name}_rounded"] = np.clip(np.rint(out[name]), *self.scale)
        return out

    def _median(self, start: np.ndarray, end: np.ndarray, n: np.ndarray, mu: np.ndarray) -> np.ndarray:
        counts = np.stack([self.user.total(f"count={v}", start, end) for v in self.grid], axis=1)
        cumulative = np.cumsum(counts, axis=1)
        k = n.astype(np.int64)
        low = np.argmax(cumulative > ((k - 1) // 2)[:, None], axis=1)
        high = np.argmax(cumulative > (k // 2)[:, None], axis=1)
        return np.where(k > 0, (self.grid[low] + self.grid[high]) / 2, mu)


class PrequentialChoice:
    """For a moment t, the option with the lowest mean error over the rows strictly older than t (ties:
    the first option); ``fallback`` while fewer than ``minimum`` rows precede t.

    With ``z``, ``fallback`` must be one of the options and the others have to earn their place: an
    option is eligible at t only if its paired gain over ``fallback`` on the rows older than t (mean of
    ``error[fallback] - error[option]``) exceeds ``z`` standard errors."""

    def __init__(
        self,
        times: np.ndarray,
        errors: dict[str, np.ndarray],
        minimum: int,
        fallback: str,
        z: float | None = None,
    ):
        order = np.argsort(times, kind="stable")
        self.times = np.asarray(times)[order]
        self.names = list(errors)
        # row k: the summed errors of the k oldest rows (row 0: none), built in place (large stores)
        self.cumulative = np.zeros((len(order) + 1, len(self.names)))
        for j, name in enumerate(self.names):
            self.cumulative[1:, j] = np.asarray(errors[name])[order]
        np.cumsum(self.cumulative, axis=0, out=self.cumulative)
        self.minimum, self.fallback, self.z = minimum, fallback, z
        if z is not None:  # prefix sums of the squared paired gains over the fallback, for their variance
            self.fallback_column = self.names.index(fallback)
            base = np.asarray(errors[fallback])[order]
            self.squares = np.zeros_like(self.cumulative)
            for j, name in enumerate(self.names):
                self.squares[1:, j] = (base - np.asarray(errors[name])[order]) ** 2
            np.cumsum(self.squares, axis=0, out=self.squares)

    def choose(self, times: np.ndarray) -> list[str]:
        k = np.searchsorted(self.times, np.asarray(times), side="left")
        totals = self.cumulative[k]
        if self.z is not None:
            n = np.maximum(k, 1)[:, None]
            gain = (totals[:, [self.fallback_column]] - totals) / n
            variance = np.maximum(self.squares[k] / n - gain**2, 0) * n / np.maximum(n - 1, 1)
            spread = (k >= 2)[:, None]  # one row has no spread to test a gain against
            eligible = spread & (gain - self.z * np.sqrt(variance / n) > 0)
            eligible[:, self.fallback_column] = True
            totals = np.where(eligible, totals, np.inf)
        best = np.argmin(totals, axis=1)
        return [self.names[b] if n >= self.minimum else self.fallback for b, n in zip(best, k, strict=True)]

    def mean_errors(self) -> dict[str, float]:
        n = max(len(self.times), 1)
        return {name: float(self.cumulative[-1, j] / n) for j, name in enumerate(self.names)}


class GroupedChoice:
    """One PrequentialChoice per group (GROUPS: new item, item with history), each over its own rows."""

    def __init__(self, times, known, errors: dict[str, np.ndarray], minimum: int, fallback: str, z=None):
        known = np.asarray(known, dtype=bool)
        self.choices = {
            group: PrequentialChoice(
                np.asarray(times)[mask], {n: e[mask] for n, e in errors.items()}, minimum, fallback, z
            )
            for group, mask in zip(GROUPS, (~known, known), strict=True)
        }

    def choose(self, times: np.ndarray, known: np.ndarray) -> list[str]:
        times, known = np.asarray(times), np.asarray(known, dtype=bool)
        names = [""] * len(times)
        for group, mask in zip(GROUPS, (~known, known), strict=True):
            where = np.flatnonzero(mask)
            for k, name in zip(where, self.choices[group].choose(times[where]), strict=True):
                names[k] = name
        return names

    def report(self, end: int) -> dict:
        """Per group: its validation rows, every option's score on all of them, the choice with all."""
        return {
            group: {
                "validation_reviews": len(c.times),
                "candidates_pe": dict(
                    sorted(((n, round(1 - e, 4)) for n, e in c.mean_errors().items()), key=lambda kv: -kv[1])
                ),
                "chosen_with_all_validation": c.choose(np.array([end]))[0],
            }
            for group, c in self.choices.items()
        }


class TimedIsotonic:
    """An isotonic map from the LLM's expected stars to the truth, as of a moment: fitted on the rows
    strictly older than it (``minimum`` of them at least, else no value: NaN). Fits are kept by how many
    rows they used, so a batch of moments costs one fit per distinct count."""

    def __init__(self, times: np.ndarray, values: np.ndarray, truth: np.ndarray, scale, minimum: int):
        order = np.argsort(times, kind="stable")
        self.times = np.asarray(times)[order].tolist()
        self.values, self.truth = np.asarray(values, float)[order], np.asarray(truth, float)[order]
        self.scale, self.minimum, self.fits = scale, minimum, {}

    def fit(self, n: int):
        if n not in self.fits:
            from sklearn.isotonic import IsotonicRegression

            model = IsotonicRegression(y_min=self.scale[0], y_max=self.scale[1], out_of_bounds="clip")
            self.fits[n] = model.fit(self.values[:n], self.truth[:n])
        return self.fits[n]

    def at(self, values, times) -> np.ndarray:
        """Each value calibrated as of its moment; NaN where fewer than ``minimum`` rows are older."""
        out = np.full(len(values), np.nan)
        for k, (value, t) in enumerate(zip(values, times, strict=True)):
            n = bisect_left(self.times, int(t))
            if n >= self.minimum and value is not None:
                out[k] = float(self.fit(n).predict([float(value)])[0])
        return out


class StarModel:
    """Time-aware calibrated stars: ``predict`` for tasks, with the candidate chosen per task on the
    validation rows of its group older than it, and optionally blended with the LLM's stars."""

    def __init__(
        self,
        ratings: list[Rating],
        min_validation: int = 30,
        min_blend: int = 8,
        scale: tuple[float, float] = SCALE,
        min_calibration: int = 20,
    ):
        self.history = h = History(ratings, scale)
        start, end = h.user.before(h.u, h.ts)
        rows = np.flatnonzero(end > start)  # the user has an older rating: a validation row
        self.validation_rows = rows
        self.validation: list[Rating] = list(
            zip(
                h.review_ids[rows].tolist(),
                h.user_names[h.u[rows]].tolist(),
                h.item_names[h.i[rows]].tolist(),
                h.ts[rows].tolist(),
                h.stars[rows].tolist(),
                strict=True,
            )
        )
        predicted = h.candidates(h.u[rows], h.i[rows], h.ts[rows])
        truth = h.stars[rows]
        for name in predicted:  # in place: these arrays are large on a big store
            predicted[name] = errors(predicted[name], truth)
        known = h.item_known(h.i[rows], h.ts[rows])
        self.choice = GroupedChoice(h.ts[rows], known, predicted, min_validation, BASELINE, STAR_Z)
        del predicted
        self.blend: GroupedChoice | None = None
        self.calibration: TimedIsotonic | None = None
        self.calibrate_llm = False  # the LLM's stars are expected values: never used uncalibrated
        self.min_blend, self.min_calibration = min_blend, min_calibration
        self.report = {
            "validation_reviews": len(rows),
            "rule": f"per task, within its group (new item / item with history): {BASELINE} unless a "
            f"candidate's paired gain over it on the group's validation reviews older than the task "
            f"(>= {min_validation} of them) has a one-sided lower bound above zero ({STAR_Z:.4f} standard "
            f"errors: 95%, Bonferroni over {CANDIDATES - 1}); then the lowest error among those",
            "groups": self.choice.report(h.end),
            "llm_validation_stars": 0,
        }

    def choose(self, u: np.ndarray, i: np.ndarray, times: np.ndarray) -> list[str]:
        """The candidate for each (user code, item code, moment), by the rule of its group."""
        return self.choice.choose(times, self.history.item_known(i, times))

    def set_llm_validation(self, answers: dict[str, float], calibrate: bool = False) -> None:
        """The LLM's stars for some validation reviews (review_id -> stars): blends compete from now on.
        ``calibrate``: the stars are expected values, mapped by the time-aware isotonic fit first (the
        module docstring); reviews with too few older ones to calibrate on are left out, counted."""
        h = self.history
        self.calibrate_llm = calibrate
        keep = [k for k, r in enumerate(self.validation_rows) if str(h.review_ids[r]) in answers]
        self.report["llm_validation_stars"] = len(keep)
        if not keep:
            return
        rows = self.validation_rows[keep]
        times, truth = h.ts[rows], h.stars[rows]
        llm = np.array([answers[str(h.review_ids[r])] for r in rows])
        if calibrate:
            self.calibration = TimedIsotonic(times, llm, truth, h.scale, self.min_calibration)
            llm = self.calibration.at(llm, times)
            ready = ~np.isnan(llm)
            self.report["llm_calibration"] = {
                "rule": f"isotonic on the LLM's expected stars, fitted per moment on the LLM-answered "
                f"validation reviews strictly older than it (>= {self.min_calibration} of them)",
                "validation_reviews_calibrated": int(ready.sum()),
                "validation_reviews_too_early": int((~ready).sum()),
            }
            rows, times, truth, llm = rows[ready], times[ready], truth[ready], llm[ready]
            if not len(rows):
                return
        chosen = self.choose(h.u[rows], h.i[rows], times)  # the model as it stood at each row's own time
        predicted = h.candidates(h.u[rows], h.i[rows], times)
        model = np.array([predicted[c][k] for k, c in enumerate(chosen)])
        options = {"model": errors(model, truth)}
        for w in BLEND_WEIGHTS:
            blended = w * model + (1 - w) * llm
            options[f"blend_{w:g}"] = errors(blended, truth)
            options[f"blend_{w:g}_rounded"] = errors(np.rint(blended), truth)
        known = h.item_known(h.i[rows], times)
        self.blend = GroupedChoice(times, known, options, self.min_blend, "model", z=BLEND_Z)
        self.report["blend_rule"] = (
            f"per task, within its group: a blend only where its paired gain over the model alone on the "
            f"group's LLM-answered validation reviews older than the task (>= {self.min_blend} of them) "
            f"exceeds {BLEND_Z:.4f} standard errors (one-sided 95%, Bonferroni over {BLENDS} blends)"
        )
        self.report["blend_groups"] = self.blend.report(h.end)

    def calibrated(self, values: list[float | None], times: list[int]) -> list[float | None]:
        """The LLM's expected stars as of each moment through the calibration (None where there is no
        value or too few older reviews to calibrate on); as they are when they need none (greedy)."""
        if self.calibration is None:
            return [None] * len(values) if self.calibrate_llm else list(values)
        mapped = self.calibration.at(values, times)
        return [None if v is None or np.isnan(m) else float(m) for v, m in zip(values, mapped, strict=True)]

    def blend_options(self, items: list[str], times: list[int]) -> list[str]:
        """The blend each (item, moment) would get where the LLM answers ("model": none), so a caller can
        skip asking the LLM where no blend would be used."""
        if self.blend is None:
            return ["model"] * len(items)
        _, i = self.history.codes([""] * len(items), items)
        t = np.asarray(times, dtype=np.int64)
        return self.blend.choose(t, self.history.item_known(i, t))

    def predict(
        self,
        users: list[str],
        items: list[str],
        times: list[int],
        llm_stars: list[float | None] | None = None,
    ) -> tuple[list[float], list[str]]:
        """Stars for each (user, item, moment), and the name of what produced them."""
        h = self.history
        u, i = h.codes(users, items)
        t = np.asarray(times, dtype=np.int64)
        predicted = h.candidates(u, i, t)
        known = h.item_known(i, t)
        names = self.choice.choose(t, known)
        values = np.array([predicted[n][k] for k, n in enumerate(names)])
        if self.blend is not None and llm_stars is not None:
            llm_stars = self.calibrated(llm_stars, times)
            for k, option in enumerate(self.blend.choose(t, known)):
                if option != "model" and llm_stars[k] is not None:
                    w = float(option.split("_")[1])
                    blended = w * values[k] + (1 - w) * llm_stars[k]
                    values[k] = np.rint(blended) if option.endswith("_rounded") else blended
                    names[k] = f"{option}:{names[k]}"
        return np.clip(values, *h.scale).tolist(), names
