import json

import pytest
from conftest import write_lines

from data_prep import build, split
from data_prep.store import ReviewStore, to_epoch
from data_prep.tasks import read_groundtruth, read_targets, read_tasks
from eval.review.score import new_items


@pytest.fixture(scope="module")
def yelp(raw, tmp_path_factory):
    out = tmp_path_factory.mktemp("yelp")
    build.main(
        ["--source", "asc", "--platform", "yelp", "--input", str(raw / "yelp_asc_sample"), "--out", str(out)]
    )
    return out


def make_split(data, out, *extra) -> dict:
    return split.main(["--data", str(data), "--out", str(out), *map(str, extra)])


def task_pairs(task_dir) -> list[tuple[str, str]]:
    return [(t["user_id"], t["item_id"]) for t in read_tasks(task_dir)]


def test_leave_last_out_targets_are_real_latest_reviews(yelp, tmp_path):
    manifest = make_split(
        yelp, tmp_path, "--strategy", "leave-last-out", "--min-history", 3, "--max-tasks", 40
    )
    assert manifest["counts"]["tasks"] == 40 and manifest["data"]["source_sha256"]
    store = ReviewStore(yelp)  # unblocked: sees everything
    targets = [json.loads(line) for line in (tmp_path / "targets.jsonl").read_text().splitlines()]
    for task, target in zip(read_tasks(tmp_path), targets, strict=True):
        assert json.loads((tmp_path / "tasks" / f"task_{task['task_id']}.json").read_text()) == {
            "type": "user_behavior_simulation",
            "user_id": task["user_id"],
            "item_id": task["item_id"],
        }
        history = store.get_reviews(user_id=task["user_id"])
        assert history[-1]["review_id"] == target["review_id"]  # the user's latest review
        truth = read_groundtruth(tmp_path, task["task_id"])
        assert truth == {"stars": history[-1]["stars"], "review": history[-1]["text"]}
        older = [r for r in history if r["date"] < history[-1]["date"] and r["item_id"] != task["item_id"]]
        assert len(older) >= 3


def test_split_is_deterministic_under_a_seed(yelp, tmp_path):
    a = make_split(yelp, tmp_path / "a", "--min-history", 2, "--max-tasks", 30, "--seed", 7)
    b = make_split(yelp, tmp_path / "b", "--min-history", 2, "--max-tasks", 30, "--seed", 7)
    c = make_split(yelp, tmp_path / "c", "--min-history", 2, "--max-tasks", 30, "--seed", 8)
    assert task_pairs(tmp_path / "a") == task_pairs(tmp_path / "b") != task_pairs(tmp_path / "c")
    pools = [{k: v for k, v in m["counts"].items() if not k.startswith("new_item")} for m in (a, b, c)]
    assert a["counts"] == b["counts"] and pools[0] == pools[2]  # c drew other tasks from the same pool
    with pytest.raises(SystemExit, match="already holds tasks"):
        make_split(yelp, tmp_path / "a", "--min-history", 2)


def test_block_set_hides_every_task_target(yelp, tmp_path):
    make_split(yelp, tmp_path, "--min-history", 1)
    blocked = ReviewStore.open(yelp, tasks=tmp_path)
    everything = ReviewStore(yelp)
    targets = [json.loads(line) for line in (tmp_path / "targets.jsonl").read_text().splitlines()]
    assert blocked.blocked == len(targets) > 100
    for t in targets:
        assert everything.get_reviews(review_id=t["review_id"])  # it exists...
        assert blocked.get_reviews(review_id=t["review_id"]) == []  # ...but prediction cannot see it
        assert t["review_id"] not in {r["review_id"] for r in blocked.get_reviews(user_id=t["user_id"])}
        assert t["review_id"] not in {r["review_id"] for r in blocked.get_reviews(item_id=t["item_id"])}
    # other reviews stay visible, and before= keeps only strictly older ones
    t = targets[0]
    visible = blocked.get_reviews(user_id=t["user_id"], before=t["date"])
    assert visible and all(r["date"] < t["date"] for r in visible)


def test_temporal_split(yelp, tmp_path):
    manifest = make_split(
        yelp, tmp_path, "--strategy", "temporal", "--cutoff", "2018-01-01", "--min-history", 1
    )
    store = ReviewStore(yelp)
    for task in read_tasks(tmp_path):
        truth = read_groundtruth(tmp_path, task["task_id"])
        pair = store.get_reviews(user_id=task["user_id"], item_id=task["item_id"])
        first_after = next(r for r in pair if r["date"] >= "2018-01-01")
        assert truth["review"] == first_after["text"]
        assert store.get_reviews(user_id=task["user_id"], before="2018-01-01")
    assert manifest["counts"]["tasks"] == manifest["counts"]["eligible"] > 0


def test_temporal_history_counts_only_reviews_that_stay_visible(tmp_path):
    """A user who reviewed an item before the cutoff and again after it: the earlier review belongs to
    a pair that becomes a task, so the block set hides it; it is no history (a task with no visible
    older review used to make eval.review.suite stop)."""

    def review(rid, user, item, date, stars=4.0):
        return {
            "review_id": rid,
            "user_id": user,
            "business_id": item,
            "stars": stars,
            "text": f"{rid} text",
            "date": date,
        }

    dump = tmp_path / "dump"
    write_lines(
        dump / "yelp_academic_dataset_review.json",
        [
            review(
                "a1", "alice", "cafe", "2017-05-01 10:00:00"
            ),  # before the cutoff, same item as her target
            review("a2", "alice", "cafe", "2018-03-01 10:00:00"),  # her target
            review("b1", "bob", "bar", "2017-06-01 10:00:00"),  # history on another item
            review("b2", "bob", "cafe", "2018-04-01 10:00:00"),  # his target
        ],
    )
    write_lines(
        dump / "yelp_academic_dataset_business.json", [{"business_id": b, "name": b} for b in ("cafe", "bar")]
    )
    build.main(["--source", "yelp", "--input", str(dump), "--out", str(tmp_path / "data")])
    manifest = make_split(
        tmp_path / "data", tmp_path / "t", "--strategy", "temporal", "--cutoff", "2018-01-01"
    )
    assert manifest["counts"] == {
        **manifest["counts"],
        "candidates": 2,
        "eligible": 1,
        "too_little_history": 1,
    }
    assert task_pairs(tmp_path / "t") == [("bob", "cafe")]
    store = ReviewStore.open(tmp_path / "data", tasks=tmp_path / "t")
    assert [r["review_id"] for r in store.get_reviews(user_id="bob", before="2018-04-01")] == ["b1"]


def test_import_official_takes_targets_from_the_store(yelp, tmp_path):
    official = tmp_path / "official"
    store = ReviewStore(yelp)
    real = store.conn.execute("SELECT user_id, item_id FROM reviews ORDER BY review_id LIMIT 2").fetchall()
    for i, (user, item) in enumerate([*real, ("ghost", "nowhere")]):
        write_lines(
            official / "tasks" / f"task_{i}.json",
            [{"type": "user_behavior_simulation", "user_id": user, "item_id": item}],
        )
        write_lines(
            official / "groundtruth" / f"groundtruth_{i}.json", [{"stars": 3, "review": "LLM-written"}]
        )
    manifest = make_split(yelp, tmp_path / "out", "--import-official", official)
    assert manifest["counts"]["tasks"] == 2 and manifest["counts"]["unmatched"] == 1
    assert manifest["unmatched"][0]["user_id"] == "ghost"
    for task in read_tasks(tmp_path / "out"):
        truth = read_groundtruth(tmp_path / "out", task["task_id"])
        assert truth["review"] != "LLM-written"
        assert (
            truth["review"] == store.get_reviews(user_id=task["user_id"], item_id=task["item_id"])[-1]["text"]
        )


def test_bad_split_requests_fail_clearly(yelp, tmp_path):
    with pytest.raises(SystemExit, match="no task qualifies"):
        make_split(yelp, tmp_path / "a", "--min-history", 10_000)
    with pytest.raises(SystemExit):
        make_split(yelp, tmp_path / "b", "--strategy", "temporal")
    with pytest.raises(FileNotFoundError, match="no review store"):
        make_split(tmp_path / "missing", tmp_path / "c")


@pytest.mark.slow
def test_latest_cutoff_leaves_at_least_n_tasks_and_a_day_later_leaves_fewer(yelp, tmp_path):
    from data_prep.split import candidates

    manifest = make_split(
        yelp, tmp_path, "--strategy", "temporal", "--cutoff", "latest:100", "--min-history", 2
    )
    chosen = to_epoch(manifest["counts"]["cutoff_chosen"])
    assert (
        manifest["cutoff"] == manifest["counts"]["cutoff_chosen"]
        and manifest["cutoff_requested"] == "latest:100"
    )
    assert manifest["counts"]["tasks"] >= 100 and chosen % 86400 == 0
    store = ReviewStore(yelp)
    later = [t for t in candidates(store, "temporal", chosen + 86400) if t["history"] >= 2]
    assert len(later) < 100  # the next day would leave too few: this is the latest such day
    assert all(read_targets(tmp_path)[t["task_id"]]["ts"] >= chosen for t in read_tasks(tmp_path))
    with pytest.raises(SystemExit, match="fewer than 100000 eligible targets"):
        make_split(yelp, tmp_path / "none", "--strategy", "temporal", "--cutoff", "latest:100000")


def hidden_by_validation(yelp, tasks, val) -> None:
    """The validation folder hides the tasks' targets as well as its own."""
    blocked = ReviewStore.open(yelp, tasks=val)
    targets = [*read_targets(tasks).values(), *read_targets(val).values()]
    for t in targets:
        assert blocked.get_reviews(review_id=t["review_id"]) == []
    assert blocked.blocked == len({(t["user_id"], t["item_id"]) for t in targets})


def test_leave_last_out_validation_is_each_task_users_previous_review(yelp, tmp_path):
    make_split(yelp, tmp_path / "tasks", "--min-history", 2, "--max-tasks", 60)
    val = make_split(yelp, tmp_path / "val", "--validation-for", tmp_path / "tasks", "--min-history", 2)
    everything = ReviewStore(yelp)
    tests = {t["user_id"]: t for t in read_tasks(tmp_path / "tasks")}
    test_targets = read_targets(tmp_path / "tasks")
    targets = read_targets(tmp_path / "val")
    assert 0 < len(targets) <= len(tests) == val["counts"]["task_users"]
    assert len({t["user_id"] for t in targets.values()}) == len(targets)  # one per task user
    for target in targets.values():
        task = tests[target["user_id"]]
        before = test_targets[task["task_id"]]["ts"]
        assert target["ts"] < before and target["item_id"] != task["item_id"] and target["history"] >= 2
        others = everything.get_reviews(user_id=target["user_id"], before=before)
        later = [r for r in others if to_epoch(r["date"]) > target["ts"] and r["item_id"] != task["item_id"]]
        assert later == []  # the user's latest review before their task
    assert val["cutoff"] is None and val["strategy"] == "validation"
    # the manifest's count is the evaluator's new-items column on the same folder
    counted = new_items(ReviewStore.open(yelp, tasks=tmp_path / "val"), read_tasks(tmp_path / "val"), targets)
    assert val["counts"]["new_items"] == int(counted.sum()) and 0 < counted.sum() < len(targets)
    hidden_by_validation(yelp, tmp_path / "tasks", tmp_path / "val")
    with pytest.raises(SystemExit):
        make_split(yelp, tmp_path / "bad", "--validation-for", tmp_path / "tasks", "--strategy", "temporal")


@pytest.mark.slow
def test_temporal_validation_is_a_temporal_split_of_what_precedes_the_tasks(yelp, tmp_path):
    test = make_split(
        yelp, tmp_path / "tasks", "--strategy", "temporal", "--cutoff", "latest:100", "--min-history", 2
    )
    val = make_split(yelp, tmp_path / "val", "--validation-for", tmp_path / "tasks", "--min-history", 2)
    start, end = to_epoch(val["counts"]["validation_cutoff"]), to_epoch(test["cutoff"])
    test_pairs = set(task_pairs(tmp_path / "tasks"))
    targets = read_targets(tmp_path / "val")
    assert len(targets) >= test["counts"]["tasks"] == val["counts"]["at_least"]
    assert all(start <= t["ts"] < end for t in targets.values())
    assert not test_pairs & set(task_pairs(tmp_path / "val"))
    assert val["cutoff"] == test["cutoff"]  # what data_prep.pairs keeps training before
    # the latest such day: a day later leaves fewer than the tasks' number
    later = make_split(
        yelp,
        tmp_path / "later",
        "--validation-for",
        tmp_path / "tasks",
        "--min-history",
        2,
        "--cutoff",
        "latest:1",
    )
    assert to_epoch(later["counts"]["validation_cutoff"]) > start
    hidden_by_validation(yelp, tmp_path / "tasks", tmp_path / "val")
