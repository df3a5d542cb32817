"""The sandbox's recommender: one small protocol, three built-ins, any other by import path, and the
feed that pages through it.

The protocol (a class; nothing to inherit)::

    class MyRecommender:
        def __init__(self, items: list[int], rng: numpy.random.Generator, config): ...
            # items: the catalogue's movie ids; rng: the run's generator; config: the recommender
            # section (RecommenderConfig), with your own settings in config.options
        def fit(self, clicks: list[tuple[int, int]], seed: int | None = None) -> None: ...
            # (user, movie) pairs so far: the real history before the start, then the simulated
            # watches; called at the start and every ``retrain_every`` rounds. ``seed``: repeat an earlier
            # fit exactly (a resumed run); set ``self.seed`` to the seed you used, if any
        def rank(self, user: int, exclude: set[int], n: int) -> list[int]: ...
            # the n best movie ids for this user, best first, none of ``exclude`` (what the user watched
            # or was shown this visit); an agent without a MovieLens user has a negative id

    recommender: {kind: my_package.recs:MyRecommender, options: {...}}   # in the sandbox config

Built-ins: ``random`` (uniform over the items not excluded), ``popularity`` (most clicked first, ties
by item id), ``mf`` (implicit-feedback ALS from the ``implicit`` library, trained on the users' real
history and retrained on it plus the simulated clicks every ``retrain_every`` rounds; a user with no
clicks gets the popularity ranking). ``agents.sandbox.recsys:CornacRecommender`` adapts any model of
the Cornac library (RecBole, which RecAgent used, does not run with NumPy 2: README).

``Feed`` serves pages of ``page_size``: ``rec_random_k`` of each page are random items the user has not
seen, the rest the recommender's ranking (injection that actually happens; tested). It holds the
recommender to the protocol: a ``fit`` or ``rank`` that raises, or a page with an unknown, excluded or
repeated item or fewer items than could be shown, is counted (``recommender_refused:KIND:REASON``) and
that page comes from the ``fallback`` recommender instead (after a failed fit, every page until the
next fit succeeds); the round goes on.
"""

from __future__ import annotations

import sys
from collections import Counter

import numpy as np

from agents.retrieval import top_indices


class RandomRecommender:
    def __init__(self, items: list[int], rng: np.random.Generator, config=None):
        self.items, self.rng = sorted(items), rng

    def fit(self, clicks: list[tuple[int, int]], seed: int | None = None) -> None:
        self.seed = None

    def rank(self, user: int, exclude: set[int], n: int) -> list[int]:
        candidates = [i for i in self.items if i not in exclude]
        if not candidates:
            return []
        picked = self.rng.choice(len(candidates), size=min(n, len(candidates)), replace=False)
        return [candidates[i] for i in picked]


class PopularityRecommender:
    def __init__(self, items: list[int], rng: np.random.Generator, config=None):
        self.items, self.rng = sorted(items), rng
        self.order = list(self.items)

    def fit(self, clicks: list[tuple[int, int]], seed: int | None = None) -> None:
        self.seed = None
        counts = Counter(item for _, item in clicks)
        self.order = sorted(self.items, key=lambda i: (-counts[i], i))

    def rank(self, user: int, exclude: set[int], n: int) -> list[int]:
        out = []
        for item in self.order:
            if item not in exclude:
                out.append(item)
                if len(out) == n:
                    break
        return out


class MFRecommender:
    """ALS on the binary user x item click matrix (implicit), seeded from the run's generator."""

    def __init__(self, items: list[int], rng: np.random.Generator, config):
        self.items, self.rng, self.config = sorted(items), rng, config
        self.item_index = {item: i for i, item in enumerate(self.items)}
        self.popular = PopularityRecommender(items, rng)
        self.model, self.user_index, self.matrix, self.seed = None, {}, None, None
        self.fits = 0

    def fit(self, clicks: list[tuple[int, int]], seed: int | None = None) -> None:
        import scipy.sparse as sp
        from implicit.als import AlternatingLeastSquares
        from threadpoolctl import threadpool_limits

        self.popular.fit(clicks)
        users = sorted({u for u, _ in clicks})
        self.user_index = {u: i for i, u in enumerate(users)}
        pairs = {(self.user_index[u], self.item_index[i]) for u, i in clicks if i in self.item_index}
        rows, cols = zip(*sorted(pairs), strict=True) if pairs else ((), ())
        self.matrix = sp.csr_matrix(
            (np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(len(users), len(self.items))
        )
        self.seed = int(self.rng.integers(2**31 - 1)) if seed is None else seed  # from the run's generator
        self.model = AlternatingLeastSquares(
            factors=self.config.factors,
            iterations=self.config.iterations,
            regularization=self.config.regularization,
            random_state=self.seed,
            use_gpu=False,  # numpy factors, and the same on every machine
        )
        with threadpool_limits(1, "blas"):  # implicit's advice; also keeps runs repeatable
            self.model.fit(self.matrix, show_progress=False)
        self.fits += 1

    def scores(self, user: int) -> np.ndarray | None:
        """The model's score of every item for this user (None for a user without clicks)."""
        if self.model is None or user not in self.user_index:
            return None
        return np.asarray(self.model.item_factors @ self.model.user_factors[self.user_index[user]])

    def rank(self, user: int, exclude: set[int], n: int) -> list[int]:
        scores = self.scores(user)
        if scores is None:
            return self.popular.rank(user, exclude, n)
        out = []
        for index in top_indices(scores):  # best first, ties by item id
            item = self.items[index]
            if item not in exclude:
                out.append(item)
                if len(out) == n:
                    break
        return out


RECOMMENDERS = {"random": RandomRecommender, "popularity": PopularityRecommender, "mf": MFRecommender}


def recommender_class(kind: str) -> type:
    """A built-in by name, or the class a ``package.module:Class`` / ``file.py:Class`` names."""
    if kind in RECOMMENDERS:
        return RECOMMENDERS[kind]
    from agents.plugins import load_class

    return load_class(kind)


class Feed:
    """Pages for each user: page_size - rec_random_k ranked items plus rec_random_k random unseen ones,
    never an item the user has watched or was shown on an earlier page of the same visit. ``counts``:
    where the refusals of the recommender's failures and bad pages are counted (the world's counts)."""

    def __init__(self, config, items: list[int], rng: np.random.Generator, counts: Counter | None = None):
        self.config, self.items, self.rng = config, sorted(items), rng
        self.catalogue = set(self.items)
        self.recommender = recommender_class(config.kind)(items, rng, config)
        self.fallback = RECOMMENDERS[config.fallback](items, rng, config)
        self.counts = Counter() if counts is None else counts
        self.fit_failed = False
        self.clicks: list[tuple[int, int]] = []  # history + simulated watches, in order

    def refuse(self, reason: str) -> None:
        self.counts[f"recommender_refused:{self.config.kind}:{reason}"] += 1

    def train(self, clicks: list[tuple[int, int]], seed: int | None = None) -> None:
        """Fit on these clicks; ``seed`` repeats an earlier fit exactly (a resumed run), otherwise the
        recommender draws one from the run's generator. A fit that raises is counted; the fallback
        serves the pages until a later fit succeeds."""
        self.clicks = list(clicks)
        self.fallback.fit(self.clicks)
        try:
            self.recommender.fit(self.clicks, seed)
            self.fit_failed = False
        except Exception as error:  # the plug-in's own error: counted and said, the run goes on
            if not self.counts[f"recommender_refused:{self.config.kind}:fit_raised"]:
                print(
                    f"warning: recommender {self.config.kind} failed to fit ({error!r}); "
                    f"{self.config.fallback} serves its pages until a fit succeeds (counted)",
                    file=sys.stderr,
                )
            self.refuse("fit_raised")
            self.fit_failed = True

    def ranked(self, user: int, exclude: set[int], n: int) -> list[int]:
        """The recommender's n items for this user, or the fallback's where it fails the protocol."""
        if self.fit_failed:
            self.refuse("unfitted")
            return self.fallback.rank(user, exclude, n)
        try:
            items = self.recommender.rank(user, exclude, n)
            items = [int(i) for i in items]
        except Exception:
            self.refuse("rank_raised")
            return self.fallback.rank(user, exclude, n)
        available = len(self.catalogue - exclude)
        reason = (
            "unknown_item"
            if any(i not in self.catalogue for i in items)
            else "excluded_item"
            if any(i in exclude for i in items)
            else "repeated_item"
            if len(set(items)) < len(items)
            else "too_few_items"
            if len(items) < min(n, available)
            else "too_many_items"
            if len(items) > n
            else None
        )
        if reason:
            self.refuse(reason)
            return self.fallback.rank(user, exclude, n)
        return items

    def page(self, user: int, exclude: set[int]) -> tuple[list[int], list[int]]:
        """(items, injected): the page in display order and which of them were injected at random."""
        k = min(self.config.rec_random_k, self.config.page_size)
        ranked = self.ranked(user, exclude, self.config.page_size - k)
        taken = exclude | set(ranked)
        pool = [i for i in self.items if i not in taken]
        injected = (
            [pool[i] for i in self.rng.choice(len(pool), size=min(k, len(pool)), replace=False)]
            if pool
            else []
        )
        return ranked + injected, injected
