"""The sandbox's recommenders on the real MovieLens sample: MF is trained and follows new clicks,
popularity orders by clicks, the feed injects random unseen items."""

from collections import Counter

import numpy as np
import pytest

from agents.sandbox.config import RecommenderConfig
from agents.sandbox.recommender import Feed, MFRecommender, PopularityRecommender
from data_prep import movielens


@pytest.fixture(scope="module")
def ml(raw):
    return movielens.load(raw / "movielens_latest_small")


@pytest.fixture(scope="module")
def clicks(ml):
    return [(r.user, r.movie) for r in ml.ratings if r.user <= 100]


def test_mf_is_trained_and_its_ranking_follows_the_simulated_clicks(ml, clicks):
    config = RecommenderConfig(kind="mf", factors=16, iterations=10)
    mf = MFRecommender(list(ml.movies), np.random.default_rng(0), config)
    per_user = Counter(u for u, _ in clicks)
    user = min(per_user, key=lambda u: (per_user[u], u))  # a light user: 20 ratings
    seen = {i for u, i in clicks if u == user}
    assert mf.rank(user, seen, 10) == PopularityRecommender(list(ml.movies), None).rank(
        user, seen, 10
    )  # untrained
    counts = Counter(i for _, i in clicks)  # films others watched, so they have learned factors
    known = [i for i in sorted(counts) if counts[i] >= 3 and i not in seen]
    horror = [i for i in known if "Horror" in ml.movies[i].genres]
    binged, held = set(horror[::2]), horror[1::2]
    others = [i for i in known if "Horror" not in ml.movies[i].genres]

    def lean():  # how much more the model scores the horror films the user did not click than the rest
        scores, index = mf.scores(user), mf.item_index
        return scores[[index[i] for i in held]].mean() - scores[[index[i] for i in others]].mean()

    def horror_share(items):
        return np.mean(["Horror" in ml.movies[i].genres for i in items])

    mf.fit(clicks)
    before, lean_before = mf.rank(user, seen, 10), lean()
    mf.fit(clicks + [(user, i) for i in sorted(binged)])  # the user binges half of them
    after = mf.rank(user, seen | binged, 10)
    assert mf.fits == 2 and after != before
    assert lean() > lean_before and horror_share(after) > horror_share(before)  # it follows the clicks


def test_popularity_orders_by_clicks_then_id(ml):
    pop = PopularityRecommender([1, 2, 3, 4], None)
    pop.fit([(1, 3), (2, 3), (1, 2)])
    assert pop.rank(9, {2}, 3) == [3, 1, 4]


def test_the_feed_injects_random_unseen_items_and_never_repeats_what_was_seen(ml, clicks):
    config = RecommenderConfig(kind="popularity", page_size=5, rec_random_k=2)
    feed = Feed(config, list(ml.movies), np.random.default_rng(0))
    feed.train(clicks)
    seen = {i for u, i in clicks if u == 1}
    items, injected = feed.page(1, seen)
    assert len(items) == 5 and len(injected) == 2 and items[3:] == injected
    assert not set(items) & seen and len(set(items)) == 5
    assert items[:3] == feed.recommender.rank(1, seen, 3)
    no_injection = Feed(
        RecommenderConfig(kind="popularity", page_size=5), list(ml.movies), np.random.default_rng(0)
    )
    no_injection.train(clicks)
    assert no_injection.page(1, seen)[1] == []
