"""The discrimination test: hold-outs in time order, distractors never rated, scores by hand, nothing
after the cutoff reaching popularity, the agent's unusable answers filled at random and counted."""

import json
from collections import Counter

import numpy as np
import pytest

from agents.llm import Answer
from data_prep.movielens import Movie, MovieLens, Rating
from eval.sandbox import discrimination as d


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
        return [Answer(a) for a in self.answers[: len(conversations)]]


def test_the_bare_llm_picks_through_structured_numbers_and_unusable_answers_are_counted():
    data = tiny()
    cases = [
        {"user": 1, "cutoff": 30, "history": [1, 2], "held": [3], "candidates": [7, 3, 5]},
        {"user": 2, "cutoff": 40, "history": [5, 6], "held": [7], "candidates": [7, 1, 2]},
    ]
    counts = Counter()
    picks = d.pick_llm(
        cases, 1, data, Answers(['{"items": [2]}', "garbage"]), np.random.default_rng(0), counts
    )
    assert picks[0] == [3] and len(picks[1]) == 1 and counts["fallbacks"] == 1
    # a number off the page fails the schema: the answer is replaced at random whole, as garbage is
    parse = lambda answer, counts: d.parse_numbers(cases[:1], [answer], 2, np.random.default_rng(1), counts)  # noqa: E731
    counts = Counter()
    assert parse('{"items": [2, 9]}', counts) == parse("garbage", Counter()) and counts["fallbacks"] == 1
    counts = Counter()
    assert parse('{"items": [2.0, 3]}', counts) == [[3, 5]] and counts["fallbacks"] == 0  # 2.0 is an integer
    topped = parse('{"items": [2, 2]}', counts)  # a repeat is topped up at random, counted
    assert topped[0][0] == 3 and topped[0][1] in (7, 5) and counts["fallbacks"] == 1


class ByLength:
    """Scores favouring the numbers of starred films per token and the others in sum: the normalisation
    decides."""

    def __init__(self):
        self.prompts = []

    def score(self, conversations, options):
        from sandbox_fakes import page_titles

        self.prompts += conversations
        out = []
        for conversation, group in zip(conversations, options, strict=True):
            films = page_titles(conversation)
            out.append(
                [(-2.0, 4) if films.get(o, "").split(" (")[0].endswith("*") else (-1.5, 1) for o in group]
            )
        return out


def test_an_agent_row_is_built_at_each_cutoff_and_chooses_its_normalisation_on_validation(tmp_path):
    from sandbox_fakes import embed

    from eval.sandbox.cases import AgentRow

    data = tiny()
    for movie in (3, 4, 7):  # the held-out films are starred: best per token, worst in sum
        data.movies[movie].title += " *"
    backend = ByLength()
    row = AgentRow("agent-score", ["decision.mode=score"], False, None, [], data, backend, embed, 0)
    cases = {"1,1": [{"user": 1, "cutoff": 30, "history": [1, 2], "held": [3], "candidates": [5, 3]}]}
    validation = {
        "1,1": [{"user": 2, "cutoff": 40, "history": [5, 6], "held": [7], "candidates": [6, 7]}]
    }  # pmi: a tie, the first
    result = d.run_agent_row(row, cases, validation)
    assert result["normalisation"] == "mean" and result["choice_weight"] == 0  # no choice model given
    assert result["validation_p"]["1,1"] == {"sum,0": 0.0, "mean,0": 1.0, "pmi,0": 0.0}
    assert result["settings"]["1,1"]["p"] == 1.0
    (test_prompt,) = {
        "\n".join(m["content"] for m in p) for p in backend.prompts if "User 1" in p[0]["content"]
    }
    assert "It is 1970-01-01" in test_prompt
    remembered = test_prompt.split("# What you remember")[1].split("# Now")[0]
    assert "Movie 1" in remembered and "Movie 3" not in remembered  # the history before the cutoff only
    # the page's counts are as of the cutoff: film 5 had user 2's rating at t=5; film 3's first is at 30
    lines = {m: next(x for x in test_prompt.splitlines() if f"Movie {m} " in x and ". " in x) for m in (5, 3)}
    assert "[1 rating, average 4.0]" in lines[5] and "no ratings yet" in lines[3]


def test_claims_are_paired_and_bonferroni_corrected_over_the_claims_made():
    rng = np.random.default_rng(0)
    settings = {}
    for key in ("1,5", "3,3"):
        settings[key] = {
            m: {"hits": rng.integers(0, 2, 40).astype(float).tolist()} for m in ("tuned", "popularity", "mf")
        }
    claims = d.claims({"settings": settings}, "tuned")
    assert len(claims) == 4 and {c["confidence"] for c in claims} == {1 - 0.05 / 4}
    tuned, pop = np.array(settings["1,5"]["tuned"]["hits"]), np.array(settings["1,5"]["popularity"]["hits"])
    assert claims[0]["difference"] == pytest.approx((tuned - pop).mean(), abs=1e-4)


@pytest.mark.slow
def test_a_run_writes_every_row_to_its_table_and_a_rerun_keeps_them(raw, tmp_path, capsys):
    config = "configs/sandbox/movielens.yaml"
    data = [f"data={raw / 'movielens_latest_small'}"]
    args = (config, data, tmp_path, 6, 3, "2010-01-01", ["random", "popularity"])
    results = d.run(*args)
    for key in ("1,5", "3,3", "3,7", "1,9"):
        assert results["settings"][key]["random"]["users"] == 6
        assert results["settings"][key]["popularity"]["users"] == 6
    table = (tmp_path / "table.md").read_text()
    assert "| random |" in table and "| popularity |" in table
    assert "| tuned | left out: needs --adapter |" in table  # no adapter: the tuned rows say so
    capsys.readouterr()
    again = d.run(*args)
    assert "popularity: done earlier, kept" in capsys.readouterr().out
    assert again["settings"] == results["settings"]
