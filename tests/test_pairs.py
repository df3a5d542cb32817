"""Training pairs from several stores at once: each store blocks its own tasks, the card lists every source."""

import json
from collections import Counter

import pytest

from data_prep import pairs
from data_prep.tasks import read_tasks


def make_pairs(data: list, tasks: list, out) -> dict:
    argv = ["--data", *map(str, data), "--tasks", *map(str, tasks), "--out", str(out)]
    return pairs.main([*argv, "--k-user", "2", "--k-item", "1", "--max-tokens", "256"])


def rows(folder) -> list[dict]:
    return [json.loads(line) for s in ("train", "validation") for line in (folder / f"{s}.jsonl").open()]


@pytest.mark.slow
def test_pairs_from_several_stores_block_each_stores_own_tasks(yelp_store, make_tasks, tmp_path):
    a = make_tasks(yelp_store, tmp_path / "a", n=30, seed=1)
    b = make_tasks(yelp_store, tmp_path / "b", n=30, seed=2)
    one = make_pairs([yelp_store], [a], tmp_path / "one")
    both = make_pairs([yelp_store, yelp_store], [a, b], tmp_path / "both")
    assert [s["tasks"] for s in both["data"]] == [str(a), str(b)]
    assert both["data"][0]["examples"] == sum(one["examples"].values())
    assert sum(both["examples"].values()) == sum(s["examples"] for s in both["data"])
    # a review appears once per store that does not block its (user, item) pair, at most
    a_pairs = {(t["user_id"], t["item_id"]) for t in read_tasks(a)}
    b_pairs = {(t["user_id"], t["item_id"]) for t in read_tasks(b)}
    times = Counter((r["review_id"], r["user_id"], r["item_id"]) for r in rows(tmp_path / "both"))
    assert all(n <= ((u, i) not in a_pairs) + ((u, i) not in b_pairs) for (_, u, i), n in times.items())
    assert any((u, i) in a_pairs for _, u, i in times)  # a's tasks are training pairs of the other store
    assert {r["review_id"] for r in rows(tmp_path / "one")} <= {rid for rid, _, _ in times}
    with pytest.raises(SystemExit):
        make_pairs([yelp_store, yelp_store], [a], tmp_path / "bad")
