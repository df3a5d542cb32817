"""tuned-write: the stars decided first, reviews the model writes after them, chosen by a utility of what
the agent sees; copies of an older review and looping texts are kept out (scripted LLM, real store)."""

import numpy as np
import pytest

from agents.llm import Answer, LLMConfig, choice_answer
from agents.review import agent as agent_module
from agents.review import write
from agents.review.agent import AgentConfig, ReviewAgent
from data_prep.prompt import answer_beginning, parse_completion, render_prompt
from data_prep.store import ReviewStore
from tests.test_agents import tasks_with_dates


@pytest.fixture(scope="module")
def write_tasks(yelp_store, tmp_path_factory, make_tasks):
    return make_tasks(yelp_store, tmp_path_factory.mktemp("write_tasks"), n=20, seed=1)


def test_copies_and_loops_are_spans_of_words():
    older = ["The pancakes were fluffy and the coffee was hot and fresh every time we came."]
    known = write.copied_spans(older)
    assert write.copies("Honestly the pancakes were fluffy and the coffee was hot today", known)
    assert not write.copies("The pancakes were fluffy, the syrup too sweet and the coffee cold", known)
    # under 8 words, a copy is a whole review written before the moment, case and spacing aside
    short = write.short_texts(
        [("Great gift card!", 100), ("great  GIFT card", 50), ("A long review " * 4, 1)]
    )
    assert short == {"great gift card": 50}
    assert write.copies("Great gift card.", known, short, before=60)
    assert not write.copies("Great gift card.", known, short, before=50)  # written at the moment, not before
    assert write.copies("Great gift card.", known, short) and not write.copies("Great card.", known, short)
    assert write.loops("It is very soft and it is very soft.")
    assert not write.loops("It is very soft and the colour is lovely.")


def test_the_utility_weighs_its_features_and_eligibility_comes_first():
    values = {k: np.zeros(3) for k in write.FEATURES}
    values["sentiment"] = np.array([-0.5, -0.1, 0.0])
    values["consensus"] = np.array([0.9, 0.2, 0.1])
    assert write.choose(values, {"sentiment": 1.0}, [True] * 3) == 2
    assert write.choose(values, {"consensus": 1.0}, [True] * 3) == 0
    assert write.choose(values, {"consensus": 1.0}, [False, True, True]) == 1  # the best one copies
    assert (
        write.choose(values, {"consensus": 0.0}, [False, False, True]) == 2
    )  # all weights 0: first eligible
    assert write.choose(values, {"consensus": 1.0}, [False] * 3) == 0  # none eligible: all compete
    with pytest.raises(ValueError, match="the features are"):
        write.check_weights({"topic": 1.0})
    with pytest.raises(ValueError, match="weights >= 0"):
        write.check_weights({"sentiment": -1.0})


def test_features_agree_with_what_they_name():
    vectors = np.eye(3)[:2]  # two orthogonal candidates
    user = np.array([[1.0, 0.0, 0.0]])
    out = write.features(
        vectors,
        np.array([0.9, -0.9]),
        np.array([[1, 0, 0, 0], [0, 0, 1, 0]], float),
        0.8,
        user,
        np.zeros((0, 3)),
        np.array([[1.0, 0, 0, 0]]),
        np.zeros((0, 4)),
    )
    assert out["user_topic"].tolist() == [1.0, 0.0] and out["item_topic"].tolist() == [0.0, 0.0]
    assert (
        out["sentiment"][0] > out["sentiment"][1] and out["user_emotion"][0] == 0.0 > out["user_emotion"][1]
    )
    assert out["consensus"].tolist() == [0.0, 0.0]
    assert out["user_length"].tolist() == [0.0, 0.0]  # no word counts given: the feature cannot move a choice
    sized = write.features(
        vectors, np.zeros(2), np.zeros((2, 4)), 0.0, user, np.zeros((0, 3)), np.zeros((1, 4)),
        np.zeros((0, 4)), np.array([3, 39]), np.array([30, 39, 50]),
    )  # fmt: skip
    assert sized["user_length"][1] == 0.0 and sized["user_length"][0] == pytest.approx(-np.log(40 / 4))


def test_the_answer_beginning_is_continued_on_the_tiny_model(tiny_model):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    begun = render_prompt(
        tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "stars: 4\nreview:"}]
    )
    assert begun.endswith("stars: 4\nreview:") and begun.startswith(
        render_prompt(tokenizer, [{"role": "user", "content": "hi"}])
    )
    assert answer_beginning(3.49) == "stars: 3\nreview:" and answer_beginning(3.5) == "stars: 4\nreview:"
    assert answer_beginning(0.2) == "stars: 1\nreview:"


class Writer:
    """Scripted: stars read as 5 from probabilities; the greedy review copies the user's latest older
    review, the samples are the model's own, one of them looping."""

    def __init__(self, store, tasks):
        self.store, self.tasks, self.calls = store, tasks, []

    def option_probs(self, conversations, options, samples=8, seed=0, prefix=""):
        return [choice_answer(options, [float(o == "5") for o in options], "logprobs") for _ in conversations]

    def generate(self, conversations, sampling, constraint=None):
        self.calls.append((conversations, sampling))
        out = []
        for k, c in enumerate(conversations):
            assert c[-1]["role"] == "assistant" and c[-1]["content"].startswith(
                "stars: "
            )  # the stars come first
            if sampling.temperature == 0:
                task = self.tasks[k]
                older = self.store.get_reviews(user_id=task["user_id"], before=task["ts"])
                out.append(Answer(" " + older[-1]["text"]))
            else:
                texts = (" It is good and it is good and it is good.", " The crepes here are SOOOO yummy.")
                out.append(Answer(texts[k % 3] if k % 3 < 2 else f" My own words number {k}."))
        return out


@pytest.mark.slow
def test_tuned_write_writes_after_the_decided_stars_and_never_keeps_a_copy(
    yelp_store, write_tasks, monkeypatch
):
    store = ReviewStore.open(yelp_store, tasks=write_tasks)
    tasks = [
        t for t in tasks_with_dates(write_tasks) if store.get_reviews(user_id=t["user_id"], before=t["ts"])
    ][:4]
    fake = Writer(store, tasks)
    monkeypatch.setattr(agent_module, "load_llm", lambda config: fake)
    from agents.encoders import packaged_minilm

    agent = ReviewAgent(
        AgentConfig(kind="tuned-write", samples=3, batch_size=8),
        LLMConfig(),
        store,
        encoder=packaged_minilm("cpu", 16),
    )
    predictions = agent.predict(tasks)
    # a short review of the sample's store: a copy only for a task after it was written
    written = write.short_texts(store.visible_texts())["the crepes here are soooo yummy"]
    crepes = [p.candidates[2]["copied"] for p in predictions]
    assert crepes == [t["ts"] > written for t in tasks] and any(crepes)
    greedy, sampled = fake.calls[0], fake.calls[1]
    assert greedy[1].temperature == 0 and sampled[1].temperature > 0 and len(sampled[0]) == 3 * len(tasks)
    for p, conversation in zip(predictions, greedy[0], strict=True):
        assert conversation[-1]["content"] == answer_beginning(p.stars)  # written after the decided stars
        assert [c["source"] for c in p.candidates] == ["llm", "sample", "sample", "sample"]
        assert p.candidates[0]["copied"] and not p.candidates[p.chosen]["copied"]
        assert not p.candidates[p.chosen]["loops"] and p.review == p.candidates[p.chosen]["text"]
        assert p.candidates[p.chosen]["source"] == "sample" and set(p.candidates[0]["features"]) == set(
            write.FEATURES
        )
        assert p.counts["copied_candidates"] >= 1 and p.counts["written_candidates"] == 4
    with pytest.raises(ValueError, match="leave selection out"):
        ReviewAgent(AgentConfig(kind="tuned-write", selection="mbr"), LLMConfig(), store, encoder=None)
    assert parse_completion(answer_beginning(4.2) + " Lovely.") == (4.0, "Lovely.")
