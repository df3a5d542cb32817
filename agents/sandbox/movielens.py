"""MovieLens (ml-latest-small layout: movies.csv, ratings.csv, tags.csv) for the sandbox.

A rating whose movie is not in movies.csv, or a malformed line, is not used: it is counted by reason
and kept in ``rejects`` with its file and line (the shared copy has one such row, a fake
``999,999999,...`` appended by its uploader; see its SOURCE.md). The caller writes the rejects where a
person can see them. Ratings are ordered by (timestamp, movieId): ties in rating time are broken by
the movie id, a stated rule that later tests (the discrimination test's hold-out) rely on.

Without a local copy, ``fetch`` downloads ml-latest-small (about 1 MB) from GroupLens, the publisher
(``python -m agents.sandbox run --fetch-missing`` does it when the configured folder is missing).
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

URL = "https://files.grouplens.org/datasets/movielens/ml-latest-small.zip"
FILES = ("movies.csv", "ratings.csv", "tags.csv", "links.csv", "README.txt")


@dataclass
class Movie:
    id: int
    title: str
    genres: list[str]
    tags: list[str] = field(default_factory=list)

    def text(self, tags: bool = True) -> str:
        """What search and embeddings read: title, genres and (unless ``tags=False``) the first ten
        user tags (MovieLens has no descriptions). Tags carry no time here: a test that must see only
        the past (eval.discrimination) reads the text without them."""
        tags = f"; tags: {', '.join(self.tags[:10])}" if tags and self.tags else ""
        return f"{self.title} ({', '.join(self.genres)}){tags}"


@dataclass
class Rating:
    user: int
    movie: int
    stars: float
    ts: int


@dataclass
class MovieLens:
    movies: dict[int, Movie]
    ratings: list[Rating]  # ordered by (ts, movie)
    rejects: list[dict]
    counts: Counter

    def by_user(self) -> dict[int, list[Rating]]:
        out: dict[int, list[Rating]] = {}
        for rating in self.ratings:
            out.setdefault(rating.user, []).append(rating)
        return out


def load_movies(folder: str | Path, reject=None) -> dict[int, Movie]:
    """movies.csv alone (titles and genres); a malformed line goes to ``reject(file, line, reason, row)``."""
    movies: dict[int, Movie] = {}
    with open(Path(folder) / "movies.csv", newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                movie = Movie(int(row["movieId"]), row["title"], row["genres"].split("|"))
            except (KeyError, TypeError, ValueError):
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
        with open(tags_path, newline="", encoding="utf-8") as handle:
            for line, row in enumerate(csv.DictReader(handle), start=2):
                try:
                    movie_id, tag = int(row["movieId"]), row["tag"].strip()
                except (KeyError, TypeError, ValueError, AttributeError):
                    reject("tags.csv", line, "malformed", row)
                    continue
                if movie_id in movies and tag and tag not in movies[movie_id].tags:
                    movies[movie_id].tags.append(tag)
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
