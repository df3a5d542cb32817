"""A choice model fitted on real choices: which film of a page a MovieLens user watches next.

Where a small LLM cannot tell the film a person would pick, a model fitted on real data carries the
behaviour (the review simulator does the same for stars). It is fitted on choice pages built from real
ratings strictly before a moment (data_prep.choice_pairs.make_pages: the film a user rated among films
they had not rated that existed then), a logistic regression (scikit-learn) over what the page and the
user's past show, each as of the page's moment:

- the film's ratings so far (log 1 + n), whether it has none, its mean rating so far (shrunk to 3.5
  by three ratings), its ratings in the last year (log 1 + n), the years since its release;
- the share of the user's ratings in the film's genres, and the same over the films they rated 4 or
  more;
- the cosine of the film's text to the mean of the texts of the films the user rated (the embedding
  baseline's signal).

``score`` gives each film of a page its log-odds. In score mode the sandbox adds
``decision.choice_weight`` times it to the LLM's score of each film (0: the LLM alone); the sandbox's
tests choose the weight on validation users and report the model alone as a baseline row beside the
agents. In the world, a page's counts are the site's (the ratings before the start and the run's), and a
user's past is its real history and its watches in the run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from data_prep.movielens import NO_GENRE, title_year

YEAR = 365 * 86400
FEATURES = (
    "log_ratings",
    "no_ratings",
    "mean_rating",
    "log_ratings_last_year",
    "years_since_release",
    "genre_share",
    "liked_genre_share",
    "text_similarity",
)


@dataclass
class Past:
    """What a choice can see of a user at a moment: the films rated (and their stars), oldest first."""

    films: list[int]
    stars: list[float]


class ChoiceModel:
    def __init__(self, movies: dict, embed):
        """movies: {id: Movie}; embed: texts -> unit vectors (each film's text embedded once)."""
        self.movies, self.embed = movies, embed
        self.vectors: dict[int, np.ndarray] = {}
        self.model = None

    def vector(self, films: list[int]) -> np.ndarray:
        todo = [m for m in dict.fromkeys(films) if m not in self.vectors]
        if todo:
            for m, v in zip(
                todo, np.asarray(self.embed([self.movies[m].text() for m in todo]), dtype=float), strict=True
            ):
                self.vectors[m] = v / max(np.linalg.norm(v), 1e-12)
        return np.stack([self.vectors[m] for m in films]) if films else np.zeros((0, 1))

    def features(self, past: Past, page: list[int], counts: dict, recent: dict, year: int) -> np.ndarray:
        """One row per film of the page: counts {film: (ratings, mean)} and recent {film: ratings in the
        last year} as of the moment, of the given year."""
        genres: dict[str, float] = {}
        liked: dict[str, float] = {}
        for film, stars in zip(past.films, past.stars, strict=True):
            for g in self.movies[film].genres:
                if g != NO_GENRE:
                    genres[g] = genres.get(g, 0) + 1
                    if stars >= 4:
                        liked[g] = liked.get(g, 0) + 1
        total, total_liked = max(sum(genres.values()), 1), max(sum(liked.values()), 1)
        profile = self.vector(past.films).mean(axis=0) if past.films else None
        rows = []
        for film, vector in zip(page, self.vector(page), strict=True):
            n, mean = counts.get(film, (0, None))
            own = [g for g in self.movies[film].genres if g != NO_GENRE] or ["-"]
            released = title_year(self.movies[film].title)
            rows.append(
                [
                    math.log1p(n),
                    float(n == 0),
                    ((mean or 0) * n + 3.5 * 3) / (n + 3),
                    math.log1p(recent.get(film, 0)),
                    max(0, year - released) if released else 0.0,
                    sum(genres.get(g, 0) for g in own) / total / len(own),
                    sum(liked.get(g, 0) for g in own) / total_liked / len(own),
                    float(vector @ profile / max(np.linalg.norm(profile), 1e-12))
                    if profile is not None
                    else 0.0,
                ]
            )
        return np.asarray(rows, dtype=float)

    def fit(self, rows: np.ndarray, labels: np.ndarray) -> ChoiceModel:
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler

        self.model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000)).fit(rows, labels)
        return self

    def score(self, past: Past, page: list[int], counts: dict, recent: dict, year: int) -> np.ndarray:
        """The log-odds of each film of the page."""
        return self.model.decision_function(self.features(past, page, counts, recent, year))

    def coefficients(self) -> dict[str, float]:
        """The fitted weights per standardised feature (for the run's record)."""
        weights = self.model[-1].coef_[0]
        return {name: round(float(w), 4) for name, w in zip(FEATURES, weights, strict=True)}


def as_of(data, films: list[int], moment: int) -> tuple[dict, dict, int]:
    """The counts a page shows at ``moment`` (data_prep.movielens.Popularity) and the last year's."""
    popularity = data.popularity()
    counts = {m: (popularity.count(m, moment), popularity.mean(m, moment)) for m in films}
    recent = {m: counts[m][0] - popularity.count(m, moment - YEAR) for m in films}
    from datetime import UTC, datetime

    return counts, recent, datetime.fromtimestamp(moment, UTC).year


def agent_past(agent) -> Past:
    """A sandbox agent's past for a choice: its user's real history, then its watches in the run."""
    return Past(
        [m for m, _, _ in agent.profile.history] + agent.watched,
        [s for _, s, _ in agent.profile.history] + [s for _, s, _ in agent.rated],
    )


def past_of(data, user: int, moment: int) -> Past:
    history = data.history(user, moment)
    return Past([r.movie for r in history], [r.stars for r in history])


def fit_on_data(
    data, before: int, embed, rng: np.random.Generator, pages: int = 3000, min_history: int = 5
) -> ChoiceModel:
    """A choice model fitted on ``pages`` real choices strictly before ``before`` (their pages as the
    choice pairs build them)."""
    from data_prep.choice_pairs import draw_targets, make_pages

    targets = draw_targets(data, before, min_history, 40, pages, rng)
    built, _ = make_pages(data, targets, before, rng)
    model = ChoiceModel(data.movies, embed)
    rows, labels = [], []
    for target, page in built:
        counts, recent, year = as_of(data, page, target.ts)
        rows.append(model.features(past_of(data, target.user, target.ts), page, counts, recent, year))
        labels += [int(m == target.movie) for m in page]
    return model.fit(np.concatenate(rows), np.asarray(labels, dtype=int))
