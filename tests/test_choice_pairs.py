"""The sandbox's choice pairs: each prompt is exactly the page prompt the sandbox's agent of that user at
that moment sees (one renderer, the same memories), nothing in a pair is from on or after --before,
distractors are films the user had not rated, and train.sft trains on them."""

import json

import numpy as np
import pytest
from sandbox_fakes import embed

from agents.sandbox.agent import agents_at, watch_messages
from agents.sandbox.config import load_config
from agents.sandbox.memory import LLMMemoryModel
from data_prep import choice_pairs, movielens
from data_prep.prompt import page_lines, watched_line
from data_prep.schema import parse_iso


@pytest.fixture(scope="module")
def ml(raw):
    return movielens.load(raw / "movielens_latest_small")


OPTIONS = {"round_days": 1.0, "short_term": 3, "retrieve": 3, "recency_decay": 0.99}


def test_a_pair_prompt_is_the_page_prompt_the_sandbox_agent_sees(ml):
    before = movielens.parse_moment("2005-01-01", ml)
    rng = np.random.default_rng(0)
    targets = choice_pairs.draw_targets(ml, before, 5, 3, 12, rng)
    examples, counts = choice_pairs.make_examples(ml, targets, before, OPTIONS, embed, rng)
    assert len(examples) == len(targets) == 12 and not counts
    config = load_config("configs/sandbox/movielens.yaml", [])  # the shipped config: 3 recent, 3 recalled
    for example, target in zip(examples, targets, strict=True):
        (agent,) = agents_at(ml, [target.user], [target.ts], config, embed, LLMMemoryModel(None), rng)
        # the page as the sandbox lists it at that moment: the films' ratings before it (World.listing)
        popularity = ml.popularity()
        counts = {m: (popularity.count(m, target.ts), popularity.mean(m, target.ts)) for m in example["page"]}
        shown = page_lines(example["page"], ml.movies, counts, target.ts)
        assert watch_messages(agent, shown, target.ts, 0) == example["prompt"]
        assert example["page_counts"] == [counts[m][0] for m in example["page"]]
        assert example["completion"][0]["content"] == str(example["page"].index(target.movie) + 1)
        line = shown.splitlines()[example["page"].index(target.movie)]
        assert line.startswith(example["completion"][0]["content"] + ". " + ml.movies[target.movie].title)
        assert len(agent.memory.context("x", 0)) == min(6, len(agent.profile.history))


def test_a_rating_pair_prompt_is_the_rate_prompt_the_sandbox_agent_sees(ml):
    from agents.sandbox.agent import rate_messages

    before = movielens.parse_moment("2005-01-01", ml)
    rng = np.random.default_rng(3)
    targets = choice_pairs.draw_targets(ml, before, 5, 3, 8, rng)
    examples = choice_pairs.make_rating_examples(ml, targets, OPTIONS, embed)
    config = load_config("configs/sandbox/movielens.yaml", [])
    assert len(examples) == len(targets) == 8
    for example, target in zip(examples, targets, strict=True):
        (agent,) = agents_at(ml, [target.user], [target.ts], config, embed, LLMMemoryModel(None), rng)
        assert rate_messages(agent, ml.movies[target.movie], target.ts, 0) == example["prompt"]
        assert example["task"] == "rating" and example["stars"] == target.stars
        older = [r.stars for r in ml.by_user()[target.user] if r.ts < target.ts]
        assert example["user_mean_before"] == pytest.approx(np.mean(older), abs=0.01)  # older ratings only
    assert [choice_pairs.rating_digit(s) for s in (0.5, 1.0, 2.5, 3.5, 4.5, 5.0)] == [
        "1",
        "1",
        "3",
        "4",
        "5",
        "5",
    ]


@pytest.mark.slow
def test_nothing_in_a_pair_is_from_on_or_after_the_cutoff_date(ml):
    before = movielens.parse_moment("2005-01-01", ml)
    rng = np.random.default_rng(1)
    targets = choice_pairs.draw_targets(ml, before, 5, 40, 150, rng)
    examples, counts = choice_pairs.make_examples(ml, targets, before, OPTIONS, embed, rng)
    by_id = {f"{t.user}:{t.movie}:{t.ts}": t for t in targets}
    assert len(examples) + counts["too_few_distractors"] == len(targets) > 100  # each target used or counted
    for example in examples:
        target = by_id[example["example_id"]]
        assert target.ts < before and parse_iso(example["date"]) == target.ts
        page = example["page"]
        assert target.movie in page and len(page) in (5, 6, 10) and len(set(page)) == len(page)
        rated_before = {r.movie for r in ml.by_user()[target.user] if r.ts < before}
        assert not (set(page) - {target.movie}) & rated_before  # distractors: never rated by the user
        existed = set(movielens.existing_films(ml, target.ts))
        assert all(
            m in existed for m in page if m != target.movie
        )  # rated before, or released in an earlier year
        older = {
            watched_line(ml.movies[r.movie].text(), r.stars, movielens.day(r.ts))
            for r in ml.by_user()[target.user]
            if r.ts < target.ts
        }
        remembered = example["prompt"][1]["content"].split("# What you remember\n")[1].split("\n\n")[0]
        assert {
            line.removeprefix("- ") for line in remembered.splitlines()
        } <= older  # strictly older ratings
    assert any(r.ts >= before for r in ml.ratings)  # the sample has later ratings, and none became a target


@pytest.mark.slow
def test_the_command_writes_pairs_split_by_user_and_train_sft_takes_them(ml, raw, tmp_path, tiny_model):
    out = tmp_path / "pairs"
    card = choice_pairs.main(
        ["--data", str(raw / "movielens_latest_small"), "--out", str(out), "--before", "2003-01-01",
         "--examples", "24", "--per-user", "3", "--tokenizer", str(tiny_model), "--max-tokens", "2048",
         "--val-fraction", "0.25", "--ratings", "12"],
        embed=embed,
    )  # fmt: skip
    rows = {
        s: [json.loads(x) for x in (out / f"{s}.jsonl").read_text().splitlines()]
        for s in ("train", "validation")
    }
    assert card["task"] == "sandbox_choice" and sum(card["examples"].values()) == 24 + 12
    assert sum(kinds.get("rating", 0) for kinds in card["kinds"].values()) == 12
    assert not {r["user"] for r in rows["train"]} & {r["user"] for r in rows["validation"]}
    assert card["latest_target"] < "2003-01-01" and card["options"]["short_term_capacity"] == 3
    for split, shown in card["prompts"]["memories_shown"].items():  # what the prompts show, counted
        assert sum(shown.values()) == card["examples"][split]
        assert shown["2+"] == sum(r["memories_shown"] >= 2 for r in rows[split])
        assert all(
            r["prompt"][-1]["content"].count("\n- ") >= min(r["memories_shown"], 1) for r in rows[split]
        )
    from train.sft import main as sft

    run = tmp_path / "adapter"
    trainer = sft(
        ["--pairs", str(out), "--model_name_or_path", str(tiny_model), "--output_dir", str(run), "--use_peft",
         "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj", "--max_steps", "3", "--per_device_train_batch_size",
         "2", "--global_batch_size", "2", "--use_cpu", "--bf16", "false", "--report_to", "none", "--save_strategy", "no",
         "--eval_strategy", "steps", "--eval_steps", "3", "--eval_on_start", "true", "--logging_steps", "1",
         "--activation_checkpointing", "false", "--learning_rate", "1e-2", "--max_eval_examples", "2",
         "--task_metric", "eval.training:choice_task_metric", "--task_examples", "4", "--task_max_new_tokens", "3"],
    )  # fmt: skip
    # the choice task's own metric at step 0 and at the end, beside the most-rated film on the same pages
    curve = [h for h in trainer.state.log_history if "eval_task_accuracy" in h]
    assert [h["step"] for h in curve] == [0, 3]
    from train.sft import spread

    scored = [
        rows["validation"][i] for i in spread(len(rows["validation"]), 4)
    ]  # the rows the metric answers
    pages = [r for r in scored if r["task"] == "choice"]
    credit = []
    for r in pages:  # the most-rated film's credit, ties sharing it
        counts, truth = r["page_counts"], int(r["completion"][0]["content"])
        top = [k for k, c in enumerate(counts) if c == max(counts)]
        credit.append((truth - 1 in top) / len(top))
    assert pages and {h["eval_most_rated_accuracy"] for h in curve} == {round(float(np.mean(credit)), 4)}
    assert "## What it learned (4 validation examples" in (run / "README.md").read_text()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 3 and all(np.isfinite(losses))
    from safetensors.numpy import load_file

    weights = load_file(run / "adapter_model.safetensors")
    assert any(
        "lora_B" in k and np.abs(v).sum() > 0 for k, v in weights.items()
    )  # B starts at zero: it learned
    record = json.loads((run / "training_data.json").read_text())
    assert record["latest_target_ts"] < movielens.parse_moment("2003-01-01", ml)  # what the tests check
    # rating alignment reads the stars from this adapter in its tuned rows, the others with it off
    from eval.sandbox import alignment

    data = [f"data={raw / 'movielens_latest_small'}", f"llm.model={tiny_model}"]
    results = alignment.run(
        "configs/sandbox/movielens.yaml", data, tmp_path / "align", 2, 0, "2010-01-01", 2, ["user_mean"],
        embed=embed, adapter=str(run),
    )  # fmt: skip
    assert set(results["scores"]["methods"]) == {"user_mean", "tuned-llm", "tuned"}
    assert (
        results["adapter"] is not None
        and alignment.NO_TUNED_ROW not in (tmp_path / "align" / "table.md").read_text()
    )


def test_the_choice_metric_scores_answers_against_the_page_and_its_references(tmp_path):
    from eval.sandbox.training_check import ChoiceTaskMetric

    def row(i, truth, counts):
        completion = [{"role": "assistant", "content": str(truth)}]
        return {"example_id": str(i), "page": list(range(len(counts))), "page_counts": counts,
                "completion": completion, "rendered": f"prompt {i}"}  # fmt: skip

    rows = [row(0, 2, [1, 9, 3, 0, 0]), row(1, 1, [5, 5, 0, 0, 0]), row(2, 4, [7, 1, 1, 2, 0])]
    metric = ChoiceTaskMetric("unused", rows, str(tmp_path), max_new_tokens=3)
    # the most-rated film: right on page 0, half right on page 1 (a tie of two), wrong on page 2
    base = metric(["7", "no idea", "4."], step=0)
    assert base == {"task_accuracy": round(1 / 3, 4), "most_rated_accuracy": 0.5, "chance_accuracy": 0.2,
                    "task_unreadable": 2}  # fmt: skip
    tuned = metric(["2", "1", "4"], step=5)
    assert tuned["task_accuracy"] == 1.0 and tuned["task_unreadable"] == 0
    card = metric.summary(5)
    assert card["kept_step"] == 5 and [p["step"] for p in card["curve"]] == [0, 5]
    assert card["adapter_minus_base"]["accuracy"]["difference"] == round(2 / 3, 4)
    assert card["adapter_minus_most_rated"]["accuracy"]["difference"] == 0.5
    unknown = metric.summary(10)  # kept a step no process evaluated: no comparison to make
    assert unknown["kept_step"] == 10 and "note" in unknown and "adapter_minus_base" not in unknown
    written = (tmp_path / "task_eval" / "step_5.jsonl").read_text().splitlines()
    assert [json.loads(x)["answer"] for x in written] == ["2", "1", "4"]
    # a resumed run: a new process evaluates step 10 only; steps 0 and 5 come back from their answers
    resumed = ChoiceTaskMetric("unused", rows, str(tmp_path), max_new_tokens=3)
    resumed(["1", "1", "1"], step=10)
    again = resumed.summary(5)
    assert [p["step"] for p in again["curve"]] == [0, 5, 10]
    assert again["adapter_minus_base"] == card["adapter_minus_base"]
    assert again["adapter_minus_most_rated"] == card["adapter_minus_most_rated"]
    # answers saved for other examples, or for the same ids with other truths, are not restored
    other = ChoiceTaskMetric("unused", rows[:2], str(tmp_path), max_new_tokens=3)
    assert "note" in other.summary(5) and [p["step"] for p in other.summary(5)["curve"]] == []
    moved = [row(0, 3, [1, 9, 3, 0, 0]), *rows[1:]]
    assert "note" in ChoiceTaskMetric("unused", moved, str(tmp_path), max_new_tokens=3).summary(5)
    # without a best step the kept one is this process's last evaluation: none at all, no comparison
    # (not the restored base model's answers compared as if they were the adapter's)
    blank = ChoiceTaskMetric("unused", rows, str(tmp_path), max_new_tokens=3)
    assert "note" in blank.summary(None) and blank.history == []
    blank(["2", "1", "4"], step=15)
    last = blank.summary(None)
    assert last["kept_step"] == 15 and last["adapter_minus_base"] == card["adapter_minus_base"]
    with pytest.raises(SystemExit, match="rebuild the pairs"):
        ChoiceTaskMetric("old", [{k: v for k, v in rows[0].items() if k != "page_counts"}], str(tmp_path))
