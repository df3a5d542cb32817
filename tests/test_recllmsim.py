"""The RecLLMSim loaders: every file of the shared copy read, bad records (synthetic: the shared copy
has none) reported with file and reason and never loaded."""

import json

import pytest

from data_prep import recllmsim


@pytest.fixture(scope="module")
def shared(raw):
    return raw / "recllmsim"


def test_the_shared_copy_loads_whole(shared):
    loaded = recllmsim.load(shared)
    assert loaded.counts == {"llm": 1856, "human": 291} and loaded.rejects == []
    llm = [c for c in loaded.conversations if c.source == "llm"]
    human = [c for c in loaded.conversations if c.source == "human"]
    assert len({c.persona for c in llm}) == 100 and len({c.persona for c in human}) == 31
    first = llm[0]
    assert set(first.ratings) == set(recllmsim.RATING_SCALES) and first.language == "en"
    assert all(len(t.intents) == 1 for t in first.turns if t.role == "user")
    assert all(t.content_zh for t in first.turns)  # the translations ride along
    assert human[0].language == "zh" and set(human[0].questionnaire) == {
        "Memorization", "Detail", "Availability", "Diversity",
    }  # fmt: skip
    pool, rejects = recllmsim.load_preference_pool(shared)
    assert len(pool) == 100 and rejects == [] and pool[0]["Gender"] == "Male"
    contexts = recllmsim.load_task_contexts(shared)
    assert "choosing restaurant" in contexts and "[TIME]" in contexts["choosing restaurant"]["prompt"]
    assert contexts["preparing gifts"]["slots"]["TARGET"][:2] == ["teacher", "grandmother"]
    tags = recllmsim.load_tag_dictionary(shared)
    assert tags["occupation"]["学生"] == "Student"


def llm_record(**changes):
    record = {
        "task": "preparing gifts",
        "preference_id": 7,
        "preference": "1. Gender: Female",
        "task_context": "A gift for a friend.",
        "history": [
            {"role": "user", "content": "Ideas?", "intent": "Recommendation"},
            {"role": "assistant", "content": "A book.", "hallucination": {"hallucination": False}},
        ],
        "rating": dict.fromkeys(recllmsim.RATING_SCALES, 1),
        "preference_summary": ["thoughtful"],
        "conflict": False,
    }
    record.update(changes)
    return record


def test_bad_records_are_reported_with_file_and_reason_and_not_loaded(tmp_path):
    folder = tmp_path / "LLM_agent_user" / "preparing gifts"
    folder.mkdir(parents=True)
    (folder / "0.json").write_text(json.dumps(llm_record()))
    (folder / "1.json").write_text("{not json")
    (folder / "2.json").write_text(
        json.dumps(llm_record(rating={**llm_record()["rating"], "Memorization": 2}))
    )
    no_history = llm_record()
    del no_history["history"]
    (folder / "3.json").write_text(json.dumps(no_history))
    (folder / "4.json").write_text(json.dumps(llm_record(history=[{"role": "critic", "content": "x"}])))
    (folder / "5.json").write_text(
        json.dumps(llm_record(history=[{"role": "user", "content": "x", "intent": 3}]))
    )
    (folder / "6.json").write_text(json.dumps([1, 2]))
    person = tmp_path / "real_human_user" / "User_0" / "礼物准备"
    person.mkdir(parents=True)
    (person / "0.json").write_text(
        json.dumps(
            {
                "history": [{"role": "user", "content": "你好", "intent": ["推荐"]}],
                "task_context": "t",
                "task_type": "礼物准备",
                "profile": {"gender": "Female"},
                "questionnaire": [],
            },
            ensure_ascii=False,
        )
    )
    loaded = recllmsim.load(tmp_path)
    assert [c.file for c in loaded.conversations] == ["LLM_agent_user/preparing gifts/0.json"]
    reasons = {r["file"].split("/", 1)[1]: r["reason"] for r in loaded.rejects}
    assert reasons["preparing gifts/1.json"].startswith("not JSON")
    assert (
        "Memorization" in reasons["preparing gifts/2.json"] and "[0, 1]" in reasons["preparing gifts/2.json"]
    )
    assert reasons["preparing gifts/3.json"] == "missing field 'history'"
    assert "role 'critic'" in reasons["preparing gifts/4.json"]
    assert "intent 3" in reasons["preparing gifts/5.json"]
    assert "list, not an object" in reasons["preparing gifts/6.json"]
    assert reasons["User_0/礼物准备/0.json"].startswith("profile lacks age")
    assert loaded.counts == {"llm": 1, "rejected:llm": 6, "rejected:human": 1}
