"""The sandbox's memory with a scripted backend and a hand-made embedding: enhancement, promotion with
insights, the forgetting formula, retrieval order, reflection merging, checkpoints."""

import json

import numpy as np
import pytest

from agents.llm import Answer
from agents.sandbox.config import MemoryConfig
from agents.sandbox.memory import (
    LLMMemoryModel,
    Memory,
    Record,
    forget_probability,
    promote_due,
    reflect_all,
)

THEMES = ("comedy", "horror", "cooking")


def embed(texts):
    """One axis per theme word (a text without one points elsewhere): cosine 1 within a theme, 0 across."""
    return np.array(
        [[float(w in t) for w in THEMES] + [float(not any(w in t for w in THEMES))] for t in texts]
    )


class ScriptedBackend:
    """Answers in order; records what it was asked."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), []

    def generate(self, conversations, sampling, constraint=None):
        self.calls.append((conversations, constraint))
        return [Answer(self.answers.pop(0)) for _ in conversations]


def compressed(summary, importance):
    return json.dumps({"summary": summary, "importance": importance})


def memory(answers, **settings):
    backend = ScriptedBackend(answers)
    config = MemoryConfig(**{"importance_threshold": 0.3, "enhance_times": 2, **settings})
    return Memory(config, embed, LLMMemoryModel(backend), np.random.default_rng(0)), backend


def test_sensory_memory_compresses_in_one_batch_and_drops_the_unimportant():
    mem, backend = memory([compressed("I laughed at a comedy", 8), compressed("It rained", 2)])
    kept = mem.observe(["Watched a comedy and laughed a lot", "It rained today"], now=1)
    assert [r.text for r in kept] == ["I laughed at a comedy"] and kept[0].importance == 0.8
    assert len(backend.calls) == 1 and len(backend.calls[0][0]) == 2  # one batched call
    assert backend.calls[0][1].kind == "json"  # a structured output
    assert mem.counts["dropped"] == 1 and [r.text for r in mem.short] == ["I laughed at a comedy"]


def test_enhancement_counts_and_promotion_moves_record_enhancers_and_insight_to_long_term():
    answers = [compressed("comedy one", 6), compressed("comedy two", 7), compressed("horror night", 5)]
    answers += [compressed("comedy three", 4), json.dumps({"insight": "I love comedy"})]
    mem, _ = memory(answers)
    mem.observe(["a", "b", "c"], now=1)  # comedy two enhances comedy one; horror is new
    assert [(r.text, r.enhanced) for r in mem.short] == [("comedy one", 1), ("horror night", 0)]
    assert mem.short[0].importance == 0.7  # the enhancer's higher importance
    mem.observe(["d"], now=2)  # the second enhancement: promoted with an insight
    assert [r.text for r in mem.short] == ["horror night"]
    assert [(r.text, r.kind) for r in mem.long] == [
        ("comedy one", "observation"),
        ("comedy two", "observation"),
        ("comedy three", "observation"),
        ("I love comedy", "insight"),
    ]
    assert mem.counts["enhanced"] == 2 and mem.counts["insights"] == 1


def test_the_forgetting_formula_by_hand():
    g = forget_probability(np.array([0.5, 0.9, 0.2]), np.array([0.5, 0.9, 0.1]), beta=2.0, delta=0.1)
    # 1 - (0.5+0.5)/2 * max(0.25, 0.1);  1 - 0.9 * max(0.81, 0.1);  1 - 0.15 * max(0.01, 0.1)
    assert g == pytest.approx([0.875, 0.271, 0.985])


@pytest.mark.parametrize(("scale", "draw", "forgotten"), [(1.0, 0.5, 1), (0.1, 0.5, 0), (0.1, 0.05, 1)])
def test_forgetting_is_proportional_to_g_and_keeps_the_recent_and_important(scale, draw, forgotten):
    mem, _ = memory([], forget_scale=scale)
    mem.long = [
        Record("fresh and vital", 0.99, 9, 10, [1, 0, 0, 0]),  # g = 1 - 0.99 * 0.98 ~ 0.03
        Record("old and trivial", 0.01, 0, 0, [0, 1, 0, 0]),  # recency 0.99^10 = 0.904, s = 0.01: g ~ 0.62
    ]
    # the probability is scale x g: 0.62 and 0.062 for the old record, 0.03 and 0.003 for the fresh one
    mem.rng = type("Draws", (), {"random": lambda self, n: np.array([draw, draw])})()
    assert mem.forget(now=10) == forgotten
    assert [r.text for r in mem.long] == ["fresh and vital", "old and trivial"][: 2 - forgotten]


def test_the_real_history_is_forgotten_at_its_own_smaller_scale():
    mem, _ = memory([], forget_scale=1.0, history_forget_scale=0.1)
    old = Record("old film", 0.01, 0, 0, [0, 1, 0, 0], kind="history")  # g ~ 0.62: 0.062 as history
    mem.long = [old, Record("old and trivial", 0.01, 0, 0, [0, 1, 0, 0])]
    mem.rng = type("Draws", (), {"random": lambda self, n: np.array([0.1, 0.1])})()
    assert mem.forget(now=10) == 1 and mem.long == [old]


def test_a_new_record_enhances_every_alike_short_term_record():
    mem, _ = memory([compressed("comedy three", 9)], enhance_times=5)
    mem.short = [
        Record("comedy one", 0.5, 1, 1, embed(["comedy"])[0]),
        Record("horror", 0.5, 1, 1, embed(["horror"])[0]),
        Record("comedy two", 0.6, 1, 1, embed(["comedy"])[0]),
    ]
    mem.observe(["c"], now=2)
    assert [(r.text, r.enhanced, r.enhancers) for r in mem.short] == [
        ("comedy one", 1, ["comedy three"]),
        ("horror", 0, []),
        ("comedy two", 1, ["comedy three"]),
    ]
    assert mem.counts["enhanced"] == 2 and [r.importance for r in mem.short] == [0.9, 0.5, 0.9]


def history(n):
    return [
        Record(f"film {k}", 0.5, -10 + k, -10 + k, None, kind="history", key=f"film {k}") for k in range(n)
    ]


@pytest.mark.parametrize(
    ("switches", "short", "long"),
    [
        ({}, 2, 3),
        ({"short_term": False}, 0, 5),
        ({"long_term": False}, 2, 0),
        ({"short_term": False, "long_term": False}, 0, 0),
    ],
)
def test_the_real_past_seeds_short_and_long_term_and_the_ablations_turn_parts_off(switches, short, long):
    mem, _ = memory([], short_term_capacity=2, **switches)
    mem.seed(history(5))
    assert [r.text for r in mem.short] == [f"film {k}" for k in range(5 - short, 5)]  # the newest
    assert len(mem.long) == long and all(r.kind == "history" for r in mem.short + mem.long)
    assert all(np.array_equal(r.embedding, embed([r.key])[0]) for r in mem.short + mem.long)  # by its film
    assert mem.counts["dropped_no_long_term"] == (0 if switches.get("long_term", True) else 5 - short)


def test_ablations_route_new_memories_and_stop_reflection():
    mem, backend = memory([compressed("comedy one", 6)], short_term=False)
    mem.observe(["a"], now=1)
    assert mem.short == [] and [r.text for r in mem.long] == ["comedy one"]
    mem, backend = memory([compressed("comedy one", 6)], long_term=False, short_term_capacity=1)
    mem.short = [Record("horror", 0.5, 0, 0, embed(["horror"])[0])]
    mem.observe(["a"], now=1)  # the horror record leaves short-term with nowhere to go
    assert (
        [r.text for r in mem.short] == ["comedy one"]
        and mem.long == []
        and mem.counts["dropped_no_long_term"] == 1
    )
    mem, backend = memory([], reflection=False)
    mem.seed(history(20))
    assert mem.reflect(now=1) is None and backend.calls == []


def test_retrieval_ranks_by_normalised_relevance_recency_importance_and_refreshes_access():
    mem, _ = memory([])
    mem.long = [
        Record("horror film", 0.9, 0, 0, embed(["horror"])[0].tolist()),  # 0 + 0 + 1 = 1
        Record(
            "comedy film", 0.1, 0, 0, embed(["comedy"])[0].tolist()
        ),  # 1 + 0 + 0 = 1, older index wins ties
        Record("comedy night", 0.5, 5, 5, embed(["comedy"])[0].tolist()),  # 1 + 1 + 0.5 = 2.5
    ]
    got = mem.retrieve("a comedy please", now=5, top=2)
    assert [r.text for r in got] == ["comedy night", "horror film"]
    assert [r.accessed for r in mem.long] == [5, 0, 5]  # the retrieved were accessed now


def test_reflection_adds_an_insight_and_merges_near_duplicates():
    mem, backend = memory([json.dumps({"insight": "I am a film person"})], merge_similarity=0.95)
    mem.long = [
        Record("comedy A", 0.4, 1, 1, embed(["comedy"])[0].tolist()),
        Record("comedy B", 0.6, 2, 2, embed(["comedy"])[0].tolist()),
        Record("horror C", 0.5, 3, 3, embed(["horror"])[0].tolist()),
    ]
    reflection = mem.reflect(now=4)
    assert reflection.kind == "reflection" and reflection.text == "I am a film person"
    assert reflection.importance == 0.6
    assert [r.text for r in mem.long] == ["comedy B", "horror C", "I am a film person"]
    assert mem.long[0].enhancers == ["comedy A"] and mem.counts["merged"] == 1
    assert "comedy B" in backend.calls[0][0][0][0]["content"]


def test_a_prompt_reads_top_long_term_and_all_short_term():
    mem, _ = memory([], retrieve_top=1)
    mem.long = [Record("horror film", 0.2, 0, 0, embed(["horror"])[0].tolist())]
    mem.long.append(Record("comedy film", 0.9, 0, 0, embed(["comedy"])[0].tolist()))
    mem.short = [Record("cooking show", 0.5, 1, 1, embed(["cooking"])[0].tolist())]
    assert mem.context("comedy", now=1) == ["comedy film", "cooking show"]


def test_unusable_answers_fall_back_and_are_counted_never_clamped():
    mem, _ = memory(["not json", compressed("too important", 11), compressed("fine", 5)], enhance_times=9)
    kept = mem.observe(["first", "second", "third"], now=0)
    assert [(r.text, r.importance) for r in kept][:2] == [("first", 0.5), ("second", 0.5)]
    # both fail the schema (the shared constraint's check: not JSON; an importance above its maximum)
    assert mem.model.counts["fallbacks"] == 2 and mem.model.counts["unparsable"] == 2


def test_a_checkpoint_restores_the_same_next_state():
    answers = [compressed("comedy one", 6), compressed("horror", 5), compressed("comedy two", 7)]
    mem, _ = memory(answers + answers)
    mem.seed(history(3))
    mem.observe(["a", "b"], now=1)
    state = json.loads(json.dumps(mem.to_json()))  # through JSON text, as on disk
    assert all("embedding" not in r for r in state["short"] + state["long"])  # recomputed on load
    twin, _ = memory(answers[2:])
    twin.load_json(state)
    mem.model.backend.answers = answers[2:]
    mem.observe(["c"], now=2)
    twin.observe(["c"], now=2)
    assert twin.to_json() == mem.to_json()


def test_insights_and_reflections_of_many_agents_take_one_batched_call_each():
    backend = ScriptedBackend([json.dumps({"insight": f"insight {k}"}) for k in range(5)])
    model = LLMMemoryModel(backend)
    config = MemoryConfig(importance_threshold=0.3, enhance_times=1)
    memories = [Memory(config, embed, model, np.random.default_rng(k)) for k in range(3)]
    for k, mem in enumerate(memories[:2]):  # two agents each repeat a theme once: both due
        mem.store([(f"comedy {k}", 0.5), (f"comedy {k} again", 0.6)], now=1)
        assert [r.text for r in mem.due] == [f"comedy {k}"] and mem.short == []
    promote_due(memories, now=1)
    assert len(backend.calls) == 1 and len(backend.calls[0][0]) == 2  # one call, one prompt per theme
    assert [[r.kind for r in m.long] for m in memories[:2]] == [["observation"] * 2 + ["insight"]] * 2
    assert memories[1].long[-1].text == "insight 1" and all(m.due == [] for m in memories)
    reflections = reflect_all(memories, now=2)  # the third memory has nothing to reflect on
    assert len(backend.calls) == 2 and len(backend.calls[1][0]) == 2
    assert [r.text if r else None for r in reflections] == ["insight 2", "insight 3", None]
