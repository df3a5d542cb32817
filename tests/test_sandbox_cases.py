"""What the sandbox's tests share: eligible users whose held-out ratings all come after --after, test and
validation users drawn disjoint with the seed, and the adapter check that refuses an adapter trained on
anything at or after --after, on other data, or with other prompt settings."""

import json
from collections import Counter

import pytest

from agents.sandbox.config import load_config
from data_prep.movielens import Movie, MovieLens, Rating
from eval.sandbox.cases import check_adapter, data_digest, draw_users, eligible_users


def tiny():
    movies = {i: Movie(i, f"M{i}", ["Drama"]) for i in range(1, 20)}
    ratings = [Rating(1, m, 4.0, 10 * m) for m in range(1, 8)]  # user 1: 7 ratings, times 10..70
    ratings += [Rating(2, m, 3.0, 100 + m) for m in range(1, 8)]  # user 2: times 101..107
    ratings += [Rating(3, m, 3.0, 200) for m in range(1, 4)]  # user 3: three ratings, one moment
    ratings.sort(key=lambda r: (r.ts, r.movie))
    return MovieLens(movies, ratings, [], Counter())


def test_eligible_users_have_their_held_out_part_after_the_date_and_enough_older_ratings():
    data = tiny()
    # held 2: user 1's cutoff is 60, user 2's 106; both have 5 older ratings; user 3 has 3 ratings in all
    assert eligible_users(data, after=50, held=2, min_history=5) == [1, 2]
    assert eligible_users(data, after=61, held=2, min_history=5) == [2]  # user 1's held part starts at 60
    assert eligible_users(data, after=0, held=2, min_history=6) == []
    test, validation = draw_users(data, 0, 2, 5, 1, 1, seed=0)
    assert sorted(test + validation) == [1, 2] and not set(test) & set(validation)
    assert draw_users(data, 0, 2, 5, 1, 1, seed=0) == (test, validation)  # the seed decides
    with pytest.raises(SystemExit, match="2 test and 1 validation users asked for, but only 2 users"):
        draw_users(data, 0, 2, 5, 2, 1, seed=0)


def adapter(tmp_path, latest, data_sha, options=None, task="sandbox_choice"):
    folder = tmp_path / "adapter"
    folder.mkdir(exist_ok=True)
    (folder / "training_data.json").write_text(json.dumps({"latest_target_ts": latest}))
    settings = {"round_days": 1.0, "retrieve_top": 3, "short_term_capacity": 3, "recency_decay": 0.99}
    card = {"data": {"task": task, "data_sha256": data_sha, "options": {**settings, **(options or {})}}}
    (folder / "training_card.json").write_text(json.dumps(card))
    return str(folder)


def test_the_adapter_check_refuses_later_pairs_other_data_and_other_prompt_settings(raw, tmp_path):
    config = load_config("configs/sandbox/movielens.yaml", [f"data={raw / 'movielens_latest_small'}"])
    sha = data_digest(config.data)
    after = 1_262_304_000  # 2010-01-01
    assert check_adapter(adapter(tmp_path, after - 1, sha), after, config)["latest_target"] == "2009-12-31"
    with pytest.raises(SystemExit, match="trained on choices up to 2010-01-01, not all before 2010-01-01"):
        check_adapter(adapter(tmp_path, after, sha), after, config)
    with pytest.raises(SystemExit, match="pairs come from other data"):
        check_adapter(adapter(tmp_path, after - 1, "another"), after, config)
    with pytest.raises(SystemExit, match=r"other prompt settings .*'retrieve_top': \(5, 3\)"):
        check_adapter(adapter(tmp_path, after - 1, sha, {"retrieve_top": 5}), after, config)
    with pytest.raises(SystemExit, match="not trained on sandbox choice pairs"):
        check_adapter(adapter(tmp_path, after - 1, sha, task="review"), after, config)
    (tmp_path / "adapter" / "training_data.json").unlink()
    with pytest.raises(SystemExit, match="training_data.json is missing"):
        check_adapter(str(tmp_path / "adapter"), after, config)
    assert check_adapter(None, after, config) is None
