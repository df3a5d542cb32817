"""MovieLens (the ml-latest-small layout: movies.csv, ratings.csv, tags.csv) and what a user of it is at
a moment: the data the sandbox, its tests and its training pairs share.

A rating whose movie is not in movies.csv, or a malformed line, is not used: it is counted by reason
and kept in ``rejects`` with its file and line (the shared copy has one such row, a fake
``999,999999,...`` appended by its uploader; see its SOURCE.md). The caller writes the rejects where a
person can see them. Ratings are ordered by (timestamp, movieId): ties in rating time are broken by
the movie id, a stated rule that the tests' hold-outs rely on. Tags keep their time: a movie's text
shows only the tags written strictly before the moment asked for (``Movie.text(tags_before=t)``), so a
past-only prediction never sees a tag from after its moment.

``user_at(data, user, t)`` is a user as a data-aligned agent starts at t: the ratings strictly older
than t, the taste they show (most liked and least liked genres, the mean rating) and the behaviour
features the data can show (``data_features``). Another MovieLens release works once converted to this
layout (the same three CSV files and columns).

Without a local copy, ``fetch`` downloads ml-latest-small (about 1 MB) from GroupLens, the publisher
(``python -m agents.sandbox run --fetch-missing`` does it when the configured folder is missing).
"""

from __future__ import annotations

import bisect
import csv
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

URL = "https://files.grouplens.org/datasets/movielens/ml-latest-small.zip"
FILES = ("movies.csv", "ratings.csv", "tags.csv", "links.csv", "README.txt")
NO_GENRE = "(no genres listed)"
MAX_TAGS = 3  # tags a movie's text shows


@dataclass
class Tag:
    text: str
    ts: int


@dataclass
class Movie:
    id: int
    title: str
    genres: list[str]
    tags: list[Tag] = field(default_factory=list)  # distinct texts, each at its first time, oldest first

    def text(self, tags_before: int | None = None) -> str:
        """Title and genres; with ``tags_before``, the first three tags written strictly before that moment
        (MovieLens has no descriptions; tags are the only words about a film, and they carry a time)."""
        shown = (
            [t.text for t in self.tags if t.ts < tags_before][:MAX_TAGS] if tags_before is not None else []
        )
        tags = f"; tags: {', '.join(shown)}" if shown else ""
        genres = ", ".join(g for g in self.genres if g != NO_GENRE)
        return f"{self.title} ({genres}){tags}" if genres else f"{self.title}{tags}"


@dataclass
class Rating:
    user: int
    movie: int
    stars: float
    ts: int


def title_year(title: str) -> int | None:
    """The release year MovieLens puts at the end of a title, "Heat (1995)"; None when there is none."""
    match = re.search(r"\((\d{4})(?:[-\u2013]\d{0,4})?\)\s*$", title)
    return int(match.group(1)) if match else None


def existing_films(data: MovieLens, moment: int) -> list[int]:
    """Films that existed before ``moment``: someone had rated one, or its title's year is before the
    moment's year. A page's distractors come from these (a film released later would give itself away),
    and not only from the rated ones: a film nobody had rated yet shows "no ratings yet", like a new
    film a user really watched next."""
    year = datetime.fromtimestamp(moment, UTC).year
    first = data.first_rated()
    return [
        m for m, movie in sorted(data.movies.items())
        if (m in first and first[m] < moment) or ((title_year(movie.title) or year) < year)
    ]  # fmt: skip


class Popularity:
    """How many ratings each movie had strictly before a moment, and their mean: one binary search."""

    def __init__(self, ratings: list[Rating]):
        self.times: dict[int, list[int]] = {}
        self.sums: dict[int, list[float]] = {}
        for r in ratings:  # time order
            self.times.setdefault(r.movie, []).append(r.ts)
            sums = self.sums.setdefault(r.movie, [0.0])
            sums.append(sums[-1] + r.stars)

    def count(self, movie: int, before: int) -> int:
        return bisect.bisect_left(self.times.get(movie, []), before)

    def mean(self, movie: int, before: int) -> float | None:
        n = self.count(movie, before)
        return self.sums[movie][n] / n if n else None


@dataclass
class MovieLens:
    movies: dict[int, Movie]
    ratings: list[Rating]  # ordered by (ts, movie)
    rejects: list[dict]
    counts: Counter
    _by_user: dict[int, list[Rating]] | None = None
    _times: dict[int, list[int]] | None = None
    _popularity: Popularity | None = None
    _first: dict[int, int] | None = None
    _thresholds: dict[int, Thresholds] = field(default_factory=dict)

    def by_user(self) -> dict[int, list[Rating]]:
        """Each user's ratings in time order (ties by movie id); built once."""
        if self._by_user is None:
            self._by_user = {}
            for rating in self.ratings:
                self._by_user.setdefault(rating.user, []).append(rating)
        return self._by_user

    def history(self, user: int, before: int) -> list[Rating]:
        """The user's ratings strictly older than ``before``, in time order."""
        if self._times is None:
            self._times = {u: [r.ts for r in rs] for u, rs in self.by_user().items()}
        return self.by_user().get(user, [])[: bisect.bisect_left(self._times.get(user, []), before)]

    def first_rated(self) -> dict[int, int]:
        """Each rated film's first rating time."""
        if self._first is None:
            self._first = {}
            for r in self.ratings:  # time order
                self._first.setdefault(r.movie, r.ts)
        return self._first

    def popularity(self) -> Popularity:
        if self._popularity is None:
            self._popularity = Popularity(self.ratings)
        return self._popularity

    @property
    def end(self) -> int:
        """A moment after every rating: a run that starts here carries each user's whole history."""
        return self.ratings[-1].ts + 1 if self.ratings else 0  # ratings are in time order


def load_movies(folder: str | Path, reject=None) -> dict[int, Movie]:
    """movies.csv alone (titles and genres); a malformed line goes to ``reject(file, line, reason, row)``."""
    movies: dict[int, Movie] = {}
    with open(Path(folder) / "movies.csv", newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                movie = Movie(int(row["movieId"]), row["title"], row["genres"].split("|"))
            except (KeyError, TypeError, ValueError, AttributeError):
                if reject:
                    reject("movies.csv", line, "malformed", row)
                continue
            movies[movie.id] = movie
    return movies


def load(folder: str | Path) -> MovieLens:
    folder = Path(folder)
    rejects: list[dict] = []
    counts: Counter = Counter()

    def reject(file: str, line: int, reason: str, row) -> None:
        counts[f"rejected:{reason}"] += 1
        rejects.append({"file": file, "line": line, "reason": reason, "row": row})

    movies = load_movies(folder, reject)
    tags_path = folder / "tags.csv"
    if tags_path.exists():
        tags = []
        with open(tags_path, newline="", encoding="utf-8") as handle:
            for line, row in enumerate(csv.DictReader(handle), start=2):
                try:
                    movie_id, tag, ts = int(row["movieId"]), row["tag"].strip(), int(row["timestamp"])
                except (KeyError, TypeError, ValueError, AttributeError):
                    reject("tags.csv", line, "malformed", row)
                    continue
                if movie_id not in movies:
                    reject("tags.csv", line, "unknown_movie", row)
                    continue
                if not tag:
                    reject("tags.csv", line, "empty_tag", row)
                    continue
                tags.append((ts, movie_id, tag))
        for ts, movie_id, tag in sorted(tags):  # each distinct text at the first time it was written
            if all(t.text != tag for t in movies[movie_id].tags):
                movies[movie_id].tags.append(Tag(tag, ts))
    ratings: list[Rating] = []
    with open(folder / "ratings.csv", newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                rating = Rating(
                    int(row["userId"]), int(row["movieId"]), float(row["rating"]), int(row["timestamp"])
                )
            except (KeyError, TypeError, ValueError):
                reject("ratings.csv", line, "malformed", row)
                continue
            if rating.movie not in movies:
                reject("ratings.csv", line, "unknown_movie", row)
                continue
            if not 0.5 <= rating.stars <= 5:
                reject("ratings.csv", line, "stars_out_of_range", row)
                continue
            ratings.append(rating)
    ratings.sort(key=lambda r: (r.ts, r.movie))
    counts.update(movies=len(movies), ratings=len(ratings), users=len({r.user for r in ratings}))
    return MovieLens(movies, ratings, rejects, counts)


def day(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d")


def iso(ts: int) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat()


def parse_moment(value: str | int | None, data: MovieLens) -> int:
    """A moment from a config: None is just after the data's last rating, a whole number is a Unix time,
    a string an ISO date (UTC)."""
    if value is None:
        return data.end
    if isinstance(value, int):
        return value
    try:
        return int(datetime.fromisoformat(value).replace(tzinfo=UTC).timestamp())
    except ValueError:
        raise ValueError(f"{value!r} is not a date (YYYY-MM-DD) or a Unix time") from None


# -- a user at a moment ----------------------------------------------------------------------------------

# Behaviour features the data shows: a Watcher's count of ratings and an Explorer's genre entropy are in
# the top third of the users who had rated something by then, a Critic's mean stars in the bottom third.
# "By then" is the start of the moment's year (UTC): thresholds from the past only, the same for every
# moment of a year (so a choice pair at t and the sandbox's agent at t agree), computed once per year.


@dataclass(frozen=True)
class Thresholds:
    """The feature thresholds among the users with a rating strictly before ``before`` (``users`` of
    them; with none, no user shows a feature)."""

    before: int
    users: int
    watcher_min_ratings: float
    explorer_min_entropy: float
    critic_max_mean: float


@dataclass
class UserAt:
    """A MovieLens user as a data-aligned agent starts at ``at``: everything here is strictly older."""

    user: int
    at: int
    history: list[Rating]  # time order
    interests: list[str]  # the genres of the films they liked most often, most frequent first
    dislikes: list[str]  # genres with the lowest mean rating (at least 3 ratings, below their own mean)
    mean_stars: float | None  # rounded to 2 decimals
    genre_entropy: float  # bits, over the genres of everything they rated
    features: list[str]  # what the data shows: Watcher, Explorer, Critic


def genre_counts(ratings: list[Rating], movies: dict[int, Movie]) -> Counter:
    return Counter(g for r in ratings for g in movies[r.movie].genres if g != NO_GENRE)


def entropy(counts: Counter) -> float:
    total = sum(counts.values())
    return -sum(c / total * math.log2(c / total) for c in counts.values()) if total else 0.0


def year_start(t: int) -> int:
    """The first second (UTC) of the year of ``t``."""
    return int(datetime(datetime.fromtimestamp(t, UTC).year, 1, 1, tzinfo=UTC).timestamp())


def thresholds(data: MovieLens, at: int) -> Thresholds:
    """The feature thresholds for a moment ``at``: tertiles over every user's ratings strictly before the
    start of its year (cached per year on ``data``)."""
    before = year_start(at)
    cache = data._thresholds
    if before not in cache:
        histories = [[r for r in rs if r.ts < before] for rs in data.by_user().values()]
        histories = [h for h in histories if h]
        if not histories:
            cache[before] = Thresholds(before, 0, math.inf, math.inf, -math.inf)
        else:
            counts = [len(h) for h in histories]
            breadth = [entropy(genre_counts(h, data.movies)) for h in histories]
            means = [sum(r.stars for r in h) / len(h) for h in histories]
            top, bottom = 2 / 3, 1 / 3
            cache[before] = Thresholds(
                before,
                len(histories),
                float(np.quantile(counts, top)),
                float(np.quantile(breadth, top)),
                float(np.quantile(means, bottom)),
            )
    return cache[before]


def data_features(n: int, genre_entropy: float, mean_stars: float | None, limits: Thresholds) -> list[str]:
    """Watcher: rates a lot (at least ``limits.watcher_min_ratings``); Explorer: rates widely across
    genres (entropy at least ``explorer_min_entropy``); Critic: rates low (mean at most
    ``critic_max_mean``). MovieLens has no chats or posts: Chatter and Poster are the sandbox's to
    sample."""
    out = []
    if n >= limits.watcher_min_ratings:
        out.append("Watcher")
    if n and genre_entropy >= limits.explorer_min_entropy:
        out.append("Explorer")
    if mean_stars is not None and mean_stars <= limits.critic_max_mean:
        out.append("Critic")
    return out


def user_at(data: MovieLens, user: int, at: int, liked: float = 4.0, top: int = 3) -> UserAt:
    """The user's history strictly before ``at`` and the taste it shows (interests: genres of the films
    rated at least ``liked``, most frequent first, ties by name; dislikes: the genres of at least three of
    their films whose mean rating is lowest and below the user's own mean)."""
    history = data.history(user, at)
    movies = data.movies
    liked_genres = genre_counts([r for r in history if r.stars >= liked], movies)
    interests = [g for g, _ in sorted(liked_genres.items(), key=lambda kv: (-kv[1], kv[0]))[:top]]
    mean = round(sum(r.stars for r in history) / len(history), 2) if history else None
    by_genre: dict[str, list[float]] = {}
    for r in history:
        for g in movies[r.movie].genres:
            if g != NO_GENRE:
                by_genre.setdefault(g, []).append(r.stars)
    low = sorted(
        (sum(v) / len(v), g) for g, v in by_genre.items() if len(v) >= 3 and sum(v) / len(v) < (mean or 0)
    )
    dislikes = [g for _, g in low if g not in interests][:top]
    breadth = entropy(genre_counts(history, movies))
    return UserAt(
        user, at, history, interests, dislikes, mean, breadth,
        data_features(len(history), breadth, mean, thresholds(data, at)),
    )  # fmt: skip


def history_importance(stars: float, mean: float | None) -> float:
    """How memorable a rated film is, in (0, 1]: 0.5 for a film rated at the user's own mean, rising to 1
    for one rated two stars or more away from it (a loved or hated film stays in mind)."""
    if mean is None:
        return 0.5
    return 0.5 + 0.5 * min(1.0, abs(stars - mean) / 2)


def fetch(out: str | Path, url: str = URL) -> Path:
    """Download the ml-latest-small zip and extract its files into ``out``; an unreachable server or a
    zip without the expected files is an error saying what was tried."""
    import io
    import urllib.request
    import zipfile

    out = Path(out)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            archive = zipfile.ZipFile(io.BytesIO(response.read()))
    except (OSError, zipfile.BadZipFile) as err:
        raise SystemExit(
            f"error: could not fetch MovieLens from {url} ({type(err).__name__}: {err}); place a copy of "
            "ml-latest-small in ../shared/data/raw/movielens_latest_small or set data: in the config"
        ) from err
    members = {Path(name).name: name for name in archive.namelist() if Path(name).name in FILES}
    missing = [name for name in ("movies.csv", "ratings.csv") if name not in members]
    if missing:
        raise SystemExit(f"error: {url} has no {', '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    for name, member in members.items():
        (out / name).write_bytes(archive.read(member))
    return out
