"""data_prep.movielens: the loader keeps tags with their time and shows only the older ones, counts and
means before a moment, a user's history strictly before a moment and the taste and features it shows,
on hand-made files and on the real sample."""

import numpy as np
import pytest

from data_prep import movielens
from data_prep.movielens import Movie, MovieLens, Rating, data_features, history_importance, user_at


def write(folder, ratings, tags="userId,movieId,tag,timestamp\n"):
    (folder / "movies.csv").write_text(
        "movieId,title,genres\n1,Alpha (1990),Drama|Comedy\n2,Beta (1991),Horror\n3,Gamma (1992),(no genres listed)\n"
        "4,Delta (1993),Drama\n"
    )
    (folder / "ratings.csv").write_text("userId,movieId,rating,timestamp\n" + ratings)
    (folder / "tags.csv").write_text(tags)
    return movielens.load(folder)


def test_tags_keep_their_time_and_a_text_shows_only_the_older_ones(tmp_path):
    data = write(
        tmp_path,
        "1,1,4.0,10\n",
        "userId,movieId,tag,timestamp\n5,1,funny,30\n6,1,dark,20\n7,1,funny,10\n8,1,bad line,x\n9,77,lost,5\n",
    )
    alpha = data.movies[1]
    assert [(t.text, t.ts) for t in alpha.tags] == [
        ("funny", 10),
        ("dark", 20),
    ]  # each text at its first time
    assert alpha.text() == "Alpha (1990) (Drama, Comedy)"  # no moment: no tags
    assert alpha.text(tags_before=10) == "Alpha (1990) (Drama, Comedy)"  # strictly older only
    assert alpha.text(tags_before=21) == "Alpha (1990) (Drama, Comedy); tags: funny, dark"
    assert data.movies[3].text() == "Gamma (1992)"  # no genre is not a genre
    assert data.counts["rejected:malformed"] == 1 and data.counts["rejected:unknown_movie"] == 1
    assert [r["line"] for r in data.rejects] == [5, 6]  # kept where a person can see them


def test_counts_means_and_history_see_only_what_is_strictly_older(tmp_path):
    data = write(tmp_path, "1,1,4.0,10\n2,1,2.0,20\n3,1,5.0,20\n1,2,1.0,30\n1,4,3.0,30\n")
    popularity = data.popularity()
    assert (popularity.count(1, 20), popularity.mean(1, 20)) == (1, 4.0)
    assert (popularity.count(1, 21), popularity.mean(1, 21)) == (3, pytest.approx(11 / 3))
    assert (popularity.count(2, 30), popularity.mean(2, 30)) == (0, None)
    assert [r.movie for r in data.history(1, 30)] == [1] and [r.movie for r in data.history(1, 31)] == [
        1,
        2,
        4,
    ]
    assert data.end == 31 and movielens.parse_moment(None, data) == 31
    assert movielens.parse_moment("1970-01-02", data) == 86400 and movielens.parse_moment(5, data) == 5
    with pytest.raises(ValueError, match="'soon' is not a date"):
        movielens.parse_moment("soon", data)


def test_a_user_at_a_moment_shows_taste_and_features_from_the_older_ratings_only():
    movies = {
        1: Movie(1, "A", ["Drama"]), 2: Movie(2, "B", ["Drama"]), 3: Movie(3, "C", ["Horror"]),
        4: Movie(4, "D", ["Horror"]), 5: Movie(5, "E", ["Horror"]), 6: Movie(6, "F", ["Comedy"]),
    }  # fmt: skip
    ratings = [
        Rating(1, m, s, t)
        for m, s, t in [(1, 5, 1), (2, 4.5, 2), (3, 1, 3), (4, 2, 4), (5, 1.5, 5), (6, 5, 9)]
    ]
    data = MovieLens(movies, ratings, [], None)
    now = user_at(data, 1, 9)
    assert [r.movie for r in now.history] == [
        1,
        2,
        3,
        4,
        5,
    ]  # film 6 is rated at the moment itself: not older
    assert now.interests == ["Drama"] and now.dislikes == ["Horror"] and now.mean_stars == 2.8
    assert now.features == []  # no one had rated anything before the moment's year: no thresholds
    assert history_importance(2.8, 2.8) == 0.5 and history_importance(5.0, 2.8) == 1.0
    assert history_importance(3.8, 2.8) == pytest.approx(0.75)


def test_the_real_sample_loads_with_its_one_bad_row_kept_aside(raw):
    data = movielens.load(raw / "movielens_latest_small")
    assert (data.counts["ratings"], data.counts["users"], data.counts["movies"]) == (100836, 610, 9742)
    assert data.rejects[0]["reason"] == "unknown_movie" and data.rejects[0]["row"]["userId"] == "999"
    keys = [(r.ts, r.movie) for r in data.ratings]
    assert keys == sorted(keys)  # time order, ties by movie id
    tagged = [m for m in data.movies.values() if m.tags]
    assert tagged and all(np.all(np.diff([t.ts for t in m.tags]) >= 0) for m in tagged)
    first = min(t.ts for m in tagged for t in m.tags)
    assert all("tags:" not in m.text(tags_before=first) for m in tagged)  # nothing before the first tag


def test_feature_thresholds_are_tertiles_of_the_users_before_the_moments_year():
    from data_prep.movielens import thresholds

    year = 365 * 86400  # 1971-01-01
    genres = ["Drama", "Horror", "Comedy", "Drama"]
    movies = {i: Movie(i, f"M{i}", [genres[i % 4]]) for i in range(8)}
    past = [  # users 2-5 in 1970: 1-4 ratings, genre entropy 0, 0, 0.92 (2:1), 1.5 bits, means 1, 2, 3, 4
        (2, 0, 1.0), (3, 0, 2.0), (3, 4, 2.0), (4, 0, 3.0), (4, 1, 3.0), (4, 4, 3.0),
        (5, 0, 4.0), (5, 1, 4.0), (5, 2, 4.0), (5, 3, 4.0),
    ]  # fmt: skip
    ratings = [Rating(u, m, s, 10 + i) for i, (u, m, s) in enumerate(past)]
    ratings += [Rating(1, m, 2.0, year + 10 + m) for m in (0, 1, 4)]  # user 1 in 1971: 3, 2:1, mean 2
    ratings += [Rating(2, m, 5.0, year + 20 + m) for m in range(8)]  # 1971: not before the year's start
    data = MovieLens(movies, ratings, [], None)
    limits = thresholds(data, year + 100)
    assert (limits.users, limits.watcher_min_ratings, limits.critic_max_mean) == (4, 3.0, 2.0)
    assert limits.explorer_min_entropy == pytest.approx(-(2 / 3) * np.log2(2 / 3) - (1 / 3) * np.log2(1 / 3))
    assert user_at(data, 1, year + 100).features == ["Watcher", "Explorer", "Critic"]
    assert data_features(2, 0.9, 2.5, limits) == []
    assert thresholds(data, year - 1).users == 0  # 1970: no one before it
