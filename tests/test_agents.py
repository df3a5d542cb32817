import hashlib
import json
import math
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
import yaml
from openai_fakes import ChatHandler

from agents.config import parse_flat
from agents.encoders import packaged_minilm
from agents.llm import (
    Answer,
    Constraint,
    LLMConfig,
    OpenAIBackend,
    Sampling,
    choice_answer,
    load_llm,
    vllm_lora_rank,
)
from agents.review import agent as agent_module
from agents.review import simulate
from agents.review.agent import KINDS, AgentConfig, ReviewAgent, in_sample
from agents.review.stars import StarModel
from data_prep.schema import format_utc
from data_prep.store import ReviewStore, to_epoch
from data_prep.tasks import read_targets, read_tasks
from eval.review import baselines, suite


@pytest.fixture(scope="module")
def yelp_tasks(yelp_store, tmp_path_factory, make_tasks):
    return make_tasks(yelp_store, tmp_path_factory.mktemp("agent_tasks"), n=20, seed=1)


def texts(answers: list[Answer]) -> list[str]:
    return [a.text for a in answers]


def tasks_with_dates(task_dir):
    targets = read_targets(task_dir)
    return [
        {**t, "date": targets[t["task_id"]]["date"], "ts": targets[t["task_id"]]["ts"]}
        for t in read_tasks(task_dir)
    ]


# -- the OpenAI-compatible backend against a real HTTP server on loopback ------------------------------


class Scripted(ChatHandler):
    script: list[str] = []  # per request: "429", "500", "slow" or "ok"
    seen: list[str] = []
    bodies: list[dict] = []
    structured = True  # False: the server answers 400 to response_format, like one without the feature
    logprobs = True  # False: the server returns no log-probabilities even when asked
    top = [("4", -0.4), (" 4", -2.0), ("3", -1.5), ("Sure", -3.0)]  # the first token's top log-probabilities

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.body()
        Scripted.seen.append(self.headers.get("Authorization", ""))
        Scripted.bodies.append(body)
        action = Scripted.script.pop(0) if Scripted.script else "ok"  # or "long": cut at max_tokens
        if action == "slow":
            time.sleep(1.5)
        message = b'{"error": {"message": "try later"}}'
        if "response_format" in body and not Scripted.structured:
            action, message = "400", b'{"error": {"message": "unknown field: response_format"}}'
        if action in ("400", "429", "500"):
            self.send_response(int(action))
            self.send_header("Content-Type", "application/json")
            self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(message)
            return
        reply = {
            "id": "x",
            "object": "chat.completion",
            "created": 0,
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "length" if action == "long" else "stop",
                    "message": {
                        "role": "assistant",
                        "content": json.dumps({"stars": 4, "review": body["messages"][-1]["content"]})
                        if "response_format" in body
                        else "stars: 4\nreview: " + body["messages"][-1]["content"],
                    },
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        }
        if body.get("logprobs") and Scripted.logprobs:
            top = [{"token": t, "logprob": lp, "bytes": None} for t, lp in Scripted.top]
            reply["choices"][0]["logprobs"] = {"content": [{**top[0], "top_logprobs": top}]}
        self.send_json(reply)


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Scripted.seen, Scripted.bodies, Scripted.structured, Scripted.logprobs = [], [], True, True
    yield f"http://127.0.0.1:{httpd.server_port}/v1"
    httpd.shutdown()


def test_openai_backend_retries_429_5xx_and_timeouts(server, monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "sk-test-secret")
    config = LLMConfig(
        backend="openai",
        model="m",
        base_url=server,
        api_key_env="TEST_LLM_KEY",
        concurrency=2,
        timeout_s=0.5,
        max_retries=4,
    )
    backend = OpenAIBackend(config)
    Scripted.script = ["429", "500", "ok"]
    assert texts(backend.generate([[{"role": "user", "content": "a"}]], Sampling())) == [
        "stars: 4\nreview: a"
    ]
    assert len(Scripted.seen) == 3 and Scripted.seen[0] == "Bearer sk-test-secret"
    Scripted.script = ["slow", "ok"]  # the first answer comes after the 0.5 s timeout: retried
    conversations = [[{"role": "user", "content": str(i)}] for i in range(3)]
    assert texts(backend.generate(conversations, Sampling())) == [f"stars: 4\nreview: {i}" for i in range(3)]
    assert "sk-test-secret" not in json.dumps(backend.info)
    Scripted.script = ["long"]  # an answer that stopped at max_tokens is flagged
    assert [a.cut_short for a in backend.generate([[{"role": "user", "content": "x"}]], Sampling())] == [True]
    assert [a.cut_short for a in backend.generate([[{"role": "user", "content": "x"}]], Sampling())] == [
        False
    ]


def test_openai_backend_asks_for_a_json_schema_and_falls_back_where_the_server_has_none(server, monkeypatch):
    monkeypatch.setenv("TEST_LLM_KEY", "k")
    config = LLMConfig(
        backend="openai", model="m", base_url=server, api_key_env="TEST_LLM_KEY", max_retries=0
    )
    backend = OpenAIBackend(config)
    answer = Constraint.answer(50)
    (tacos,) = backend.generate([[{"role": "user", "content": "tacos"}]], Sampling(), constraint=answer)
    assert tacos.text == "stars: 4\nreview: tacos"  # the JSON answer written back in the renderer's format
    schema = Scripted.bodies[-1]["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["stars"] == {"type": "integer", "minimum": 1, "maximum": 5}
    assert schema["properties"]["review"]["maxLength"] == 50 and tacos.constrained
    from openai import BadRequestError

    Scripted.script = ["400"]  # another 400 (say, a prompt too long): this task's error, no fallback
    with pytest.raises(BadRequestError):
        backend.generate([[{"role": "user", "content": "x"}]], Sampling(), constraint=answer)
    assert backend.structured
    Scripted.structured = False  # a server without structured outputs: asked again without, then never
    conversations = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    loose = backend.generate(conversations, Sampling(), constraint=answer)
    assert texts(loose) == ["stars: 4\nreview: a", "stars: 4\nreview: b"]
    assert not backend.structured and [a.constrained for a in loose] == [False, False]  # counted by the agent
    assert "response_format" not in Scripted.bodies[-1]


def test_openai_option_probs_reads_top_logprobs_and_samples_where_the_server_gives_none(server, monkeypatch):
    """A rating from the first answer token's top_logprobs ("4" and " 4" add up; an option outside them
    has probability 0); a server without log-probabilities gets sampled answers, labelled."""
    from agents.llm import option_probs

    monkeypatch.setenv("TEST_LLM_KEY", "k")
    config = LLMConfig(
        backend="openai", model="m", base_url=server, api_key_env="TEST_LLM_KEY", max_retries=0
    )
    backend = OpenAIBackend(config)
    (answer,) = option_probs(backend, [[{"role": "user", "content": "rate"}]], ["1", "2", "3", "4", "5"])
    body = Scripted.bodies[-1]
    assert body["logprobs"] is True and body["top_logprobs"] == 20 and body["max_tokens"] == 1
    assert body["temperature"] == 0.0
    four, three = math.exp(-0.4) + math.exp(-2.0), math.exp(-1.5)
    assert answer.probs_from == "top_logprobs" and answer.text == "4"
    assert answer.probs == pytest.approx(
        {"1": 0, "2": 0, "3": three / (four + three), "4": four / (four + three), "5": 0}
    )
    assert answer.expected == pytest.approx((3 * three + 4 * four) / (four + three))
    Scripted.logprobs = False  # a server without log-probabilities: each prompt sampled, labelled
    Scripted.bodies = []
    (sampled,) = option_probs(
        backend, [[{"role": "user", "content": "3"}]], ["1", "2", "3", "4", "5"], samples=3
    )
    assert sampled.probs_from == "samples" and not backend.logprobs
    assert len([b for b in Scripted.bodies if "logprobs" not in b]) == 3  # three sampled answers
    assert all(b["temperature"] == 1.0 for b in Scripted.bodies if "logprobs" not in b)


def test_a_remote_model_gets_prompts_fitted_with_its_own_tokenizer(
    server, monkeypatch, yelp_store, yelp_tasks
):
    """With tokenizer: in the config the openai backend fits prompts to prompt_tokens as the training
    pairs were fitted; without one it cannot, and says so."""
    from data_prep.prompt import count_tokens

    monkeypatch.setenv("TEST_LLM_KEY", "k")
    store = ReviewStore.open(yelp_store, tasks=yelp_tasks)
    config = AgentConfig(kind="retrieval-llm", retrieval="bm25", k_user=8, k_item=8, prompt_tokens=300)
    remote = {"backend": "openai", "model": "m", "base_url": server, "api_key_env": "TEST_LLM_KEY"}
    tasks = tasks_with_dates(yelp_tasks)[:4]
    fitted = ReviewAgent(config, LLMConfig(**remote, tokenizer="smollm2-135m-instruct-offline"), store)
    fitted.predict(tasks)
    tokenizer = fitted.tokenizer
    assert tokenizer is not None and all(
        count_tokens(tokenizer, b["messages"]) <= 300 for b in Scripted.bodies
    )
    Scripted.bodies = []
    unfitted = ReviewAgent(config, LLMConfig(**remote), store)
    assert unfitted.tokenizer is None
    unfitted.predict(tasks)
    assert max(count_tokens(tokenizer, b["messages"]) for b in Scripted.bodies) > 300  # the budget bites


def test_several_api_keys_take_the_requests_in_turn_and_usage_is_reported(server, monkeypatch):
    monkeypatch.setenv("TEST_KEY_A", "sk-a")
    monkeypatch.setenv("TEST_KEY_B", "sk-b")
    config = LLMConfig(backend="openai", model="m", base_url=server, api_key_env="TEST_KEY_A, TEST_KEY_B")
    backend = OpenAIBackend(config)
    conversations = [[{"role": "user", "content": str(i)}] for i in range(6)]
    answers = backend.generate(conversations, Sampling())
    assert texts(answers) == [f"stars: 4\nreview: {i}" for i in range(6)]
    assert sorted(Scripted.seen) == ["Bearer sk-a"] * 3 + ["Bearer sk-b"] * 3
    assert [(a.prompt_tokens, a.answer_tokens) for a in answers] == [(7, 3)] * 6 and backend.info["keys"] == 2
    # one seed per request (seed + index), so several samples of one prompt are not the same sample
    assert sorted((b["messages"][0]["content"], b["seed"]) for b in Scripted.bodies) == [
        (str(i), i) for i in range(6)
    ]
    assert "sk-a" not in json.dumps(backend.info) and "sk-b" not in json.dumps(backend.info)
    monkeypatch.delenv("TEST_KEY_B")
    with pytest.raises(SystemExit, match="TEST_KEY_B"):  # every named key must be set
        OpenAIBackend(config)


def test_openai_backend_needs_its_key(monkeypatch):
    monkeypatch.delenv("NO_SUCH_KEY", raising=False)
    with pytest.raises(SystemExit, match="NO_SUCH_KEY"):
        OpenAIBackend(
            LLMConfig(backend="openai", model="m", base_url="http://127.0.0.1:9", api_key_env="NO_SUCH_KEY")
        )


# -- retrieval, parsing, fallback ----------------------------------------------------------------------


class FakeLLM:
    """Scripted answers: first pass, then the stricter retry."""

    def __init__(self, first: list[str], retry: list[str]):
        self.first, self.retry, self.calls = first, retry, []

    def generate(self, conversations, sampling, constraint=None):
        self.calls.append(conversations)
        return [Answer(t) for t in (self.first if len(self.calls) == 1 else self.retry[: len(conversations)])]


def test_context_never_shows_a_target_or_a_later_review(yelp_store, yelp_tasks):
    store = ReviewStore.open(yelp_store, tasks=yelp_tasks)
    agent = ReviewAgent(AgentConfig(kind="stats", retrieval="bm25", k_user=50, k_item=50), None, store)
    targets = {row["review_id"] for row in read_targets(yelp_tasks).values()}
    for task in tasks_with_dates(yelp_tasks):
        ctx = agent.context(task)
        shown = ctx.history + ctx.item_pool + ctx.item_reviews + ctx.user_reviews
        assert not {r["review_id"] for r in shown} & targets
        assert all(r["date"] < task["date"] for r in shown)
        assert not any(r["user_id"] == task["user_id"] and r["item_id"] == task["item_id"] for r in shown)


def test_the_items_reviews_are_other_users_even_without_a_block(tmp_path):
    """The store blocks task pairs, so a task's user has no review of its item there. An unblocked store
    can hold one: it stays in the user's history and never joins the item's reviews by other users."""
    from conftest import write_lines

    from data_prep import build

    day = lambda d: f"2020-01-{d:02d} 12:00:00"  # noqa: E731
    rows = [("own1", "u1", "b0", 1), ("oth1", "u2", "b0", 2), ("own2", "u1", "b0", 3)]
    reviews = [
        {"review_id": r, "user_id": u, "business_id": b, "stars": 3.0, "text": f"{r} text", "date": day(d)}
        for r, u, b, d in rows
    ]
    path = write_lines(tmp_path / "yelp_academic_dataset_review.json.gz", reviews)
    build.main(["--source", "yelp", "--input", str(path), "--out", str(tmp_path / "data")])
    agent = ReviewAgent(AgentConfig(kind="stats", retrieval="bm25"), None, ReviewStore(tmp_path / "data"))
    ctx = agent.context({"task_id": "t", "user_id": "u1", "item_id": "b0", "ts": to_epoch(day(4))})
    assert [r["review_id"] for r in ctx.history] == ["own1", "own2"]
    assert [r["review_id"] for r in ctx.item_all] == [r["review_id"] for r in ctx.item_pool] == ["oth1"]


def test_unusable_answers_are_retried_then_fall_back_never_empty(yelp_store, yelp_tasks, monkeypatch):
    first = [
        "stars: 4\nreview: Lovely tacos.",  # fine
        "I think it is good.",  # no stars, no review
        "stars: nine\nreview: ",  # stars out of range, empty review
        "stars: four\nreview: Good value.",  # stars as a word: fine
    ]
    retry = ["stars: 2\nreview: Slow service.", "still nothing"]  # the first retry works, the second does not
    fake = FakeLLM(first, retry)
    monkeypatch.setattr(agent_module, "load_llm", lambda config: fake)
    store = ReviewStore.open(yelp_store, tasks=yelp_tasks)
    agent = ReviewAgent(AgentConfig(kind="retrieval-llm", retrieval="bm25"), LLMConfig(), store)
    predictions = agent.predict(tasks_with_dates(yelp_tasks)[:4])
    assert [p.source for p in predictions] == ["llm", "llm_retry", "fallback", "llm"]
    assert [p.stars for p in predictions[:2]] + [predictions[3].stars] == [4.0, 2.0, 4.0]
    assert (
        1 <= predictions[2].stars <= 5 and predictions[2].review.strip()
    )  # calibrated stars, retrieved text
    assert all(p.review.strip() for p in predictions)
    assert [p.cut_short for p in predictions] == [False] * 4
    unusable = [[], ["I think it is good."], ["stars: nine\nreview: ", "still nothing"], []]
    assert [p.unusable for p in predictions] == unusable  # kept with their task, not lost
    # each prediction carries its own counts, so a run's counts are summed from its lines
    zero = {"parse_failures": 0, "cut_short": 0, "unconstrained": 0}
    answer_counts = [{k: v for k, v in p.counts.items() if not k.startswith("prompt_")} for p in predictions]
    # what each prompt showed is counted too: the user's reviews (no tokenizer here: unmeasured)
    assert all(sum(p.counts[f"prompt_user_reviews:{k}"] for k in ("0", "1", "2+")) == 1 for p in predictions)
    assert answer_counts == [
        {**zero, "llm_answers": 1},
        {**zero, "llm_answers": 1, "parse_failures": 1, "retries": 1, "retry_successes": 1},
        {
            **zero,
            "llm_answers": 1,
            "parse_failures": 1,
            "retries": 1,
            "fallbacks": 1,
            "retrieved_fallback_review": 1,
        },
        {**zero, "llm_answers": 1},
    ]
    assert "exactly two lines" in fake.calls[1][0][-1]["content"]  # the stricter instruction


def test_answers_cut_at_max_new_tokens_are_flagged_and_counted(yelp_store, yelp_tasks, monkeypatch):
    class Cut(ConstantLLM):
        def generate(self, conversations, sampling, constraint=None):
            texts = ["stars: 4\nreview: It was good but the", "stars: 2\nreview: Bad."][: len(conversations)]
            return [Answer(t, cut) for t, cut in zip(texts, [True, False], strict=False)]

    monkeypatch.setattr(agent_module, "load_llm", lambda config: Cut())
    agent = ReviewAgent(
        AgentConfig(kind="retrieval-llm", retrieval="bm25"),
        LLMConfig(),
        ReviewStore.open(yelp_store, tasks=yelp_tasks),
    )
    predictions = agent.predict(tasks_with_dates(yelp_tasks)[:2])
    assert [p.cut_short for p in predictions] == [True, False]
    assert [p.counts["cut_short"] for p in predictions] == [1, 0]


class ConstantLLM:
    def __init__(self):
        self.calls = []

    def generate(self, conversations, sampling, constraint=None):
        self.calls.append(conversations)
        # an answer whose beginning is given (the decided stars) is continued with the review alone
        return [
            Answer(" Fine." if c[-1]["role"] == "assistant" else "stars: 5\nreview: Fine.")
            for c in conversations
        ]

    def option_probs(self, conversations, options, samples=8, seed=0, prefix=""):
        """Every probability on the last option (a 5 among star digits), one call per batch."""
        self.calls.append(conversations)
        return [
            choice_answer(options, [float(o == options[-1]) for o in options], "logprobs")
            for _ in conversations
        ]


def test_tuned_agent_asks_for_validation_stars_only_on_reviews_its_adapter_did_not_train_on(
    yelp_store, yelp_tasks, monkeypatch, tmp_path
):
    fake = ConstantLLM()
    monkeypatch.setattr(agent_module, "load_llm", lambda config: fake)
    store = ReviewStore.open(yelp_store, tasks=yelp_tasks)
    validation = StarModel(store.visible_ratings()).validation
    trained = [r[0] for r in validation[::2]]  # the adapter trained on every other validation review
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "training_data.json").write_text(
        json.dumps({"train_review_ids": trained, "latest_target_ts": 0})
    )
    config = AgentConfig(kind="tuned", retrieval="bm25", blend_fraction=0.02, batch_size=4)
    agent = ReviewAgent(config, LLMConfig(adapter=str(adapter)), store)
    asked_ids = [r[0] for r in validation if r[0] not in set(trained) and in_sample(r[0], 0.02, config.seed)]
    report = agent.stars.report["llm_validation"]
    assert report == {
        "validation_reviews": len(validation),
        "not_in_adapter_training": len(validation) - len(trained),
        "asked": len(asked_ids),
        "cached_answers": 0,  # no answer_cache
    }
    assert agent.stars.report["llm_validation_stars"] == len(asked_ids)
    conversations = [c for call in fake.calls for c in call]
    assert len(conversations) == len(asked_ids)
    # the draw is by each review's own hash: a larger fraction asks every review a smaller one asked
    before = len(fake.calls)
    wider = ReviewAgent(
        AgentConfig(kind="tuned", retrieval="bm25", blend_fraction=0.04),
        LLMConfig(adapter=str(adapter)),
        store,
    )
    asked_wider = [c[-1]["content"] for call in fake.calls[before:] for c in call]
    assert len(asked_wider) == wider.stars.report["llm_validation"]["asked"] > len(asked_ids)
    assert {c[-1]["content"] for c in conversations} <= set(asked_wider)
    targets = {row["review_id"] for row in read_targets(yelp_tasks).values()}
    by_id = {r[0]: r for r in validation}
    for review_id, conversation in zip(asked_ids, conversations, strict=True):
        assert review_id not in targets  # the store blocks the task pairs: never a validation review
        # each validation review is asked like a time-aware task: never its own text, nothing newer
        _, user, item, ts, _ = by_id[review_id]
        prompt = conversation[-1]["content"]
        assert store.get_reviews(review_id=review_id)[0]["text"].strip()[:80] not in prompt
        ctx = agent.context({"task_id": 0, "user_id": user, "item_id": item, "ts": ts, "validation": True})
        assert all(to_epoch(r["date"]) < ts for r in ctx.user_reviews + ctx.item_reviews)
    # an adapter without the record of its training data cannot be blended: refused, not guessed
    (adapter / "training_data.json").unlink()
    with pytest.raises(SystemExit, match="training_data.json is missing"):
        ReviewAgent(config, LLMConfig(adapter=str(adapter)), store)
    with pytest.raises(SystemExit, match="more than blend_max 3"):
        (adapter / "training_data.json").write_text(json.dumps({"train_review_ids": []}))
        ReviewAgent(
            AgentConfig(kind="tuned", retrieval="bm25", blend_fraction=0.5, blend_max=3),
            LLMConfig(adapter=str(adapter)),
            store,
        )


# -- the runner ----------------------------------------------------------------------------------------


class ScriptedLLM:
    """Answers that depend only on the conversation (so batching and resuming change nothing): about a
    third unusable at first, fixed by the stricter retry; a quarter flagged as cut short."""

    def __init__(self, kill_at_call: int | None = None):
        self.calls, self.kill_at_call = 0, kill_at_call

    def generate(self, conversations, sampling, constraint=None):
        self.calls += 1
        if self.calls == self.kill_at_call:
            raise KeyboardInterrupt  # as if the job were killed mid-batch
        out = []
        for conversation in conversations:
            h = int(hashlib.sha256(json.dumps(conversation).encode()).hexdigest(), 16)
            if conversation[-1]["content"] == agent_module.STRICT:
                text = f"stars: {1 + h % 5}\nreview: retried {h % 997}"
            else:
                text = "no format" if h % 3 == 0 else f"stars: {1 + h % 5}\nreview: echo {h % 1009}"
            out.append(Answer(text, cut_short=h % 4 == 0))
        return out


def simulate_argv(config_text: str, tmp_path, store, tasks, out, *extra) -> list[str]:
    config = tmp_path / "agent.yaml"
    config.write_text(config_text)
    return ["--config", str(config), "--data", str(store), "--tasks", str(tasks), "--out", str(out), *extra]


def test_a_killed_run_resumes_without_duplicates(yelp_store, yelp_tasks, tmp_path):
    base = simulate_argv(
        "kind: stats\nretrieval: bm25\nbatch_size: 4\n", tmp_path, yelp_store, yelp_tasks, tmp_path / "run"
    )
    simulate.main([*base, "--limit", "8"])
    path = tmp_path / "run" / "predictions.jsonl"
    with open(path, "a") as f:  # killed in the middle of writing a line
        f.write('{"task_id": 9, "stars": 4')
    summary = simulate.main(base)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    ids = [r["task_id"] for r in rows]
    assert sorted(ids) == list(range(20)) and len(ids) == len(set(ids))
    assert summary["ran_now"] == 12 and summary["predicted"] == 20 and summary["errors"] == 0
    assert summary["invocations"] == 2 and summary["visibility"] == "time-aware"
    tasks = {t["task_id"]: t for t in read_tasks(yelp_tasks)}
    assert all(
        (r["user_id"], r["item_id"]) == (tasks[r["task_id"]]["user_id"], tasks[r["task_id"]]["item_id"])
        for r in rows
    )
    official = json.loads((tmp_path / "run" / "output.json").read_text())
    assert len(official) == 20 and all(o["output"]["review"] for o in official)


def test_a_killed_and_resumed_run_reports_the_counts_of_an_uninterrupted_one(
    yelp_store, yelp_tasks, tmp_path, monkeypatch
):
    text = "kind: retrieval-llm\nretrieval: bm25\nbatch_size: 4\n"
    llm = ScriptedLLM()
    monkeypatch.setattr(agent_module, "load_llm", lambda config: llm)
    whole = simulate.main(simulate_argv(text, tmp_path, yelp_store, yelp_tasks, tmp_path / "whole"))
    assert whole["counts"]["parse_failures"] > 0 and whole["counts"]["cut_short"] > 0
    argv = simulate_argv(text, tmp_path, yelp_store, yelp_tasks, tmp_path / "cut")
    llm = ScriptedLLM(kill_at_call=5)  # dies in the third batch (each batch: a first pass and a retry)
    with pytest.raises(KeyboardInterrupt):
        simulate.main(argv)
    assert 0 < len((tmp_path / "cut" / "predictions.jsonl").read_text().splitlines()) < 20
    llm = ScriptedLLM()
    resumed = simulate.main(argv)
    assert resumed["invocations"] == 2 and 0 < resumed["ran_now"] < 20
    for key in ("predicted", "errors", "counts", "answers_by_source", "star_models_used"):
        assert resumed[key] == whole[key], key
    # a rerun with nothing left to do loads no model and changes no count
    monkeypatch.setattr(simulate, "ReviewAgent", None)  # calling it would fail
    again = simulate.main(argv)
    assert again["ran_now"] == 0 and again["counts"] == whole["counts"]


def test_a_run_refuses_to_resume_from_other_inputs(yelp_store, yelp_tasks, tmp_path, make_tasks, monkeypatch):
    monkeypatch.setattr(agent_module, "load_llm", lambda config: ScriptedLLM())
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v1")
    text = "kind: tuned\nretrieval: bm25\nbatch_size: 8\n"
    argv = simulate_argv(text, tmp_path, yelp_store, yelp_tasks, tmp_path / "run", "--adapter", str(adapter))
    simulate.main([*argv, "--limit", "8"])
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v2")  # retrained
    with pytest.raises(SystemExit, match="changed: adapter"):
        simulate.main(argv)
    (adapter / "adapter_model.safetensors").write_bytes(b"weights v1")
    other_tasks = make_tasks(yelp_store, tmp_path / "other_tasks", n=20, seed=5)
    moved = simulate_argv(
        text, tmp_path, yelp_store, other_tasks, tmp_path / "run", "--adapter", str(adapter)
    )
    with pytest.raises(SystemExit, match="changed: tasks"):
        simulate.main(moved)
    with pytest.raises(SystemExit, match=r"changed: agent\.k_user"):
        simulate.main([*argv, "--k_user", "2"])
    assert len((tmp_path / "run" / "predictions.jsonl").read_text().splitlines()) == 8  # nothing lost
    simulate.main([*argv, "--batch_size", "3"])  # how fast it runs is not an input: resumes
    summary = simulate.main([*moved, "--overwrite", "true"])
    assert summary["ran_now"] == 20 and summary["invocations"] == 1  # the earlier work was discarded


@pytest.fixture(scope="module")
def flooded_store(raw, yelp_tasks, tmp_path_factory):
    """The Yelp sample plus, after the latest task's moment, a flood: every task's item gets 15 one-star
    reviews from new users, and every task's user writes 5 one-star reviews of new items; and at exactly
    the latest task's moment, a few more for that task (not strictly older, so not visible to it)."""
    from data_prep import build

    dump = tmp_path_factory.mktemp("flood_dump")
    for name in ("user_subset.json", "item_subset.json", "review_subset.json"):
        shutil.copy(raw / "yelp_asc_sample" / name, dump / name)
    targets = read_targets(yelp_tasks)
    last = max(t["ts"] for t in targets.values())
    later = last + 86_400
    flood = []
    for task in read_tasks(yelp_tasks):
        k = task["task_id"]
        if targets[k]["ts"] == last:  # at the very moment of the latest task (earlier tasks never see it):
            flood += [(f"tie-item-{k}-{n}", f"tier-{k}-{n}", task["item_id"], last) for n in range(3)]
            flood.append((f"tie-user-{k}", task["user_id"], f"tie-new-item-{k}", last))  # not strictly older
        for n in range(15):
            flood.append((f"flood-item-{k}-{n}", f"flooder-{k}-{n}", task["item_id"], later + 60 * n))
        for n in range(5):
            flood.append((f"flood-user-{k}-{n}", task["user_id"], f"new-item-{k}-{n}", later + 60 * n))
    with open(dump / "review_subset.json", "a") as f:
        for review_id, user, item, ts in flood:
            date = format_utc(ts)
            f.write(
                json.dumps(
                    {
                        "review_id": review_id,
                        "user_id": user,
                        "item_id": item,
                        "stars": 1.0,
                        "text": f"Terrible, never again. {review_id}",
                        "date": date,
                    }
                )
                + "\n"
            )
    out = tmp_path_factory.mktemp("flood_store")
    build.main(["--source", "asc", "--platform", "yelp", "--input", str(dump), "--out", str(out)])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_flood_of_later_one_star_reviews_changes_no_prediction(
    kind, yelp_store, flooded_store, yelp_tasks, tmp_path, monkeypatch
):
    monkeypatch.setattr(agent_module, "load_llm", lambda config: ScriptedLLM())
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "training_data.json").write_text(json.dumps({"train_review_ids": [], "latest_target_ts": 0}))
    writes = kind == "tuned-write"  # its utility embeds: the embedding retrieval
    config = AgentConfig(
        kind=kind,
        retrieval="embedding" if writes else "bm25",
        blend_fraction=0.03 if kind in ("tuned", "tuned-write") else 0.0,
        samples=2 if writes else 0,
    )
    encoder = packaged_minilm("cpu", 32) if writes else None
    tasks = tasks_with_dates(yelp_tasks)
    runs = {}
    for name, data in (("plain", yelp_store), ("flooded", flooded_store)):
        for visibility in ("time-aware", "official"):
            config.visibility = visibility
            store = ReviewStore.open(data, tasks=yelp_tasks)
            agent = ReviewAgent(config, LLMConfig(adapter=str(adapter)), store, encoder=encoder)
            runs[name, visibility] = [(p.stars, p.review, p.star_model) for p in agent.predict(tasks)]
    assert runs["plain", "time-aware"] == runs["flooded", "time-aware"]
    # the same check has teeth: with the official visibility the flood is seen
    assert runs["plain", "official"] != runs["flooded", "official"]


@pytest.mark.parametrize("kind", ["previous-review", "user-mean"])
def test_a_flood_of_later_one_star_reviews_changes_no_baseline(kind, yelp_store, flooded_store, yelp_tasks):
    assert baselines.from_history(yelp_store, yelp_tasks, kind) == baselines.from_history(
        flooded_store, yelp_tasks, kind
    )
    assert baselines.from_history(yelp_store, yelp_tasks, kind, "official") != baselines.from_history(
        flooded_store, yelp_tasks, kind, "official"
    )


def test_shards_cover_every_task_once_and_merge(yelp_store, yelp_tasks, tmp_path):
    config = tmp_path / "stats.yaml"
    config.write_text("kind: stats\nretrieval: bm25\n")
    common = ["--config", str(config), "--data", str(yelp_store), "--tasks", str(yelp_tasks)]
    shards = [str(tmp_path / f"shard_{i}") for i in range(3)]
    for i, shard in enumerate(shards):
        simulate.main([*common, "--out", shard, "--shard", f"{i}/3"])
    summary = simulate.main(["--out", str(tmp_path / "all"), "--tasks", str(yelp_tasks), "--merge", *shards])
    rows = [json.loads(line) for line in (tmp_path / "all" / "predictions.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in rows] == list(range(20)) and summary["missing"] == []
    assert len(json.loads((tmp_path / "all" / "output.json").read_text())) == 20
    with pytest.raises(SystemExit, match=r"missing shards \[2\]"):  # only a whole run merges
        simulate.main(["--out", str(tmp_path / "some"), "--tasks", str(yelp_tasks), "--merge", *shards[:2]])
    assert not (tmp_path / "some" / "predictions.jsonl").exists()
    (Path(shards[1]) / "summary.json").rename(tmp_path / "kept.json")  # shard 1 stopped before it finished
    with pytest.raises(SystemExit, match="unfinished .*shard_1"):
        simulate.main(["--out", str(tmp_path / "some"), "--tasks", str(yelp_tasks), "--merge", *shards])
    (tmp_path / "kept.json").rename(Path(shards[1]) / "summary.json")
    from agents.runs import Lock

    with Lock(Path(shards[2])), pytest.raises(SystemExit, match="shard_2 is held by another process"):
        simulate.main(
            ["--out", str(tmp_path / "some"), "--tasks", str(yelp_tasks), "--merge", *shards]
        )  # still running
    with pytest.raises(SystemExit, match="two shards"):
        simulate.main(["--out", str(tmp_path / "twice"), "--merge", *shards, shards[0]])
    assert summary["visibility"] == "time-aware" and summary["predicted"] == 20
    simulate.main([*common, "--out", str(tmp_path / "other"), "--shard", "0/3", "--k_user", "1"])
    with pytest.raises(SystemExit, match=r"other inputs .*agent\.k_user"):
        simulate.main(["--out", str(tmp_path / "mixed"), "--merge", str(tmp_path / "other"), *shards[1:]])


def test_a_second_review_run_into_the_same_folder_is_refused(yelp_store, yelp_tasks, tmp_path):
    from agents.runs import Lock

    config = tmp_path / "stats.yaml"
    config.write_text("kind: stats\nretrieval: bm25\n")
    argv = [
        "--config",
        str(config),
        "--data",
        str(yelp_store),
        "--tasks",
        str(yelp_tasks),
        "--out",
        str(tmp_path / "run"),
    ]
    (tmp_path / "run").mkdir()
    with Lock(tmp_path / "run"), pytest.raises(SystemExit, match="held by another process"):
        simulate.main(argv)  # another run holds the folder: nothing appended
    assert not (tmp_path / "run" / "predictions.jsonl").exists()
    assert simulate.main(argv)["predicted"] == 20  # once it is free


def test_simulate_slurm_dry_run_prints_shard_and_merge():
    import subprocess

    script = ["bash", "slurm/simulate.sbatch", "--dry-run", "configs/review/tuned_qwen7b_vllm.yaml", "d", "t"]
    result = subprocess.run(script, capture_output=True, text=True, cwd=Path(__file__).parents[1], check=True)
    shard, merge = [line for line in result.stdout.splitlines() if not line.startswith("note:")]
    assert shard.startswith("shard 0/8: .venv-vllm/bin/python")  # a vllm config runs in the vLLM environment
    assert "agents.review run --config configs/review/tuned_qwen7b_vllm.yaml --data d --tasks t" in shard
    assert "--shard 0/8" in shard and "--out runs/sim/tuned_qwen7b_vllm/shard_0" in shard
    assert "--tasks t --merge runs/sim/tuned_qwen7b_vllm/shard_" in merge


def test_simulate_slurm_refuses_a_vllm_config_without_vllm_before_any_task_starts(tmp_path):
    import subprocess

    repo = Path(__file__).parents[1]
    array = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2"}
    env = {**{k: v for k, v in os.environ.items() if k != "VENV"}, **array, "RUN_DIR": str(tmp_path / "run")}
    vllm = ["bash", "slurm/simulate.sbatch", "configs/review/tuned_qwen7b_vllm.yaml", "d", "t"]
    for extra in ({}, {"VENV": str(Path(sys.executable).parents[1])}):  # the default, and an explicit .venv
        result = subprocess.run(vllm, cwd=repo, env={**env, **extra}, capture_output=True, text=True)
        assert result.returncode == 2, result.stderr
        assert "has no vLLM: build it with make vllm-env and submit with VENV=.venv-vllm" in result.stderr
    hf_as_vllm = ["bash", "slurm/simulate.sbatch", "configs/review/tuned.yaml", "d", "t", "--backend", "vllm"]
    result = subprocess.run(hf_as_vllm, cwd=repo, env=env, capture_output=True, text=True)
    assert result.returncode == 2 and "uses the vllm backend" in result.stderr  # the flag counts too
    assert not (tmp_path / "run").exists()  # refused before any shard folder or marker was made


@pytest.mark.slow
def test_simulate_slurm_array_merges_a_whole_run_and_a_resubmitted_shard_completes_it(
    yelp_store, yelp_tasks, tmp_path
):
    """The script as a job array would run it (no Slurm needed: it reads the array variables): a shard
    outside SHARDS is refused; shards merge only when all SHARDS have finished; a shard resubmitted alone
    (a new array job of one task) runs its own shard of SHARDS and completes the run."""
    import subprocess

    repo = Path(__file__).parents[1]
    config = tmp_path / "stats.yaml"
    config.write_text("kind: stats\nretrieval: bm25\n")
    run_dir = tmp_path / "run"

    def shard(array_job: int, index: int, count: int, check=True) -> subprocess.CompletedProcess:
        env = {
            **os.environ,
            "RUN_DIR": str(run_dir),
            "VENV": str(Path(sys.executable).parents[1]),
            "SHARDS": "3",
            "SLURM_ARRAY_JOB_ID": str(array_job),
            "SLURM_ARRAY_TASK_ID": str(index),
            "SLURM_ARRAY_TASK_COUNT": str(count),
        }
        command = ["bash", "slurm/simulate.sbatch", str(config), str(yelp_store), str(yelp_tasks)]
        return subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, check=check)

    outside = shard(100, 3, 4, check=False)
    assert outside.returncode == 2 and "outside the run's 3 shards" in outside.stderr
    assert "not merging yet: shards 1 2 of 3" in shard(100, 0, 3).stdout
    assert "not merging yet: shards 2 of 3" in shard(100, 1, 3).stdout  # shard 2 failed; nothing merged
    assert not (run_dir / "predictions.jsonl").exists()
    again = shard(101, 2, 1).stdout  # resubmitted alone: still shard 2 of 3, and the run is whole
    assert "merged 20 predictions from 3 shards" in again
    assert json.loads((run_dir / "shard_2" / "fingerprint.json").read_text())["inputs"]["shard"] == "2/3"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["shards"] == 3 and summary["predicted"] == 20 and summary["missing"] == []


def test_slurm_log_folders_are_part_of_the_checkout():
    """Slurm opens --output/--error before the job's first line runs: their folder must already exist."""
    import re
    import subprocess

    repo = Path(__file__).parents[1]
    tracked = subprocess.run(["git", "ls-files", "slurm"], cwd=repo, capture_output=True, text=True).stdout
    for script in sorted((repo / "slurm").glob("*.sbatch")):
        for path in re.findall(r"^#SBATCH --(?:output|error)=(\S+)", script.read_text(), flags=re.MULTILINE):
            folder = str(Path(path).parent)
            assert (repo / folder).is_dir() and f"{folder}/.gitignore" in tracked, (script.name, path)


def test_hf_backend_batched_generation_equals_one_at_a_time(tiny_model, monkeypatch):
    from agents.llm import HFBackend

    conversations = [
        [{"role": "user", "content": text}] for text in ("hi", "a much longer question about tacos", "ok?")
    ]
    batched = HFBackend(LLMConfig(model=str(tiny_model), generation_batch_size=3, device="cpu"))
    single = HFBackend(LLMConfig(model=str(tiny_model), generation_batch_size=1, device="cpu"))
    sampling = Sampling(max_new_tokens=8)
    together = batched.generate(conversations, sampling)
    assert together == single.generate(conversations, sampling)  # left padding changes nothing
    assert all(texts(together)) and len(together) == 3
    # a random model does not end its answer within 8 tokens: every answer is flagged as cut short
    assert [a.cut_short for a in together] == [True, True, True]
    prompt_tokens = [len(single.encode([c])["input_ids"][0]) for c in conversations]
    # padding is not counted
    assert [(a.prompt_tokens, a.answer_tokens) for a in together] == [(n, 8) for n in prompt_tokens]
    assert prompt_tokens[1] > prompt_tokens[0]
    real = batched.model.generate

    def first_row_ends(**kwargs):  # the first answer ends at once (EOS), the others run to the cap
        out = real(**kwargs)
        out[0, kwargs["input_ids"].shape[1] :] = batched.tokenizer.eos_token_id  # EOS, then padding
        return out

    monkeypatch.setattr(batched.model, "generate", first_row_ends)
    ended = batched.generate(conversations, sampling)
    assert ended[0].text == "" and [a.cut_short for a in ended] == [False, True, True]
    assert [a.answer_tokens for a in ended] == [1, 8, 8]  # the end token counts, the padding not


def test_the_answer_cache_gives_a_second_run_the_first_runs_greedy_answers(tiny_model, tmp_path):
    """Greedy answers come back from the cache (same texts, cut flags and usage) without generating;
    a new conversation, other settings, sampling, the adapter off or a changed model file ask again."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)  # copy2 keeps the files' times: the same model
    cache = tmp_path / "answers.sqlite"

    def backend():
        llm = load_llm(LLMConfig(model=str(model), device="cpu", answer_cache=str(cache)))
        real, llm.rows = llm.backend.model.generate, []

        def counted(**kwargs):
            llm.rows.append(kwargs["input_ids"].shape[0])
            return real(**kwargs)

        llm.backend.model.generate = counted
        return llm

    conversations = [[{"role": "user", "content": t}] for t in ("hi", "a question about tacos", "ok?")]
    greedy = Sampling(max_new_tokens=8)
    first = backend()
    made = first.generate(conversations, greedy)
    said = texts(made)
    assert [a.cached for a in made] == [False] * 3 and first.rows == [3] and all(said)
    second = backend()  # another run: a new backend on the same file
    kept = second.generate(conversations, greedy)
    assert texts(kept) == said and second.rows == [] and [a.cached for a in kept] == [True] * 3
    assert [replace(a, cached=False) for a in kept] == made  # cut flags and usage kept too
    more = [*conversations[:2], [{"role": "user", "content": "something new"}], conversations[2]]
    mixed = second.generate(more, greedy)
    assert texts(mixed)[:2] == said[:2] and second.rows == [1]  # only the new one
    assert [a.cached for a in mixed] == [True, True, False, True]
    second.generate(conversations, Sampling(max_new_tokens=9))  # another setting: asked again
    second.generate(conversations, Sampling(max_new_tokens=8, temperature=0.8))  # sampled: never kept
    sampled = second.generate(conversations, Sampling(max_new_tokens=8, temperature=0.8))
    assert second.rows == [1, 3, 3, 3] and [a.cached for a in sampled] == [False] * 3
    with second.adapter_off():  # the base model alone is another model (a no-op here: no adapter)
        second.generate(conversations, greedy)
    assert second.rows[-1] == 3 and (second.hits, second.misses) == (6, 7)
    answer = Constraint.answer(12)  # a constrained answer is another answer
    assert texts(second.generate(conversations, greedy, constraint=answer)) != said and second.rows[-1] == 3
    twice = [conversations[0], [{"role": "user", "content": "twice"}], [{"role": "user", "content": "twice"}]]
    first = second.generate(twice, greedy)
    assert second.rows[-1] == 1 and first[1].text == first[2].text  # one prompt twice in a call: asked once
    assert [a.cached for a in first] == [True, False, False]
    again = second.generate(twice, greedy)
    assert texts(again) == texts(first) and [a.cached for a in again] == [True] * 3  # then kept
    assert second.generate([], greedy) == []
    # another seed or top_p changes no greedy answer: the same key
    other = second.generate(conversations, Sampling(max_new_tokens=8, seed=5, top_p=0.5))
    assert texts(other) == said and [a.cached for a in other] == [True] * 3
    with ThreadPoolExecutor(2) as pool:  # from other threads (the sandbox's web page, plug-in agents)
        assert list(pool.map(lambda c: second.generate([c], greedy)[0].text, conversations)) == said
    (model / "config.json").write_text((model / "config.json").read_text())  # the model files changed
    third = backend()
    assert texts(third.generate(conversations, greedy)) == said and third.rows == [3]


def test_the_answer_cache_keeps_a_backends_missing_parts_missing(monkeypatch, tmp_path):
    """Wrapped, a backend without adapter_off (openai) still has none, so callers that look for it
    (the sandbox) take the same path; the key holds no API key; cached answers cost no tokens."""
    from collections import Counter

    from agents.llm import count_usage

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    llm = load_llm(LLMConfig(backend="openai", model="served", base_url="http://127.0.0.1:9/v1",
                             answer_cache=str(tmp_path / "a.sqlite")))  # fmt: skip
    assert getattr(llm, "adapter_off", None) is None and not hasattr(llm, "adapter_off")
    assert "sk-test-secret" not in json.dumps(llm.identity)

    def served(conversations, sampling, constraint=None):
        return [Answer("stars: 4\nreview: ok", False, 10, 3)] * len(conversations)

    monkeypatch.setattr(llm.backend, "generate", served)
    counts = Counter()
    for _ in range(2):
        count_usage(llm.generate([[{"role": "user", "content": "hi"}]], Sampling(max_new_tokens=8)), counts)
    assert counts == Counter(prompt_tokens=10, answer_tokens=3, cached_answers=1)


def test_a_second_agent_on_the_same_answer_cache_predicts_the_same_and_counts_it(
    tiny_model, yelp_store, yelp_tasks, tmp_path
):
    from agents.retrieval import hashed_bag_of_words

    store = ReviewStore.open(yelp_store, tasks=yelp_tasks)
    targets = read_targets(yelp_tasks)
    tasks = [{**t, "ts": targets[t["task_id"]]["ts"]} for t in read_tasks(yelp_tasks)][:4]
    llm = LLMConfig(model=str(tiny_model), device="cpu", answer_cache=str(tmp_path / "answers.sqlite"))
    config = AgentConfig(kind="retrieval-llm", max_new_tokens=8, prompt_tokens=200)

    def predict():
        agent = ReviewAgent(config, llm, store, encoder=lambda t: hashed_bag_of_words(t, 64))
        return agent.predict(tasks)

    first, second = predict(), predict()
    assert [(p.stars, p.review, p.source, p.unusable) for p in first] == [
        (p.stars, p.review, p.source, p.unusable) for p in second
    ]
    assert sum(p.counts["retries"] for p in first) > 0  # a random model's answers: retried, also cached
    assert all(p.counts["cached_answers"] == p.counts["cached_retries"] == 0 for p in first)
    assert all(p.counts["cached_answers"] == p.counts["llm_answers"] for p in second)
    assert all(p.counts["cached_retries"] == p.counts["retries"] for p in second)


@pytest.mark.slow
def test_hf_backend_constrained_answers_follow_the_format_even_from_a_random_model(tiny_model):
    """A random 2-layer model writes noise; under a constraint every answer still has the required
    shape and closes (the review bound forces the end), batched or not."""
    import re

    from agents.llm import HFBackend

    conversations = [[{"role": "user", "content": t}] for t in ("hi", "a longer question about tacos", "ok")]
    batched = HFBackend(LLMConfig(model=str(tiny_model), generation_batch_size=3, device="cpu"))
    single = HFBackend(LLMConfig(model=str(tiny_model), generation_batch_size=1, device="cpu"))
    sampling = Sampling(max_new_tokens=60)
    answer = Constraint.answer(12)
    free = batched.generate(conversations, sampling)
    assert not any(re.fullmatch(r"stars: [1-5]\nreview: [^\n]{1,12}", a.text) for a in free)
    assert not any(a.constrained for a in free)
    together = batched.generate(conversations, sampling, constraint=answer)
    assert together == single.generate(conversations, sampling, constraint=answer)
    assert all(re.fullmatch(r"stars: [1-5]\nreview: [^\n]{1,12}", a) for a in texts(together)), together
    # closed by the grammar, not cut by the cap
    assert [(a.cut_short, a.constrained) for a in together] == [(False, True)] * 3
    picked = batched.generate(
        conversations, sampling, constraint=Constraint.choice(["watch", "skip", "chat"])
    )
    assert set(texts(picked)) <= {"watch", "skip", "chat"} and not any(a.cut_short for a in picked)
    schema = {
        "type": "object",
        "properties": {"act": {"type": "string", "enum": ["post", "idle"]}, "n": {"type": "integer"}},
        "required": ["act", "n"],
        "additionalProperties": False,
    }
    for answer in batched.generate(
        conversations, Sampling(max_new_tokens=40), constraint=Constraint.json(schema)
    ):
        value = json.loads(answer.text)
        assert value["act"] in ("post", "idle") and isinstance(value["n"], int)


@pytest.mark.slow
def test_suite_scores_the_stats_agent_against_the_baselines(yelp_store, yelp_tasks, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    table, agents, claims = suite.run_suite(
        yelp_store, yelp_tasks, tmp_path, adapter=None, kinds=("stats",), wandb="offline"
    )
    lines = table.splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:]] == [*baselines.KINDS, "stats"]
    assert "| stats | 20/20 |" in agents
    assert "| stats > user-mean | preference_estimation |" in claims
    for name in ("compare.md", "compare.png", "agents.md", "claims.md"):
        assert (tmp_path / name).stat().st_size > 0
    assert (
        "| stars W1 |" in table and "| copied 8 words |" in table
    )  # the fidelity columns, with the store given
    # one W&B run per evaluation (3 baselines, stats) and one for the suite's tables
    assert len(list(tmp_path.rglob("offline-run-*"))) == 5
    with pytest.raises(SystemExit, match="--adapter"):
        suite.run_suite(yelp_store, yelp_tasks, tmp_path / "t", adapter=None, kinds=("tuned",))


def test_suite_passes_set_values_to_the_llm_agents_and_rejects_malformed_ones(monkeypatch):
    seen = []
    monkeypatch.setattr(suite, "run_suite", lambda *args: seen.append(args[5]))
    base = ["--data", "d", "--tasks", "t", "--out", "o"]
    suite.main([*base, "--set", "k_user=4", "max_new_tokens=128"])
    assert seen[0] == [*suite.generation_args(), "--set", "k_user=4", "max_new_tokens=128"]
    agent, *_ = parse_flat([*seen[0], "--out", "x"], simulate.CONFIG_CLASSES, prog="test")
    assert (agent.k_user, agent.max_new_tokens) == (4, 128)  # over the suite's own --max_new_tokens 96
    with pytest.raises(SystemExit):
        suite.main([*base, "--set", "k_user"])
    with pytest.raises(SystemExit):  # refused before any agent runs
        suite.main([*base, "--set", "k_usr=4"])
    assert len(seen) == 1


def test_vllm_backend_passes_the_adapter_as_a_lora_request(tmp_path, monkeypatch):
    """vLLM needs a GPU, so a stand-in module records what the backend asks of it: engine arguments
    (max_lora_rank rounded up to a value vLLM accepts), the LoRA request, the sampling parameters."""
    import sys
    import types

    seen = {}

    class LLM:
        def __init__(self, **kwargs):
            seen["engine"] = kwargs

        def get_tokenizer(self):
            return "the engine's tokenizer"

        def chat(
            self,
            conversations,
            params,
            lora_request=None,
            use_tqdm=True,
            add_generation_prompt=True,
            continue_final_message=False,
        ):
            seen.update(params=params, lora=lora_request)

            def reply(c):  # an answer ending in "..." stands for one cut at max_tokens
                reason = "length" if c[-1]["content"].endswith("...") else "stop"
                text = c[-1]["content"]  # vLLM's RequestOutput and CompletionOutput carry their token ids
                return types.SimpleNamespace(
                    prompt_token_ids=[0] * (len(text) + 10),
                    outputs=[
                        types.SimpleNamespace(text=text, finish_reason=reason, token_ids=[0] * len(text))
                    ],
                )

            return [reply(c) for c in conversations]

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, lambda **kw: kw
    lora = types.ModuleType("vllm.lora.request")
    lora.LoRARequest = lambda name, index, path: (name, index, path)
    sampling_params = types.ModuleType("vllm.sampling_params")
    sampling_params.StructuredOutputsParams = lambda **kw: ("structured", kw)
    for name, module in {
        "vllm": vllm,
        "vllm.lora": types.ModuleType("vllm.lora"),
        "vllm.lora.request": lora,
        "vllm.sampling_params": sampling_params,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 12}')
    backend = load_llm(
        LLMConfig(
            backend="vllm",
            model="org/model",
            adapter=str(adapter),
            tensor_parallel_size=2,
            max_model_len=4096,
        )
    )
    assert backend.tokenizer == "the engine's tokenizer"  # prompts are fitted with it, as in training
    assert seen["engine"]["tensor_parallel_size"] == 2 and seen["engine"]["max_model_len"] == 4096
    out = backend.generate(
        [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b..."}]], Sampling(7, 0.0, seed=3)
    )
    assert out == [Answer("a", False, 11, 1), Answer("b...", True, 14, 4)]  # tokens per answer
    assert seen["engine"]["enable_lora"] and seen["engine"]["max_lora_rank"] == 16
    assert seen["lora"] == ("adapter", 1, str(adapter))
    assert seen["params"] == [  # one seed per request: identical prompts would sample independently
        {"max_tokens": 7, "temperature": 0.0, "top_p": 1.0, "repetition_penalty": 1.0, "seed": 3},
        {"max_tokens": 7, "temperature": 0.0, "top_p": 1.0, "repetition_penalty": 1.0, "seed": 4},
    ]
    conversation = [[{"role": "user", "content": "a"}]]
    backend.generate(conversation, Sampling(), constraint=Constraint.answer(30))
    assert seen["params"][0]["structured_outputs"] == (
        "structured",
        {"regex": "stars: [1-5]\\nreview: [^\\n]{1,30}"},
    )
    backend.generate(conversation, Sampling(), constraint=Constraint.choice(["a", "b"]))
    assert seen["params"][0]["structured_outputs"] == ("structured", {"choice": ["a", "b"]})
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "integer"}}}
    backend.generate(conversation, Sampling(), constraint=Constraint.json(schema))
    assert seen["params"][0]["structured_outputs"] == ("structured", {"json": schema})
    asked = seen["params"][0]["structured_outputs"][1]["json"]
    assert list(asked["properties"]) == ["b", "a"]  # in the order written, not sorted
    with pytest.raises(ValueError, match="no_repeat_ngram_size"):  # refused, never silently dropped
        backend.generate(conversation, Sampling(no_repeat_ngram_size=3))
    with pytest.raises(ValueError, match="above vLLM"):
        vllm_lora_rank(1024)


def test_every_shipped_agent_config_parses():
    configs = sorted((Path(__file__).parents[1] / "configs" / "review").glob("*.yaml"))
    assert {p.stem for p in configs} >= {"stats", "asc-baseline", "retrieval-llm", "tuned"}
    for path in configs:
        agent, llm, _ = parse_flat(
            ["--config", str(path), "--out", "x"], simulate.CONFIG_CLASSES, prog="test"
        )
        assert agent.kind in KINDS and agent.kind == yaml.safe_load(path.read_text())["kind"]
        assert llm.backend in ("hf", "vllm", "openai")
        if agent.kind in ("tuned", "tuned-write") and llm.backend == "hf":  # the demo adapter's budget
            assert llm.adapter and (agent.prompt_tokens, agent.k_user, agent.k_item) == (256, 2, 1), path


def test_adapter_postdating_counts_only_this_stores_training_reviews(yelp_store, tmp_path):
    """An adapter trained on two stores: the tasks it postdates are judged by this store's training
    reviews, not by the other store's later ones; trained on none of them, it postdates no task."""
    store = ReviewStore.open(yelp_store)
    ratings = sorted(store.visible_ratings(), key=lambda r: r[3])  # (review_id, user, item, ts, stars)
    half = ratings[: len(ratings) // 2]
    latest = max(r[3] for r in half)
    far_later = ratings[-1][3] + 10**8  # the other store's newest training review
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    record = {
        "train_review_ids": [r[0] for r in half] + ["other-store-review"],
        "latest_target_ts": far_later,
    }
    (adapter / "training_data.json").write_text(json.dumps(record))
    tasks = [{"ts": latest - 1}, {"ts": latest}, {"ts": latest + 1}, {"ts": far_later}]
    assert simulate.adapter_postdates(str(adapter), tasks, store) == {
        "latest_training_review": format_utc(latest),
        "tasks_at_or_before_it": 2,
        "tasks": 4,
    }
    record["train_review_ids"] = ["other-store-review"]
    (adapter / "training_data.json").write_text(json.dumps(record))
    assert simulate.adapter_postdates(str(adapter), tasks, store)["tasks_at_or_before_it"] == 0
    (adapter / "training_data.json").write_text(json.dumps({"latest_target_ts": latest}))  # no ids: all
    assert simulate.adapter_postdates(str(adapter), tasks, store)["tasks_at_or_before_it"] == 2
    (adapter / "training_data.json").write_text(json.dumps({}))  # nothing known: nothing claimed
    assert simulate.adapter_postdates(str(adapter), tasks, store) is None


def test_an_adapter_on_another_architecture_is_refused_naming_its_base(tiny_model, tmp_path, caplog):
    """A real LoRA adapter of a wider tiny Llama: loading it on tiny_model fails with the base to use;
    the name alone only warns (a local snapshot of the same model is named differently and fits)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from agents.llm import HFBackend, warn_other_base

    wider = LlamaConfig.from_pretrained(tiny_model)
    wider.hidden_size, wider.intermediate_size = 2 * wider.hidden_size, 2 * wider.intermediate_size
    adapter = tmp_path / "adapter"
    get_peft_model(LlamaForCausalLM(wider), LoraConfig(r=4, target_modules=["q_proj"])).save_pretrained(
        adapter
    )
    (adapter / "training_card.json").write_text(json.dumps({"base_model": "wide-llama"}))
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(adapter)  # as train.sft saves it
    with pytest.raises(SystemExit, match="does not fit .*trained on wide-llama.*--set model=wide-llama"):
        HFBackend(LLMConfig(model=str(tiny_model), adapter=str(adapter), device="cpu"))
    ours = lambda: [r.getMessage() for r in caplog.records if r.name == "agents.llm"]  # noqa: E731
    with caplog.at_level("WARNING", logger="agents.llm"):
        caplog.clear()
        warn_other_base("wide-llama", "/somewhere/wide-llama", str(adapter))  # the name it was trained with
        assert ours() == []
        warn_other_base("other", "/somewhere/other", str(adapter))
    assert ours() == [f"the adapter {adapter} was trained on wide-llama; loading it on other"]


def test_claims_carry_a_holm_corrected_one_sided_p(monkeypatch):
    """Five claims apply: two with every task better (bootstrap p 1/2001 each), three with no difference
    (p 1). Holm over five: 5/2001 and 4/2001 for the two, the second raised to the first, and 1."""
    n = 40
    base = {
        "star": np.full(n, 0.2),
        "sentiment": np.full(n, 0.2),
        "emotion": np.full(n, 0.2),
        "topic": np.full(n, 0.3),
    }
    better = {**base, "topic": np.linspace(0.1, 0.2, n)}  # every task's review scores higher
    terms = {"stats": base, "user-mean": base, "stats-mbr": better, "nearest-centroid": base}
    monkeypatch.setattr(suite, "per_task_terms", lambda folder: terms[folder.name])
    rows = suite.table_rows(suite.claims_table(Path("eval"), list(terms)))
    p = {(r["claim"], r["metric"]): float(r["Holm p (one-sided)"]) for r in rows}
    assert p[("stats-mbr > stats", "review_generation")] == p[("stats-mbr > nearest-centroid", "overall")]
    assert p[("stats-mbr > stats", "review_generation")] == pytest.approx(round(5 / 2001, 3))
    assert p[("stats > user-mean", "preference_estimation")] == 1.0  # the same stars: no evidence


def test_expected_llm_stars_read_after_the_answers_beginning_and_calibrated_on_older_validation(
    yelp_store, yelp_tasks, monkeypatch
):
    """llm_stars: expected asks each prompt's probabilities of 1-5 after "stars: " and maps the expected
    value through the star model's time-aware isotonic fit on validation reviews; without validation
    reviews to calibrate on it is refused."""

    class Probable(ConstantLLM):
        def __init__(self):
            super().__init__()
            self.prefixes = []

        def option_probs(self, conversations, options, samples=8, seed=0, prefix=""):
            self.prefixes.append(prefix)
            probs = {o: 0.0 for o in options} | {"4": 0.8, "5": 0.2}
            return [Answer("4", probs=probs, expected=4.2, probs_from="logprobs") for _ in conversations]

    fake = Probable()
    monkeypatch.setattr(agent_module, "load_llm", lambda config: fake)
    store = ReviewStore.open(yelp_store, tasks=yelp_tasks)
    with pytest.raises(ValueError, match="blend_fraction > 0"):
        ReviewAgent(
            AgentConfig(kind="retrieval-llm", retrieval="bm25", llm_stars="expected"), LLMConfig(), store
        )
    config = AgentConfig(kind="retrieval-llm", retrieval="bm25", llm_stars="expected", blend_fraction=0.1)
    agent = ReviewAgent(config, LLMConfig(), store)
    report = agent.stars.report["llm_calibration"]
    assert report["validation_reviews_calibrated"] > 0 and set(fake.prefixes) == {"stars: "}
    tasks = tasks_with_dates(yelp_tasks)[:6]
    predictions = agent.predict(tasks)
    assert all(p.counts["expected_stars"] == 1 for p in predictions)
    mapped = agent.stars.calibrated([4.2] * len(tasks), [t["ts"] for t in tasks])
    for p, value in zip(predictions, mapped, strict=True):
        if value is None:  # too few older validation reviews: the calibrated star model, counted
            assert p.counts["expected_stars_not_calibrated"] == 1 and p.star_model is not None
        else:  # the LLM's own stars, calibrated (a constant LLM maps to the validation mean)
            assert p.stars == pytest.approx(value) and p.star_model is None


def test_the_tuned_agent_gives_the_star_model_expected_stars_raw_so_they_are_calibrated_once(
    yelp_store, yelp_tasks, monkeypatch, tmp_path
):
    class Probable(ConstantLLM):
        def option_probs(self, conversations, options, samples=8, seed=0, prefix=""):
            return [Answer("4", probs={"4": 1.0}, expected=3.7, probs_from="logprobs") for _ in conversations]

    monkeypatch.setattr(agent_module, "load_llm", lambda config: Probable())
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "training_data.json").write_text(json.dumps({"train_review_ids": []}))
    store = ReviewStore.open(yelp_store, tasks=yelp_tasks)
    config = AgentConfig(kind="tuned", retrieval="bm25", llm_stars="expected", blend_fraction=0.1)
    agent = ReviewAgent(config, LLMConfig(adapter=str(adapter)), store)
    given = []
    real = agent.stars.predict
    monkeypatch.setattr(
        agent.stars,
        "predict",
        lambda *a, llm_stars=None: given.append(llm_stars) or real(*a, llm_stars=llm_stars),
    )
    agent.predict(tasks_with_dates(yelp_tasks)[:3])
    # the LLM's stars are read only where a blend would use them; here validation chose none
    assert given == [[None, None, None]]
    monkeypatch.setattr(agent.stars, "blend_options", lambda items, times: ["blend"] * len(items))
    agent.predict(tasks_with_dates(yelp_tasks)[:3])
    assert given[-1] == [3.7, 3.7, 3.7]  # raw: StarModel.predict maps them, as on validation
    agent.stars.calibration = None  # expected stars with no calibration are never used as they are
    assert agent.stars.calibrated([3.7], [0]) == [None]


FAKE_VLLM = r'''#!PYTHON
"""A stand-in for `vllm serve`: records its arguments and environment, then answers chat requests on
the port it was given, recording each body (the adapter's two-line answer when asked by regex)."""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

log = Path(__file__).with_name("calls")
args = sys.argv[1:]
import os
log.joinpath("argv.json").write_text(json.dumps({"argv": args, "key": os.environ.get("VLLM_API_KEY")}))
port = int(args[args.index("--port") + 1])


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        body["authorization"] = self.headers.get("Authorization")
        log.joinpath("request.json").write_text(json.dumps(body))
        ok = "structured_outputs" in body and "response_format" not in body
        text = "stars: 4\nreview: served" if ok else json.dumps({"stars": 1, "review": "forced into JSON"})
        reply = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


ThreadingHTTPServer((args[args.index("--host") + 1], port), Handler).serve_forever()
'''


def test_the_adapter_served_by_vllm_serve_gets_the_lora_arguments_and_the_answer_format_as_a_regex(tmp_path):
    """agents.vllm_serve against a stand-in `vllm` on the PATH: the LoRA flags vLLM does not default to,
    localhost, the token in the environment only; then the openai backend with decoding_fields: vllm
    sends the two-line format as a regular expression, not as a JSON schema."""
    import socket
    import subprocess

    bin_dir, calls = tmp_path / "bin", tmp_path / "bin" / "calls"
    calls.mkdir(parents=True)
    fake = bin_dir / "vllm"
    fake.write_text(FAKE_VLLM.replace("PYTHON", sys.executable))
    fake.chmod(0o755)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "r": 32})
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "USERSIM_VLLM_KEY": "sk-served"}
    command = [
        sys.executable,
        "-m",
        "agents.vllm_serve",
        "--adapter",
        str(adapter),
        "--name",
        "mine",
        "--port",
        str(port),
    ]
    refused = subprocess.run(command, cwd=Path(__file__).parents[1], env={**env, "USERSIM_VLLM_KEY": ""},
                             capture_output=True, text=True)  # fmt: skip
    assert refused.returncode != 0 and "USERSIM_VLLM_KEY" in refused.stderr  # no token, no server
    server = subprocess.Popen(
        command, cwd=Path(__file__).parents[1], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        launched = json.loads((calls / "argv.json").read_text())
        argv = launched["argv"]
        assert argv[:2] == ["serve", "Qwen/Qwen2.5-7B-Instruct"] and launched["key"] == "sk-served"
        assert argv[argv.index("--host") + 1] == "127.0.0.1" and "--enable-lora" in argv
        assert argv[argv.index("--max-lora-rank") + 1] == "32"  # vLLM's default 16 would refuse rank 32
        assert argv[argv.index("--lora-modules") + 1] == f"mine={adapter.resolve()}"
        assert "sk-served" not in " ".join(argv)  # the token is never on the command line
        config = LLMConfig(backend="openai", model="mine", base_url=f"http://127.0.0.1:{port}/v1",
                           api_key_env="USERSIM_VLLM_KEY", decoding_fields="vllm", max_retries=0)  # fmt: skip
        os.environ["USERSIM_VLLM_KEY"] = "sk-served"
        try:
            (answer,) = OpenAIBackend(config).generate(
                [[{"role": "user", "content": "x"}]], Sampling(16), Constraint.answer(50)
            )
        finally:
            del os.environ["USERSIM_VLLM_KEY"]
        body = json.loads((calls / "request.json").read_text())
        assert (
            body["structured_outputs"] == {"regex": Constraint.answer(50).regex()}
            and "response_format" not in body
        )
        assert body["model"] == "mine" and body["authorization"] == "Bearer sk-served"
        assert answer.text == "stars: 4\nreview: served" and answer.constrained
        assert not Constraint.answer(50).holds(
            '{"stars": 1, "review": "forced into JSON"}'
        )  # what an old server sends
    finally:
        server.terminate()
        server.wait(10)
