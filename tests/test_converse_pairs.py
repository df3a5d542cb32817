"""The conversational simulator's training pairs are the simulator's own prompts and JSON answers: each
completion parses under the constraint the simulator uses, each prompt fits the budget, and what the data
does not record is left empty."""

import json
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from agents.converse.simulator import ACTION, FIRST_ACTION, MESSAGE
from data_prep import recllmsim
from data_prep.converse_pairs import make_examples
from data_prep.offline_models import OFFLINE_SMOLLM2, resolve_model
from data_prep.prompt import count_tokens


@pytest.fixture(scope="module")
def sample(raw):
    loaded = recllmsim.load(raw / "recllmsim")
    english = [c for c in loaded.conversations if c.source == "llm" and c.language == "en"][:12]
    return replace(loaded, conversations=english)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model(OFFLINE_SMOLLM2))


def test_pairs_are_the_simulators_prompts_with_answers_it_can_parse(sample, tokenizer):
    examples, counts = make_examples(sample, tokenizer, "en", 1024)
    users = sum(1 for c in sample.conversations for t in c.turns if t.role == "user")
    kinds = [e["kind"] for e in examples]
    assert kinds.count("action") + counts["too_long:action"] == users
    assert kinds.count("response") + counts["too_long:response"] == users
    by_id = {c.file: c for c in sample.conversations}
    for example in examples:
        prompt, answer = example["prompt"][0]["content"], example["completion"][0]["content"]
        assert (
            example["prompt"][0]["role"] == "user" and len(example["prompt"]) == 1
        )  # as the simulator sends
        assert count_tokens(tokenizer, example["prompt"], answer) <= 1024
        file, rest = example["example_id"].split("#")
        number = int(rest.split(":")[0])
        turn = by_id[file].turns[number - 1]
        first = number == 1 or not any(t.role == "user" for t in by_id[file].turns[: number - 1])
        if example["kind"] == "action":
            value = (FIRST_ACTION if first else ACTION).parse(answer)
            assert value is not None and "What do you do next?" in prompt
        else:
            value = MESSAGE.parse(answer)
            assert value == {"message": turn.content.strip()} and "Write your next message" in prompt
        assert by_id[file].task_context in prompt
        # unknown to the data, so not invented: no tendency or style line, no satisfaction after turn one
        assert "You decide quickly" not in prompt and "You are satisfied" not in prompt


def test_a_tight_budget_cuts_turns_and_counts_what_does_not_fit(sample, tokenizer):
    examples, counts = make_examples(sample, tokenizer, "en", 600)
    assert counts["turns_cut"] > 0 and sum(e["cut_turns"] for e in examples) == counts["turns_cut"]
    assert all(count_tokens(tokenizer, e["prompt"], e["completion"][0]["content"]) <= 600 for e in examples)
    cut = [e for e in examples if e["cut_turns"]]
    assert all("…" in e["prompt"][0]["content"] for e in cut)
    none, counts = make_examples(sample, tokenizer, "en", 64)  # not even the persona fits: all counted
    users = sum(1 for c in sample.conversations for t in c.turns if t.role == "user")
    assert none == [] and counts["too_long:response"] == counts["too_long:action"] == users


def test_the_converse_task_metric_scores_actions_beside_the_majority_and_counts_unparsed(tmp_path):
    """Action accuracy against the real turn's actions, the training pairs' most common set on the same
    turns, parse failures counted, and the card's paired comparison at the kept step."""
    from eval.training import converse_task_metric

    def row(kind, content, i):
        return {"example_id": f"c#{i}", "kind": kind, "rendered": f"prompt {i}",
                "completion": [{"role": "assistant", "content": content}]}  # fmt: skip

    ask, clarify = '{"actions": ["request_recommendation"]}', '{"actions": ["clarify_preference"]}'
    train = [row("action", ask, i) for i in range(3)] + [
        row("action", clarify, 3),
        row("response", '{"message": "hi"}', 4),
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    rows = [
        row("action", ask, 0),
        row("action", clarify, 1),
        row("action", clarify, 2),
        row("response", '{"message": "x"}', 3),
    ]
    metric = converse_task_metric(str(tmp_path), rows, str(tmp_path / "out"))
    base = metric([ask, ask, "no json", '{"message": ""}'], step=0)
    assert base == {"task_action_accuracy": 0.3333, "majority_action_accuracy": 0.3333, "task_parsed": 0.5,
                    "task_unreadable": 2}  # fmt: skip
    tuned = metric(
        [ask, clarify, '{"actions": ["clarify_preference"]} trailing', '{"message": "Any ideas?"}'], step=30
    )
    assert (
        tuned["task_action_accuracy"] == 1.0 and tuned["task_parsed"] == 1.0 and tuned["task_unreadable"] == 0
    )
    card = metric.summary(30)
    assert card["majority_actions"] == ["request_recommendation"]
    assert card["adapter_minus_base"]["action_accuracy"]["difference"] == 0.6667
    assert card["adapter_minus_majority"]["action_accuracy"]["n"] == 3
    assert (tmp_path / "out" / "task_eval" / "step_30.jsonl").exists()


@pytest.mark.slow
def test_the_converse_recipe_scores_its_task_metric_at_step_0_and_after(
    sample, tokenizer, tiny_model, tmp_path
):
    """train.sft with the converse task metric (as configs/sft/smollm2_converse_cpu.yaml names it) on real
    RecLLMSim pairs: the metric at step 0 and at the last step, the majority reference beside it, the card."""
    from train.sft import main as sft

    examples, _ = make_examples(sample, tokenizer, "en", 512)
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    half = len(examples) // 2
    for name, rows in (("train", examples[:half]), ("validation", examples[half:])):
        (pairs / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (pairs / "card.json").write_text(json.dumps({"options": {"max_tokens": 512}}))
    run = tmp_path / "adapter"
    trainer = sft(
        ["--pairs", str(pairs), "--model_name_or_path", str(tiny_model), "--output_dir", str(run), "--use_peft",
         "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj", "--max_steps", "2", "--per_device_train_batch_size",
         "2", "--global_batch_size", "2", "--use_cpu", "--bf16", "false", "--report_to", "none", "--save_strategy", "no",
         "--eval_strategy", "steps", "--eval_steps", "2", "--eval_on_start", "true", "--logging_steps", "1",
         "--activation_checkpointing", "false", "--max_eval_examples", "2",
         "--task_metric", "eval.training:converse_task_metric", "--task_examples", "6", "--task_max_new_tokens", "8"],
    )  # fmt: skip
    curve = [h for h in trainer.state.log_history if "eval_task_action_accuracy" in h]
    assert [h["step"] for h in curve] == [0, 2]
    assert len({h["eval_majority_action_accuracy"] for h in curve}) == 1  # the same turns at every step
    card = json.loads((run / "training_card.json").read_text())["task_metric"]
    assert card["majority_actions"] and [c["step"] for c in card["curve"]] == [0, 2]
    assert "action_accuracy" in card["adapter_minus_majority"]
    assert (run / "loss.png").stat().st_size > 0
