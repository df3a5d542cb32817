import gzip
import json
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from conftest import write_lines

from data_prep import build
from data_prep.store import ReviewStore

REPO = Path(__file__).resolve().parents[1]


def run_build(*args) -> dict:
    return build.main([str(a) for a in args])


def read_rejects(out) -> list[dict]:
    return [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]


def reconciles(report: dict) -> bool:
    return (
        report["reviews_read"]
        == report["reviews_kept"] + report["reviews_rejected"] + report["reviews_filtered"]
    )


# -- the real samples ----------------------------------------------------------------------------------


def test_yelp_asc_sample(raw, tmp_path):
    folder = raw / "yelp_asc_sample"
    report = run_build("--source", "asc", "--platform", "yelp", "--input", folder, "--out", tmp_path)
    lines = (folder / "review_subset.json").read_text().splitlines()
    reviews = [json.loads(line) for line in lines]
    assert report["reviews_read"] == len(lines) == 4164
    assert reconciles(report) and report["reviews_kept"] == 4164
    assert report["users"] == len({r["user_id"] for r in reviews}) == 1618
    assert report["items"] == 432 and report["items_without_metadata"] == 0
    assert report["users_without_profile"] == 1618 - 38  # 38 users come with a full profile

    store = ReviewStore(tmp_path)
    user = max({r["user_id"] for r in reviews}, key=lambda u: sum(r["user_id"] == u for r in reviews))
    got = store.get_reviews(user_id=user)
    assert sorted(r["review_id"] for r in got) == sorted(
        r["review_id"] for r in reviews if r["user_id"] == user
    )
    assert [r["date"] for r in got] == sorted(r["date"] for r in got)  # oldest first
    one = reviews[0]
    assert store.get_reviews(review_id=one["review_id"])[0]["text"] == one["text"]
    assert store.get_item(one["item_id"])["item_id"] == one["item_id"]
    profiled = json.loads((folder / "user_subset.json").read_text().splitlines()[0])
    assert store.get_user(profiled["user_id"])["name"] == profiled["name"]
    # --platform names the source of records that do not carry one
    assert {got[0]["source"], store.get_item(one["item_id"])["source"], store.get_user(user)["source"]} == {
        "yelp"
    }


def test_amazon2018_dedup_removes_variant_copies(raw, tmp_path):
    folder = raw / "amazon2018_5core_small"
    report = run_build("--source", "amazon2018", "--input", folder, "--out", tmp_path)
    rows, distinct, no_text = 0, set(), 0
    for f in sorted(folder.glob("*_5.json.gz")):
        for line in gzip.open(f, "rt"):
            r = json.loads(line)
            rows += 1
            if r.get("reviewText", "").strip():
                distinct.add((r["reviewerID"], r["reviewText"], r["unixReviewTime"], r["overall"]))
            else:
                no_text += 1
    assert report["reviews_read"] == rows == 13694
    assert reconciles(report)
    assert report["reviews_kept"] == len(distinct)
    assert report["reasons"]["missing_field:text"] == no_text == report["reviews_rejected"]
    assert (
        report["reasons"]["duplicate_variant"] == rows - no_text - len(distinct) == report["reviews_filtered"]
    )
    db = sqlite3.connect(tmp_path / "store.sqlite")
    texts = db.execute("SELECT user_id, ts, stars, json_extract(data, '$.text') FROM reviews").fetchall()
    assert len(texts) == len(set(texts))  # no copy survived
    # reviews that share reviewer, text and time but not stars are different reviews: all kept
    by_content = Counter((u, ts, text) for u, ts, _, text in texts)
    assert sum(n > 1 for n in by_content.values()) == 9
    # Gift Cards has metadata; the other categories' items are stubs, counted
    store = ReviewStore(tmp_path)
    gift = db.execute(
        "SELECT item_id FROM reviews WHERE json_extract(data, '$.category') = 'Gift_Cards' LIMIT 1"
    )
    assert "title" in store.get_item(gift.fetchone()[0])
    assert report["items_without_metadata"] > 0


# -- bad input -----------------------------------------------------------------------------------------

GOOD = {
    "review_id": "r1",
    "user_id": "u1",
    "business_id": "b1",
    "stars": 4.0,
    "text": "Nice.",
    "date": "2019-01-01 10:00:00",
}


def bad_yelp_dump(tmp_path):
    lines = [
        GOOD,
        b'{"review_id": "r2", "user_id": "u1", "business_id": "b1", "stars": 4.0',  # 2 malformed json
        {**GOOD, "review_id": "r3", "user_id": None},  # 3 missing field
        {**GOOD, "review_id": "r4", "stars": "five"},  # 4 stars not numeric
        {**GOOD, "review_id": "r5", "stars": 7},  # 5 out of range
        {**GOOD, "review_id": "r6", "text": "   "},  # 6 empty text
        b'{"review_id": "r7", "user_id": "u1", "business_id": "b1", "stars": 3, "text": "caf\xe9", "date": "2019-01-01"}',
        {**GOOD, "text": "same id again"},  # 8 duplicate review id
        [1, 2, 3],  # 9 not an object
        {**GOOD, "review_id": "r10", "date": "yesterday"},  # 10 bad timestamp
        {**GOOD, "review_id": "r11", "stars": 0.5},  # 11 out of range
        {**GOOD, "review_id": "r12", "user_id": "u2", "stars": 1},  # 12 good
    ]
    return write_lines(tmp_path / "in" / "yelp_academic_dataset_review.json", lines)


def test_every_bad_line_is_rejected_with_its_reason(tmp_path):
    path = bad_yelp_dump(tmp_path)
    out = tmp_path / "out"
    report = run_build("--source", "yelp", "--input", path, "--out", out)
    expected = {
        2: "malformed_json",
        3: "missing_field:user_id",
        4: "stars_not_numeric",
        5: "stars_out_of_range",
        6: "empty_text",
        7: "invalid_utf8",
        8: "duplicate_review_id",
        9: "not_a_json_object",
        10: "bad_timestamp",
        11: "stars_out_of_range",
    }
    rejects = read_rejects(out)
    assert {r["line"]: r["reason"] for r in rejects} == expected
    assert all(r["file"] == str(path) for r in rejects)
    assert rejects[5]["raw"].endswith('"text": "caf\\xe9", "date": "2019-01-01"}')  # kept visible, not lost
    assert report["reviews_read"] == 12 and report["reviews_kept"] == 2 and report["reviews_rejected"] == 10
    assert reconciles(report)
    assert report["reasons"]["stars_out_of_range"] == 2
    assert ReviewStore(out).get_reviews(review_id="r1")[0]["text"] == "Nice."  # first copy of r1 kept


def test_missing_or_unrecognised_input_stops_the_build(tmp_path):
    with pytest.raises(SystemExit, match="nope.json does not exist"):
        run_build("--source", "yelp", "--input", tmp_path / "nope.json", "--out", tmp_path / "o")
    odd = write_lines(tmp_path / "photos.json", [GOOD])
    with pytest.raises(SystemExit, match="cannot tell what .*photos.json is for --source yelp"):
        run_build("--source", "yelp", "--input", odd, "--out", tmp_path / "o")
    meta_only = write_lines(tmp_path / "meta_X.jsonl", [{"parent_asin": "p"}])
    with pytest.raises(SystemExit, match="no review file"):
        run_build("--source", "amazon2023", "--input", meta_only, "--out", tmp_path / "o")


def test_yelp_official_city_filter(tmp_path):
    biz = [
        {"business_id": "b1", "city": "Tampa", "name": "A"},
        {"business_id": "b2", "city": "Reno", "name": "B"},
        {"city": "Tampa"},  # no id: rejected, counted apart from reviews
    ]
    users = [{"user_id": "u1", "name": "x"}, {"user_id": "u9", "name": "only reviews Reno"}]
    reviews = [GOOD, {**GOOD, "review_id": "r2", "user_id": "u9", "business_id": "b2"}]
    d = tmp_path / "yelp"
    write_lines(d / "yelp_academic_dataset_business.json", biz)
    write_lines(d / "yelp_academic_dataset_user.json", users)
    write_lines(d / "yelp_academic_dataset_review.json", reviews)
    write_lines(d / "yelp_academic_dataset_tip.json", [{}])  # not used: ignored with a note
    report = run_build("--source", "yelp", "--input", d, "--official-cities", "--out", tmp_path / "o")
    assert report["reviews_kept"] == 1 and report["reasons"] == {"city_filter": 1} and reconciles(report)
    assert report["items"] == 1 and report["items_filtered"] == 1
    assert report["other_rejects"] == {"item:missing_field:item_id": 1}
    assert report["users"] == 1 and report["users_dropped_without_reviews"] == 1
    store = ReviewStore(tmp_path / "o")
    assert store.get_item("b1")["type"] == "business" and store.get_item("b2") is None


def test_amazon2023_five_core_and_mapping(tmp_path):
    reviews = [
        {
            "rating": 5.0,
            "title": "t",
            "text": "great",
            "asin": "a1",
            "parent_asin": "p1",
            "user_id": "u1",
            "timestamp": 1588615855123,
            "helpful_vote": 0,
            "verified_purchase": True,
        },
        {
            "rating": 2.0,
            "title": "t",
            "text": "meh",
            "asin": "a2",
            "parent_asin": "p2",
            "user_id": "u1",
            "timestamp": 1588615856000,
            "helpful_vote": 1,
            "verified_purchase": True,
        },
        {
            "rating": 4.0,
            "title": "t",
            "text": "ok",
            "asin": "a1",
            "parent_asin": "p1",
            "user_id": "u2",
            "timestamp": 1588615857000,
            "helpful_vote": 1,
            "verified_purchase": False,
        },
    ]
    d = tmp_path / "az"
    write_lines(d / "Video_Games.jsonl.gz", reviews)
    write_lines(d / "meta_Video_Games.jsonl", [{"parent_asin": "p1", "title": "Game"}])
    (d / "Video_Games.csv").write_text(
        "user_id,parent_asin,rating,timestamp\nu1,p1,5.0,1\nu2,p1,4.0,1\nbroken\n"
    )
    report = run_build("--source", "amazon2023", "--input", d, "--out", tmp_path / "o")
    assert report["reviews_kept"] == 2 and report["reasons"] == {"not_in_5core": 1} and reconciles(report)
    assert report["other_rejects"] == {"ratings:malformed_csv": 1}
    store = ReviewStore(tmp_path / "o")
    (r,) = store.get_reviews(user_id="u1")
    assert (r["item_id"], r["sub_item_id"], r["stars"], r["source"]) == ("p1", "a1", 5.0, "amazon")
    assert r["date"] == "2020-05-04 18:10:55" and r["category"] == "Video_Games"
    assert store.get_item("p1")["title"] == "Game" and store.get_user("u1") == {
        "user_id": "u1",
        "source": "amazon",
    }


def test_goodreads_unrated_is_filtered_and_counted(tmp_path):
    base = {
        "user_id": "u1",
        "book_id": "b1",
        "review_id": "g1",
        "rating": 4,
        "review_text": "Loved it",
        "date_added": "Mon Aug 25 13:59:37 -0700 2014",
        "n_votes": 0,
    }
    reviews = [base, {**base, "review_id": "g2", "rating": 0}, {**base, "review_id": "g3", "date_added": "?"}]
    path = write_lines(tmp_path / "goodreads_reviews_poetry.json.gz", reviews)
    books = write_lines(tmp_path / "goodreads_books_poetry.json.gz", [{"book_id": "b1", "title": "Odes"}])
    report = run_build("--source", "goodreads", "--input", path, books, "--out", tmp_path / "o")
    assert report["reasons"] == {"not_rated": 1, "bad_timestamp": 1} and report["reviews_kept"] == 1
    store = ReviewStore(tmp_path / "o")
    (r,) = store.get_reviews(item_id="b1")
    assert (r["stars"], r["text"], r["date"], r["category"]) == (
        4,
        "Loved it",
        "2014-08-25 20:59:37",
        "poetry",
    )
    assert store.get_item("b1")["type"] == "book"


# -- resume / refuse -----------------------------------------------------------------------------------


def test_stopped_build_resumes_without_loss_or_duplicates(raw, tmp_path, monkeypatch):
    src = raw / "amazon2018_5core_small"
    args = ["--source", "amazon2018", "--input", src, "--batch-size", "700"]
    whole = run_build(*args, "--out", tmp_path / "whole")

    real = build.Builder.reviews
    calls = {"n": 0}

    def dies_on_sixth_batch(self, path, batch, parsed):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt  # as if the job were killed mid-file
        return real(self, path, batch, parsed)

    monkeypatch.setattr(build.Builder, "reviews", dies_on_sixth_batch)
    with pytest.raises(KeyboardInterrupt):
        run_build(*args, "--out", tmp_path / "cut")
    monkeypatch.setattr(build.Builder, "reviews", real)
    assert not (tmp_path / "cut" / "report.json").exists()
    resumed = run_build(*args, "--out", tmp_path / "cut")

    assert resumed["resumed"] is True
    for key in build.SUMMARY_KEYS:
        assert resumed[key] == whole[key], key
    assert read_rejects(tmp_path / "cut") == read_rejects(tmp_path / "whole")
    a = sqlite3.connect(tmp_path / "whole" / "store.sqlite").execute(
        "SELECT review_id FROM reviews ORDER BY 1"
    )
    b = sqlite3.connect(tmp_path / "cut" / "store.sqlite").execute("SELECT review_id FROM reviews ORDER BY 1")
    assert a.fetchall() == b.fetchall()


def test_rebuild_is_a_no_op_and_other_inputs_are_refused(raw, tmp_path, capsys):
    folder = raw / "yelp_asc_sample"
    first = run_build("--source", "asc", "--input", folder, "--out", tmp_path)
    again = run_build("--source", "asc", "--input", folder, "--out", tmp_path)
    assert again == first and "nothing to do" in capsys.readouterr().out
    other = bad_yelp_dump(tmp_path / "x")
    with pytest.raises(SystemExit, match="holds a build of other inputs"):
        run_build("--source", "yelp", "--input", other, "--out", tmp_path)
    replaced = run_build("--source", "yelp", "--input", other, "--out", tmp_path, "--overwrite")
    assert replaced["reviews_read"] == 12 and ReviewStore(tmp_path).get_reviews(user_id="u2")


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper has ended)."""
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to find the workers")
def test_parser_workers_end_when_the_build_process_is_killed(tmp_path):
    from bench.synth_yelp import generate

    dump = generate(60_000, tmp_path / "dump")
    command = [sys.executable, "-m", "data_prep.build", "--source", "yelp", "--input", str(dump)]
    build_process = subprocess.Popen(
        [*command, "--out", str(tmp_path / "out"), "--workers", "2"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    workers: list[int] = []
    while len(workers) < 2 and time.monotonic() < deadline and build_process.poll() is None:
        workers = _children(build_process.pid)  # the pool's workers (and nothing else) are its children
        time.sleep(0.05)
    assert len(workers) == 2, "the build finished or never started its workers"
    time.sleep(0.5)  # let them get busy
    build_process.kill()  # SIGKILL: no cleanup runs in the parent
    build_process.wait()
    deadline = time.monotonic() + 10
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, workers)), "a parser worker outlived the killed build"
