"""Training pairs from several stores at once: each store blocks its own tasks, the card lists every
source, and stores that share users are refused."""

import json

import pytest

from data_prep import build, pairs
from data_prep.tasks import read_tasks


def make_pairs(data: list, tasks: list, out) -> dict:
    argv = ["--data", *map(str, data), "--tasks", *map(str, tasks), "--out", str(out)]
    return pairs.main([*argv, "--k-user", "2", "--k-item", "1", "--max-tokens", "256"])


def rows(folder) -> list[dict]:
    return [json.loads(line) for s in ("train", "validation") for line in (folder / f"{s}.jsonl").open()]


@pytest.mark.slow
def test_pairs_from_several_stores_block_each_stores_own_tasks(raw, yelp_store, make_tasks, tmp_path):
    amazon = tmp_path / "amazon"
    build.main(
        ["--source", "amazon2018", "--input", str(raw / "amazon2018_5core_small"), "--out", str(amazon)]
    )
    ta = make_tasks(amazon, tmp_path / "ta", n=30, seed=1)
    ty = make_tasks(yelp_store, tmp_path / "ty", n=30, seed=2)
    one = make_pairs([amazon], [ta], tmp_path / "one")
    both = make_pairs([amazon, yelp_store], [ta, ty], tmp_path / "both")
    assert [s["tasks"] for s in both["data"]] == [str(ta), str(ty)]
    assert both["data"][0]["examples"] == sum(one["examples"].values())
    assert (
        sum(both["examples"].values())
        == sum(s["examples"] for s in both["data"])
        > both["data"][0]["examples"]
    )
    merged = rows(tmp_path / "both")
    assert {r["review_id"] for r in rows(tmp_path / "one")} <= {r["review_id"] for r in merged}
    blocked = {(t["user_id"], t["item_id"]) for folder in (ta, ty) for t in read_tasks(folder)}
    assert not blocked & {(r["user_id"], r["item_id"]) for r in merged}  # no task pair is a target
    with pytest.raises(SystemExit, match="share"):  # one store twice: its users on both sides
        make_pairs(
            [yelp_store, yelp_store],
            [ty, make_tasks(yelp_store, tmp_path / "ty2", n=30, seed=3)],
            tmp_path / "x",
        )
    with pytest.raises(SystemExit):
        make_pairs([amazon, yelp_store], [ta], tmp_path / "bad")


@pytest.mark.slow
def test_pairs_for_a_validation_folder_keep_out_both_folders_and_both_periods(yelp_store, tmp_path):
    from data_prep import split
    from data_prep.store import to_epoch

    tasks, val = tmp_path / "tasks", tmp_path / "val"
    test = split.main(
        f"--data {yelp_store} --out {tasks} --strategy temporal --cutoff 2016-06-01 --min-history 2".split()
    )
    drawn = split.main(f"--data {yelp_store} --out {val} --validation-for {tasks} --min-history 2".split())
    card = make_pairs([yelp_store], [val], tmp_path / "pairs")
    made = rows(tmp_path / "pairs")
    hidden = {(t["user_id"], t["item_id"]) for folder in (tasks, val) for t in read_tasks(folder)}
    assert made and not hidden & {(r["user_id"], r["item_id"]) for r in made}
    assert card["data"][0]["blocked_task_pairs"] == len(hidden)
    # nothing from the validation period either: the validation runs' adapter is as old as the tasks'
    start = drawn["validation_for"]["validation_cutoff"]
    assert to_epoch(start) < to_epoch(test["cutoff"]) and card["data"][0]["targets_before"] == start
    assert all(to_epoch(r["date"]) < to_epoch(start) for r in made)


def test_a_pair_never_shows_the_users_own_review_as_another_users(tmp_path):
    """A user who reviewed the item before: that review is theirs. It may be among their reviews; it is
    never under "What N other users wrote", where only other users' reviews of the item go."""
    from conftest import write_lines
    from transformers import AutoTokenizer

    from data_prep.offline_models import smollm2_offline
    from data_prep.store import ReviewStore

    day = lambda d: f"2020-01-{d:02d} 12:00:00"  # noqa: E731
    reviews = [
        {
            "review_id": "own1",
            "user_id": "u1",
            "business_id": "b0",
            "stars": 2.0,
            "text": "first visit",
            "date": day(1),
        },
        {
            "review_id": "oth1",
            "user_id": "u2",
            "business_id": "b0",
            "stars": 4.0,
            "text": "their visit",
            "date": day(2),
        },
        {
            "review_id": "own2",
            "user_id": "u1",
            "business_id": "b1",
            "stars": 3.0,
            "text": "elsewhere",
            "date": day(3),
        },
        {
            "review_id": "own3",
            "user_id": "u1",
            "business_id": "b0",
            "stars": 5.0,
            "text": "came back",
            "date": day(4),
        },
    ]
    path = write_lines(tmp_path / "yelp_academic_dataset_review.json.gz", reviews)
    build.main(["--source", "yelp", "--input", str(path), "--out", str(tmp_path / "data")])
    tokenizer = AutoTokenizer.from_pretrained(smollm2_offline())
    examples, _ = pairs.make_examples(ReviewStore(tmp_path / "data"), tokenizer, 4, 4, 1, 512)
    (back,) = [e for e in examples if e["review_id"] == "own3"]
    n_user = back["user_reviews_shown"]
    assert back["shown_review_ids"][:n_user] == ["own1", "own2"]
    assert back["shown_review_ids"][n_user:] == ["oth1"]  # own1 was shown under other users before
    assert "What 1 other users wrote" in back["prompt"][1]["content"]
