"""The conversational simulator's training pairs are the simulator's own prompts and JSON answers: each
completion parses under the constraint the simulator uses, each prompt fits the budget, and what the data
does not record is left empty."""

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
