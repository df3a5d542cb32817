"""The time-aware star model: hand-computed values, a brute-force check that nothing at or after the
moment is used, the prequential choice, and blends with an LLM's stars."""

import random

import numpy as np
import pytest

from agents.review.stars import BASELINE, History, PrequentialChoice, StarModel

# (review_id, user, item, ts, stars)
SMALL = [("r1", "u1", "i1", 1, 4.0), ("r2", "u1", "i2", 2, 2.0), ("r3", "u2", "i1", 3, 5.0)]


def at(history: History, user: str, item: str, t: int) -> dict[str, float]:
    u, i = history.codes([user], [item])
    return {name: float(v[0]) for name, v in history.candidates(u, i, np.array([t])).items()}


def ratings_of(n: int, user, item, stars) -> list[tuple]:
    """n ratings, the k-th at time k, its user, item and stars given as functions of k."""
    return [(f"r{k}", f"u{user(k)}", f"i{item(k)}", k, float(stars(k))) for k in range(n)]


def test_candidates_by_hand():
    h = History(SMALL)
    late = at(h, "u1", "i1", 4)  # after everything
    mu = 11 / 3
    assert late["global_mean"] == pytest.approx(mu)
    assert late["user_mean_shrink0"] == pytest.approx(3.0)
    assert late["user_mean_shrink3"] == pytest.approx((6 + 3 * mu) / 5)
    assert late["user_median"] == 3.0
    # b_item(i1) = (4 + 5 - 2 mu) / (2 + 1); b_user(u1) = residuals at each rating's own time:
    # r1: 4 - 3 (empty prior, no rating before t=1) - 0 = 1; r2: 2 - 4 - 0 = -2 -> (1 - 2) / (2 + 1)
    assert late["bias_lambda1"] == pytest.approx(mu + (1 - 2) / 3 + (9 - 2 * mu) / 3)
    assert late["bias_lambda1_rounded"] == 4.0
    # strictly older: at t=3, r3 (t=3) is not seen; at t=2, only r1
    assert at(h, "u1", "i1", 3)["global_mean"] == pytest.approx(3.0)
    assert at(h, "u1", "i1", 3)["bias_lambda1"] == pytest.approx(3.0 - 1 / 3 + (4 - 3.0) / 2)
    assert at(h, "u1", "i2", 2)["user_mean_shrink0"] == 4.0
    # before any rating: the empty prior; an unknown user or item: no user or item term
    assert at(h, "u1", "i1", 0)["global_mean"] == 3.0
    assert at(h, "nobody", "nothing", 4)["bias_lambda5"] == pytest.approx(mu)
    assert at(h, "nobody", "i1", 4)["user_median"] == pytest.approx(mu)


def test_candidates_are_scored_as_delivered_within_one_to_five():
    # others love what "grump" hates, and everyone hates "dud": mu + b_user + b_item falls below 1
    ratings = [(f"o{k}", f"fan{k}", f"good{k % 3}", k, 5.0) for k in range(12)]
    ratings += [(f"g{k}", "grump", f"good{k}", 20 + k, 1.0) for k in range(3)]
    ratings += [(f"d{k}", f"fan{k}", "dud", 30 + k, 1.0) for k in range(4)]
    unclipped = brute_force(ratings, "grump", "dud", 100, lam=1.0)[2]
    assert unclipped < 1
    assert at(History(ratings), "grump", "dud", 100)["bias_lambda1"] == 1.0


def brute_force(ratings, user, item, t, shrink=3.0, lam=5.0):
    """The same statistics recomputed from scratch from the ratings strictly older than t."""

    def mu_at(moment):
        past = [r[4] for r in ratings if r[3] < moment]
        return float(np.mean(past)) if past else 3.0

    def item_bias(it, moment):
        past = [r[4] for r in ratings if r[3] < moment and r[2] == it]
        return (sum(past) - len(past) * mu_at(moment)) / (len(past) + lam)

    mu = mu_at(t)
    own = [r for r in ratings if r[3] < t and r[1] == user]
    stars = [r[4] for r in own]
    user_mean = (sum(stars) + shrink * mu) / (len(stars) + shrink) if stars else mu
    median = float(np.median(stars)) if stars else mu
    residuals = [r[4] - mu_at(r[3]) - item_bias(r[2], r[3]) for r in own]
    bias = mu + sum(residuals) / (len(stars) + lam) + item_bias(item, t)
    return user_mean, median, bias


def test_every_statistic_uses_only_ratings_strictly_older_than_the_moment():
    rng = random.Random(0)
    ratings = [  # times drawn at random, with ties
        (
            f"r{k}",
            f"u{rng.randrange(25)}",
            f"i{rng.randrange(12)}",
            rng.randrange(300),
            float(rng.randint(1, 5)),
        )
        for k in range(400)
    ]
    h = History(ratings)
    for _ in range(60):
        user, item, t = f"u{rng.randrange(27)}", f"i{rng.randrange(13)}", rng.randrange(-5, 310)
        got = at(h, user, item, t)
        expected = brute_force(ratings, user, item, t)
        assert (got["user_mean_shrink3"], got["user_median"], got["bias_lambda5"]) == pytest.approx(expected)


def test_prequential_choice_uses_only_rows_older_than_the_moment():
    times = np.array([1, 2, 3, 4, 5, 6])
    # option a is better early, b from t=4 on; cumulative means decide
    errors = {"a": np.array([0.0, 0.0, 0.0, 0.9, 0.9, 0.9]), "b": np.array([0.3, 0.3, 0.3, 0.0, 0.0, 0.0])}
    choice = PrequentialChoice(times, errors, minimum=2, fallback="prior")
    # t=2: one older row (too few) -> prior; t=4: rows 1-3 -> a; t=7: a 2.7 vs b 0.9 -> b; a tie -> first
    assert choice.choose(np.array([2, 4, 7])) == ["prior", "a", "b"]
    tie = PrequentialChoice(times[:2], {"a": np.zeros(2), "b": np.zeros(2)}, minimum=1, fallback="prior")
    assert tie.choose(np.array([9])) == ["a"]
    assert choice.mean_errors() == pytest.approx({"a": 0.45, "b": 0.15})


def test_prequential_choice_with_z_needs_a_significant_paired_gain_over_the_fallback():
    times = np.arange(1, 11)
    errors = {
        "model": np.full(10, 0.5),
        "lucky": np.array([0.0, 0.7] * 5),  # mean 0.35, but its gain over the model swings +0.5 / -0.2
        "steady": np.full(10, 0.4),  # mean 0.40, a gain of 0.1 on every row
    }
    plain = PrequentialChoice(times, errors, minimum=2, fallback="model")
    assert plain.choose(np.array([11])) == ["lucky"]  # lowest mean error
    strict = PrequentialChoice(times, errors, minimum=2, fallback="model", z=2.5)
    # lucky: gain 0.15, standard error 0.12 -> not eligible; steady: gain 0.1 with no spread -> chosen
    assert strict.choose(np.array([11])) == ["steady"]
    one_row = PrequentialChoice(times, errors, minimum=1, fallback="model", z=2.5)
    assert one_row.choose(np.array([2])) == ["model"]  # a single row has no spread to test against
    noisy = PrequentialChoice(times, {"model": errors["model"], "lucky": errors["lucky"]}, 2, "model", z=2.5)
    assert noisy.choose(np.array([3, 11])) == ["model", "model"]


def test_star_model_predicts_at_each_task_moment_and_reports_its_choice():
    rng = random.Random(1)
    high = lambda k: k % 40 >= 20  # noqa: E731 (users 20-39 rate one star higher)
    ratings = ratings_of(
        800, lambda k: k % 40, lambda k: rng.randrange(10), lambda k: 3 + high(k) + rng.choice([-1, 0, 0, 1])
    )
    model = StarModel(ratings, min_validation=30)
    assert model.report["validation_reviews"] == 760  # every rating whose user has an older one
    groups = model.report["groups"]
    assert groups["new_item"]["validation_reviews"] + groups["item_with_history"]["validation_reviews"] == 760
    stars, names = model.predict(["u1", "u25", "u1"], ["i1", "i1", "i1"], [10, 799, 800])
    assert names[0] == BASELINE  # at t=10 fewer than 30 validation rows of its group are older
    assert all(1 <= s <= 5 for s in stars)
    assert stars[1] > stars[2] + 0.5  # u25 rates a star higher than u1: a model that ignored users would fail


def test_the_median_stays_unless_a_candidate_beats_it_by_a_margin_in_the_tasks_group():
    """Each user rates their own whole number of stars, except that item i0 gets two more: a median
    cannot see that, Koren's baseline can. With item history the baseline beats the median by a wide
    margin and is chosen; for a new item nothing beats the user's median (it is exact there), so it stays."""
    rng = random.Random(3)
    rows = []
    for k in range(1700):
        item = rng.randrange(10) if k < 1500 else 10 + k  # from k=1500 on every item is new
        stars = 2 + k % 3 + 2 * (item == 0)  # users u0, u3, ... rate 2; i0 two stars more
        rows.append((f"r{k}", f"u{k % 30}", f"i{item}", k, float(min(stars, 5))))
    model = StarModel(rows, min_validation=30)
    groups = model.report["groups"]
    assert groups["item_with_history"]["chosen_with_all_validation"].startswith("bias_")
    assert groups["new_item"]["validation_reviews"] == 200  # i0-i9 first rated before users repeat
    assert groups["new_item"]["chosen_with_all_validation"] == BASELINE
    stars, names = model.predict(["u1", "u1"], ["i0", "i9999"], [1700, 1700])
    assert names[0].startswith("bias_") and stars[0] > 3.5  # u1 rates 3; i0 two more
    assert names[1] == BASELINE and stars[1] == 3.0


def test_blends_with_llm_stars_only_where_validation_says_so():
    rng = random.Random(2)
    ratings = ratings_of(600, lambda k: k % 30, lambda k: rng.randrange(8), lambda k: rng.randint(1, 5))
    model = StarModel(ratings, min_validation=30, min_blend=8)
    rows = model.validation[::3]
    model.set_llm_validation({r[0]: r[4] for r in rows})  # an LLM that knows these answers
    assert model.report["llm_validation_stars"] == len(rows)
    late = rows[-1][3] + 1
    stars, names = model.predict(["u1", "u1"], ["i1", "i1"], [late, late], llm_stars=[2.0, None])
    assert names[0].startswith("blend_0") and stars[0] == 2.0  # the LLM's stars alone won
    assert not names[1].startswith("blend")  # no LLM answer for this task: the model alone
    early = rows[3][3]  # fewer than 8 answered rows are older: no blend yet
    assert not model.predict(["u1"], ["i1"], [early], llm_stars=[2.0])[1][0].startswith("blend")
    liar = StarModel(ratings, min_validation=30, min_blend=8)
    liar.set_llm_validation({r[0]: 6 - r[4] for r in rows})  # always wrong
    assert not liar.predict(["u1"], ["i1"], [late], llm_stars=[1.0])[1][0].startswith("blend")


def test_the_bonferroni_count_is_the_candidates_the_model_has():
    from agents.review.stars import CANDIDATES, STAR_Z

    h = History(SMALL)
    u, i = h.codes(["u1"], ["i1"])
    names = h.candidates(u, i, np.array([4]))
    assert len(names) == CANDIDATES == 18 and BASELINE in names
    assert abs(STAR_Z - 2.7543) < 1e-4  # the normal quantile of 1 - 0.05 / 17
