"""The sandbox's recommender: one interface, three plug-ins, and the feed that pages through it.

    rank(user, exclude, n) -> item ids, best first      fit(clicks) -> retrain on (user, item) pairs

- ``random``: uniform over the items not excluded (the run's generator);
- ``popularity``: most clicked first (ties by item id);
- ``mf``: implicit-feedback matrix factorisation (ALS from the ``implicit`` library), trained on the
  users' real history and then retrained on it plus the simulated clicks every ``retrain_every``
  rounds (YuLan-Rec's MF was never trained). A user with no clicks gets the popularity ranking.

``Feed`` serves pages of ``page_size``: ``rec_random_k`` of each page are random items the user has not
seen, the rest the recommender's ranking (injection that actually happens; tested).

Another recommender plugs in with the same two methods. RecBole, for example: train a model on the
same interactions (RecBole's atomic files: user_id, item_id), and in ``rank`` score all items with
``model.full_sort_predict`` for the user, mask ``exclude``, take the top n; ``fit`` re-runs its trainer
on the clicks. Register it in ``RECOMMENDERS``.
"""

from __future__ import annotations

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


class Feed:
    """Pages for each user: page_size - rec_random_k ranked items plus rec_random_k random unseen ones,
    never an item the user has watched or was shown on an earlier page of the same visit."""

    def __init__(self, config, items: list[int], rng: np.random.Generator):
        self.config, self.items, self.rng = config, sorted(items), rng
        self.recommender = RECOMMENDERS[config.kind](items, rng, config)
        self.clicks: list[tuple[int, int]] = []  # history + simulated watches, in order

    def train(self, clicks: list[tuple[int, int]], seed: int | None = None) -> None:
        """Fit on these clicks; ``seed`` repeats an earlier fit exactly (a resumed run), otherwise the
        recommender draws one from the run's generator."""
        self.clicks = list(clicks)
        self.recommender.fit(self.clicks, seed)

    def page(self, user: int, exclude: set[int]) -> tuple[list[int], list[int]]:
        """(items, injected): the page in display order and which of them were injected at random."""
        k = min(self.config.rec_random_k, self.config.page_size)
        ranked = self.recommender.rank(user, exclude, self.config.page_size - k)
        taken = exclude | set(ranked)
        pool = [i for i in self.items if i not in taken]
        injected = (
            [pool[i] for i in self.rng.choice(len(pool), size=min(k, len(pool)), replace=False)]
            if pool
            else []
        )
        return ranked + injected, injected
