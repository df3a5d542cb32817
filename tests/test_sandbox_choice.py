"""The choice model fitted on real choices: its features by hand, fitted only on choices before the
moment, better than chance on later real choices, and weighed into the sandbox's score-mode choice."""

import numpy as np
import pytest
from sandbox_fakes import PageScoring, embed

from agents.sandbox.choice import FEATURES, ChoiceModel, Past, as_of, fit_on_data, past_of
from agents.sandbox.config import load_config
from agents.sandbox.profiles import movielens_profiles
from agents.sandbox.world import World
from data_prep import movielens
from data_prep.movielens import Movie


@pytest.fixture(scope="module")
def ml(raw):
    return movielens.load(raw / "movielens_latest_small")


def test_the_features_by_hand():
    movies = {
        1: Movie(1, "A (2000)", ["Drama"]),
        2: Movie(2, "B (1990)", ["Drama", "Horror"]),
        3: Movie(3, "C", ["Comedy"]),
    }
    model = ChoiceModel(movies, embed)
    past = Past([1, 3], [5.0, 2.0])  # one Drama loved, one Comedy not
    rows = model.features(past, [2, 3], {2: (9, 4.0), 3: (0, None)}, {2: 2}, 2010)
    assert len(FEATURES) == rows.shape[1]
    b, c = rows
    assert b[0] == pytest.approx(np.log(10)) and b[1] == 0 and b[2] == pytest.approx((36 + 10.5) / 12)
    assert b[3] == pytest.approx(np.log(3)) and b[4] == 20
    assert b[5] == pytest.approx((1 / 2 + 0) / 2) and b[6] == pytest.approx((1 / 1 + 0) / 2)  # Drama's shares
    assert (c[0], c[1], c[2], c[3], c[4]) == (0, 1, 3.5, 0, 0)  # no ratings, no year
    assert c[5] == pytest.approx(1 / 2) and c[6] == 0


@pytest.mark.slow
def test_fitted_before_a_moment_it_beats_chance_on_later_real_choices(ml):
    from data_prep.choice_pairs import draw_targets, make_pages

    before = movielens.parse_moment("2008-01-01", ml)
    model = fit_on_data(ml, before, embed, np.random.default_rng(0), pages=600)
    later = [r for r in ml.ratings if r.ts >= before]
    assert model.coefficients()["log_ratings"] > 0  # popular films are chosen more
    rng = np.random.default_rng(1)
    targets = [t for t in draw_targets(ml, ml.end, 5, 5, 4000, rng) if t.ts >= before][:300]
    pages, _ = make_pages(ml, targets, ml.end, rng, sizes=(10,))
    hits = [
        page[int(np.argmax(model.score(past_of(ml, t.user, t.ts), page, *as_of(ml, page, t.ts))))] == t.movie
        for t, page in pages
    ]
    assert later and np.mean(hits) > 0.2  # chance is 0.1


@pytest.mark.slow
def test_the_fit_reads_nothing_from_after_its_moment(ml):
    from dataclasses import replace

    before = movielens.parse_moment("2005-01-01", ml)
    model = fit_on_data(ml, before, embed, np.random.default_rng(0), pages=200)
    tags = {m.id: [t for t in m.tags if t.ts < before] for m in ml.movies.values()}
    movies = {i: replace(m, tags=tags[i]) for i, m in ml.movies.items()}  # later ratings and tags gone
    past_only = movielens.MovieLens(movies, [r for r in ml.ratings if r.ts < before], [], None)
    again = fit_on_data(past_only, before, embed, np.random.default_rng(0), pages=200)
    assert again.coefficients() == model.coefficients()


@pytest.mark.slow
def test_score_mode_adds_the_weighted_choice_model_to_the_llms_scores(ml):
    backend = PageScoring(prefer=lambda o: -0.1 if o in ("recommender", "watch") else -5.0)  # films all equal
    config = load_config(
        None,
        ["recommender.kind=popularity", "activity.pareto_xmin=1", "decision.mode=score", "temperature=0",
         "decision.choice_weight=1", "decision.choice_pages=300", "features.sample_share=0"],
    )  # fmt: skip
    rng = np.random.default_rng(0)
    profiles = movielens_profiles(ml, 3, ml.end, rng, config.features, config.min_history)
    w = World(config, profiles, ml, backend, embed, {p.name: set() for p in profiles}, rng)
    seen = {}
    original = w.choice_scores

    def spy(agent, page):  # the model's log-odds as the choice saw them
        seen[agent.profile.name] = (page, original(agent, page))
        return seen[agent.profile.name][1]

    w.choice_scores = spy
    events, _ = w.step()
    watches = [e for e in events if e["action"] == "watch"]
    assert len(watches) == 3
    for event in watches:  # the LLM scores every film alike: the model decides
        page, scores = seen[event["agent"]]
        assert event["item"] == page[int(np.argmax(scores))] and np.ptp(scores) > 0
    off = World(load_config(None, ["decision.mode=score"]), profiles, ml, backend, embed, {}, rng)
    assert off.choice is None  # choice_weight 0: no model is fitted
