"""The discrimination test: hold-outs in time order, distractors never rated, scores by hand, nothing
after the cutoff reaching popularity, the agent's unusable answers filled at random and counted."""

import json
from collections import Counter

import numpy as np
import pytest

from data_prep.movielens import Movie, MovieLens, Rating
from eval import discrimination as d


def tiny():
    movies = {i: Movie(i, f"Movie {i}", ["Drama"]) for i in range(1, 9)}
    ratings = [
        Rating(1, 1, 4.0, 10), Rating(1, 2, 4.0, 20), Rating(1, 3, 4.0, 30), Rating(1, 4, 4.0, 30),
        Rating(2, 5, 4.0, 5), Rating(2, 6, 4.0, 15), Rating(2, 5 + 2, 4.0, 40),
        Rating(3, 6, 4.0, 6), Rating(4, 6, 4.0, 7),  # movie 6 popular early
        Rating(3, 8, 4.0, 50), Rating(4, 8, 4.0, 51), Rating(2, 8, 4.0, 52), Rating(5, 8, 4.0, 55),  # 8: later
    ]  # fmt: skip
    ratings.sort(key=lambda r: (r.ts, r.movie))
    return MovieLens(movies, ratings, [], Counter())


def test_cases_hold_out_the_latest_in_time_order_with_unrated_distractors():
    data = tiny()
    (case,) = d.make_cases(data, [1], a=2, b=2, rng=np.random.default_rng(0))
    assert case["held"] == [3, 4] and case["cutoff"] == 30  # tie at 30 broken by movie id
    assert case["history"] == [1, 2] and len(case["candidates"]) == 4
    # the only films user 1 never rated that anyone had rated before t=30: 5 and 6 (7 and 8 come later)
    assert set(case["candidates"]) - {3, 4} == {5, 6}
    skipped = []
    assert d.make_cases(data, [1], a=2, b=3, rng=np.random.default_rng(0), skipped=skipped) == []
    assert skipped == [1]  # not enough distractors before the cutoff: left out, reported


def test_scores_by_hand():
    cases = [{"held": [1, 2, 3]}, {"held": [4]}]
    result = d.score(cases, [[1, 9, 8], [4]])
    assert result["p"] == pytest.approx((1 / 3 + 1) / 2, abs=1e-4) and result["users"] == 2


def test_popularity_counts_only_ratings_before_the_cutoff():
    data = tiny()
    case = {"user": 1, "cutoff": 30, "history": [1, 2], "held": [3], "candidates": [8, 6]}
    assert d.pick_popularity([case], 1, data) == [[6]]  # 8 is more rated in the end, but only later
    late = {**case, "cutoff": 60}
    assert d.pick_popularity([late], 1, data) == [[8]]


class Answers:
    def __init__(self, answers):
        self.answers = answers

    def generate(self, conversations, sampling, constraint=None):
        assert json.loads(constraint.schema)["properties"]["items"]["minItems"] == 1
        return self.answers[: len(conversations)]


def test_the_agent_picks_through_structured_numbers_and_unusable_answers_are_counted():
    data = tiny()
    cases = [
        {"user": 1, "cutoff": 30, "history": [1, 2], "held": [3], "candidates": [7, 3, 5]},
        {"user": 2, "cutoff": 40, "history": [5, 6], "held": [7], "candidates": [7, 1, 2]},
    ]
    counts = Counter()
    picks = d.pick_agent(
        cases, 1, data, Answers(['{"items": [2]}', "garbage"]), np.random.default_rng(0), counts
    )
    assert picks[0] == [3] and len(picks[1]) == 1 and counts["agent_fallbacks"] == 1
