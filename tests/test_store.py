import json

import pytest
from conftest import write_lines

from data_prep import build
from data_prep.io import LineReader
from data_prep.store import ReviewStore

REVIEWS = [
    {
        "review_id": f"r{i}",
        "user_id": "u1",
        "business_id": f"b{i % 2}",
        "stars": float(1 + i % 5),
        "text": f"visit {i}",
        "date": f"2020-01-0{i + 1} 12:00:00",
    }
    for i in range(5)
]


@pytest.fixture
def store(tmp_path):
    path = write_lines(tmp_path / "yelp_academic_dataset_review.json.gz", REVIEWS)
    build.main(["--source", "yelp", "--input", str(path), "--out", str(tmp_path / "data")])
    return tmp_path / "data"


def test_before_is_strict_and_accepts_dates_and_epochs(store):
    s = ReviewStore(store)
    assert [r["review_id"] for r in s.get_reviews(user_id="u1")] == ["r0", "r1", "r2", "r3", "r4"]
    assert [r["review_id"] for r in s.get_reviews(user_id="u1", before="2020-01-03 12:00:00")] == ["r0", "r1"]
    assert (
        s.get_reviews(user_id="u1", before=1577880001)
        == s.get_reviews(user_id="u1", before="2020-01-01 12:00:01")
        != []
    )
    assert [r["review_id"] for r in s.get_reviews(item_id="b0", before="2020-01-05")] == ["r0", "r2"]


def test_block_hides_the_whole_pair_and_nothing_else(store):
    s = ReviewStore(store, block=[("u1", "b0")])
    assert [r["review_id"] for r in s.get_reviews(user_id="u1")] == ["r1", "r3"]
    assert s.get_reviews(item_id="b0") == [] and s.get_reviews(review_id="r2") == []
    assert s.get_item("b0") == {"item_id": "b0", "source": "yelp"}  # items and users stay readable


def test_get_reviews_needs_a_key_and_missing_store_is_clear(store, tmp_path):
    with pytest.raises(ValueError, match="needs item_id, user_id or review_id"):
        ReviewStore(store).get_reviews()
    with pytest.raises(FileNotFoundError, match="no review store"):
        ReviewStore(tmp_path / "nowhere")


def test_line_reader_reads_gzip_and_plain_alike(tmp_path):
    lines = [b'{"a": 1}', b"", b"\xff broken"]
    for name in ("x.json", "x.json.gz"):
        path = write_lines(tmp_path / name, lines)
        with LineReader(path) as reader:
            assert list(reader) == [(1, lines[0]), (2, b""), (3, lines[2])]


def test_fetch_sample_fails_clearly_without_the_hub(tmp_path, monkeypatch):
    from data_prep.fetch_sample import fetch

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(SystemExit, match="could not fetch Amazon Reviews 2023 Magazine_Subscriptions"):
        fetch("Magazine_Subscriptions", 10, tmp_path)


def test_a_whole_file_write_is_all_or_nothing_and_reaches_the_disk(tmp_path, monkeypatch):
    """data_prep.io.write_atomic (pairs, cards, fingerprints, checkpoints): a write killed before its
    rename leaves the old file whole; the new bytes and the rename are fsynced."""
    import os

    from data_prep import io as dio

    target = tmp_path / "train.jsonl"
    dio.write_atomic(target, "old\n")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))

    def killed(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        dio.write_atomic(target, "new\n" * 1000)
    assert target.read_text() == "old\n" and len(synced) == 1  # the data was synced, never renamed in
    monkeypatch.undo()
    synced.clear()
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    dio.write_atomic(target, b"new\n")
    assert target.read_bytes() == b"new\n" and len(synced) == 2  # the file, then its folder
    assert not list(tmp_path.glob("*.tmp"))


def test_one_json_lines_reader_leaves_out_a_cut_last_line_and_names_a_damaged_one(tmp_path):
    from data_prep.io import read_jsonl

    path = tmp_path / "turns.jsonl"
    assert read_jsonl(path) == []  # no file yet: no lines
    path.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3, "cut')  # a kill mid-write: the last line has no newline
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": 1}\nnot json\n{"a": 3}\n')  # damage in the middle is not a shorter file
    with pytest.raises(ValueError, match="turns.jsonl line 2"):
        read_jsonl(path)


def test_an_input_that_must_be_whole_refuses_a_bad_last_line_and_a_missing_file(tmp_path):
    from data_prep.io import numbered_lines

    path = tmp_path / "catalogue.jsonl"
    with pytest.raises(FileNotFoundError):
        numbered_lines(path, whole=True)
    path.write_text('{"a": 1}\n\n{"a": 2}')  # an input's last line may lack its newline
    assert [(n, v) for n, _, v in numbered_lines(path, whole=True)] == [(1, {"a": 1}), (3, {"a": 2})]
    path.write_text('{"a": 1}\n{"a": 2, "cut')  # in a run file this would be a cut line, left out
    assert len(numbered_lines(path)) == 1
    with pytest.raises(ValueError, match="catalogue.jsonl line 2"):
        numbered_lines(path, whole=True)


def test_appending_after_a_cut_line_starts_a_clean_line(tmp_path):
    from data_prep.io import append_to, read_jsonl

    path = tmp_path / "errors.jsonl"
    path.write_text('{"task_id": 1}\n{"task_id": 2, "err')  # a kill mid-write
    with append_to(path) as handle:
        handle.write('{"task_id": 3}\n')
    assert read_jsonl(path) == [{"task_id": 1}, {"task_id": 3}]


def test_a_pairs_card_is_written_as_json_and_as_a_readme_naming_each_field(tmp_path):
    """write_card, the one writer of the three pair builders' cards: the JSON reads back as given
    (Chinese personas unescaped), and README.md has the title and one line per field."""
    from data_prep.io import write_card

    card = {"examples": {"train": 3, "validation": 1}, "persona": "喜欢火锅", "options": {"seed": 0}}
    write_card(tmp_path, "Conversational simulator training pairs", card)
    assert json.loads((tmp_path / "card.json").read_text(encoding="utf-8")) == card
    assert "喜欢火锅" in (tmp_path / "card.json").read_text(encoding="utf-8")
    readme = (tmp_path / "README.md").read_text(encoding="utf-8").splitlines()
    assert readme[0] == "# Conversational simulator training pairs"
    assert readme[2:] == [f"- **{k}**: `{json.dumps(v, ensure_ascii=False)}`" for k, v in card.items()]


def test_not_user_leaves_out_that_users_reviews_of_the_item(tmp_path):
    two = REVIEWS + [{**REVIEWS[0], "review_id": "o1", "user_id": "u2", "date": "2020-01-02 13:00:00"}]
    path = write_lines(tmp_path / "yelp_academic_dataset_review.json.gz", two)
    build.main(["--source", "yelp", "--input", str(path), "--out", str(tmp_path / "data")])
    s = ReviewStore(tmp_path / "data")
    assert [r["review_id"] for r in s.get_reviews(item_id="b0")] == ["r0", "o1", "r2", "r4"]
    assert [r["review_id"] for r in s.get_reviews(item_id="b0", not_user="u1")] == ["o1"]
    assert [r["review_id"] for r in s.get_reviews(item_id="b0", not_user="u1", before="2020-01-02")] == []
