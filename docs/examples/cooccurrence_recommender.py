"""A recommender of your own in the sandbox, by import path (docs/bring_your_own.md):

    python -m agents.sandbox run --config configs/sandbox/movielens.yaml --out runs/byo/cooccurrence \\
        --set recommender.kind=docs/examples/cooccurrence_recommender.py:CoOccurrence \\
              "recommender.options={neighbours: 50}" --rounds 3

Item-to-item co-occurrence: a user's next films are those most often watched by the people who watched
the user's recent films. It follows the protocol of agents/sandbox/recommender.py and imports nothing
from this project.
"""

from collections import Counter, defaultdict


class CoOccurrence:
    def __init__(self, items, rng, config):
        self.items = sorted(items)
        self.neighbours = int(config.options.get("neighbours", 50))  # the user's most recent films used
        self.by_user, self.watchers, self.popular = {}, {}, list(self.items)

    def fit(self, clicks, seed=None):
        self.seed = None  # deterministic: nothing to repeat
        self.by_user, self.watchers = defaultdict(list), defaultdict(set)
        for user, item in clicks:
            self.by_user[user].append(item)
            self.watchers[item].add(user)
        counts = Counter(item for _, item in clicks)
        self.popular = sorted(self.items, key=lambda i: (-counts[i], i))

    def rank(self, user, exclude, n):
        recent = self.by_user.get(user, [])[-self.neighbours :]
        scores = Counter()
        for item in recent:
            for other_user in self.watchers[item]:
                scores.update(self.by_user[other_user][-self.neighbours :])
        order = sorted(scores, key=lambda i: (-scores[i], i)) + self.popular
        out, taken = [], set(exclude)
        for item in order:
            if item not in taken:
                out.append(item)
                taken.add(item)
                if len(out) == n:
                    break
        return out
