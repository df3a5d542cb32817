"""A watched film's stars: the review simulator's star model on MovieLens's half stars as of the
moment, and the LLM's stars only where validation shows they help; activity levels from real counts
through the fitted Pareto law."""

import re
from collections import Counter

import numpy as np
import pytest
from sandbox_fakes import embed

from agents.llm import Answer
from agents.sandbox.agent import agents_at
from agents.sandbox.config import load_config
from agents.sandbox.decide import Decider
from agents.sandbox.memory import LLMMemoryModel
from agents.sandbox.rating import STARS, Rater
from agents.sandbox.social import fit_pareto, levels_from_counts
from data_prep import movielens


@pytest.fixture(scope="module")
def ml(raw):
    return movielens.load(raw / "movielens_latest_small")


class Stars:
    """Answers a star question with probabilities whose expected value is ``rule(user, title)`` (spread
    over the two digits around it); records how often it was asked."""

    def __init__(self, ml, rule):
        self.texts = {m.text(): m.id for m in ml.movies.values()}
        self.rule, self.asked = rule, 0

    def option_probs(self, conversations, options, samples=8, seed=0, prefix=""):
        assert list(options) == STARS and not prefix
        self.asked += len(conversations)
        out = []
        for conversation in conversations:
            user = int(re.match(r"You are User (\d+)", conversation[0]["content"]).group(1))
            text = conversation[-1]["content"].split("You just watched ")[1].split("\n")[0].removesuffix(".")
            value = float(self.rule(user, self.texts[text]))
            low = int(np.floor(value))
            probs = {o: 0.0 for o in STARS}
            probs[str(low)] += 1 - (value - low)
            if value > low:
                probs[str(low + 1)] += value - low
            best = max(probs, key=probs.get)
            out.append(Answer(best, constrained=True, probs=probs, expected=value, probs_from="logprobs"))
        return out


def rater(ml, backend, start, read="greedy"):
    config = load_config(None, ["temperature=0", f"stars.read={read}"])
    decider = Decider(config, backend, np.random.default_rng(0), Counter())
    return Rater([r for r in ml.ratings if r.ts < start], decider, config, ml.movies), config


@pytest.mark.slow
def test_the_llm_blends_in_only_where_validation_shows_it_helps(ml):
    start = movielens.parse_moment("2016-01-01", ml)
    truth = {(r.user, r.movie): r.stars for r in ml.ratings}
    oracle = Stars(ml, lambda u, m: str(int(min(5, max(1, np.floor(truth[(u, m)] + 0.5))))))
    good, config = rater(ml, oracle, start)
    rows = [r for r in good.model.validation if r[3] < start][-60:]
    good.validate(rows, ml, embed, LLMMemoryModel(oracle), np.random.default_rng(0))
    assert oracle.asked == 60 and good.blends([1], [start])  # a near-perfect LLM earns its place
    (agent,) = agents_at(ml, [414], [start], config, embed, LLMMemoryModel(oracle), np.random.default_rng(0))
    stars, sources = good.rate([agent], [1], [start], [0])
    assert sources[0].startswith("blend_") and oracle.asked == 61 and good.counts["llm_asked"] == 1
    liar = Stars(ml, lambda u, m: "1")
    bad, _ = rater(ml, liar, start)
    bad.validate(rows, ml, embed, LLMMemoryModel(liar), np.random.default_rng(0))
    stars, sources = bad.rate([agent], [1], [start], [0])
    assert not bad.blends([1], [start]) and liar.asked == 60  # validated, then never asked again
    expected, names = bad.model.predict(["414"], ["1"], [start])
    assert stars == [float(np.rint(v * 2) / 2) for v in expected] and sources == names  # half stars
    assert 0.5 <= stars[0] <= 5 and (stars[0] * 2).is_integer()


@pytest.mark.slow
def test_expected_stars_are_calibrated_on_older_validation_ratings_before_they_blend(ml):
    """An LLM that orders films as the user does but squeezes them into 2.6-3.4 stars: read greedy its
    digit is always 3 and the blend is useless; its expected value, calibrated by the isotonic fit on
    older validation ratings, carries the user and earns its blend."""
    start = movielens.parse_moment("2016-01-01", ml)
    truth = {(r.user, r.movie): r.stars for r in ml.ratings}
    squeezed = lambda u, m: 2.5 + truth[(u, m)] / 5 * 0.9  # noqa: E731 (monotone in the truth)
    rows = None
    verdicts = {}
    for read in ("greedy", "expected"):
        backend = Stars(ml, squeezed)
        model, _ = rater(ml, backend, start, read)
        rows = rows or [r for r in model.model.validation if r[3] < start][-80:]
        model.validate(rows, ml, embed, LLMMemoryModel(backend), np.random.default_rng(0))
        verdicts[read] = model.blends([1], [start])
    assert verdicts == {"greedy": False, "expected": True}
    report = model.model.report["llm_calibration"]
    assert report["validation_reviews_calibrated"] + report["validation_reviews_too_early"] == 80
    assert report["validation_reviews_too_early"] == 20  # the first 20 have too few older ones
    # the calibration of a value depends only on validation ratings older than its moment
    early = model.model.calibrated([3.0], [rows[25][3]])
    assert early[0] is not None and model.model.calibrated([3.0], [rows[0][3]]) == [None]


def test_a_rating_sees_only_the_ratings_before_its_moment(ml):
    start = movielens.parse_moment("2012-01-01", ml)
    early, _ = rater(ml, Stars(ml, lambda u, m: "3"), start)
    everything, config = rater(ml, Stars(ml, lambda u, m: "3"), ml.end)
    (agent,) = agents_at(ml, [414], [start], config, embed, LLMMemoryModel(None), np.random.default_rng(0))
    # the model fitted on everything but asked as of the start agrees with the one that never saw later
    assert everything.rate([agent], [2571], [start], [0]) == early.rate([agent], [2571], [start], [0])


def test_activity_levels_map_each_count_through_the_fitted_law():
    population = [20, 25, 40, 80, 160, 320, 640]
    fit, levels = levels_from_counts([20, 40, 640], population, alpha=0.5, xmin=0.1)
    assert fit == fit_pareto(population)
    expected = np.minimum(1, 0.1 * (np.array([20, 40, 640]) / 20) ** (fit["alpha"] / 0.5))
    assert levels == pytest.approx(expected) and levels[0] == pytest.approx(0.1) and levels[-1] == 1
    _, same = levels_from_counts([20, 40], population, alpha=fit["alpha"], xmin=0.1)
    assert same == pytest.approx([0.1, 0.2])  # the law's own alpha: levels in proportion to counts
    with pytest.raises(ValueError, match="a count of 5 is below the population's smallest, 20"):
        levels_from_counts([5], population, 0.5, 0.1)


def test_a_world_gives_aligned_agents_activity_from_their_counts(ml):
    from sandbox_fakes import Scripted

    from agents.sandbox.profiles import movielens_profiles
    from agents.sandbox.world import World

    config = load_config(
        None, ["recommender.kind=popularity", "activity.pareto_alpha=0.69", "activity.pareto_xmin=0.1"]
    )
    rng = np.random.default_rng(0)
    profiles = movielens_profiles(ml, 8, ml.end, rng, config.features, config.min_history)
    w = World(config, profiles, ml, Scripted({}), embed, {p.name: set() for p in profiles}, rng)
    counts = [len(p.history) for p in profiles]
    fit = fit_pareto(list(Counter(r.user for r in ml.ratings).values()))
    expected = np.minimum(1, 0.1 * (np.array(counts) / fit["xmin"]) ** (fit["alpha"] / 0.69))
    assert [a.activity for a in w.agents.values()] == pytest.approx(expected)
    assert w.activity_fit == fit
