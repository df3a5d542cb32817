"""AgentSociety agents (files written for the official websocietysimulator package) run unchanged by
agents.simulate --agent, against the project's store, with a scripted backend behind self.llm."""

import hashlib
import json
import threading

import pytest
import websocietysimulator.agent

from agents.llm import Answer
from agents.review import official, simulate
from agents.review.official import Batcher
from data_prep.tasks import read_targets, read_tasks

# An agent file as a challenge entry writes it: it imports nothing from this project.
AGENT_FILE = '''
import time

from websocietysimulator.agent import SimulationAgent
from websocietysimulator.llm import LLMBase


class ReadsTheStore(SimulationAgent):
    """The user, the item, both review lists, one LLM call; the answer is "stars|review"."""

    def __init__(self, llm: LLMBase):
        super().__init__(llm=llm)

    def workflow(self):
        user = self.interaction_tool.get_user(user_id=self.task["user_id"])
        item = self.interaction_tool.get_item(item_id=self.task["item_id"])
        seen = self.interaction_tool.get_reviews(user_id=self.task["user_id"])
        seen += self.interaction_tool.get_reviews(item_id=self.task["item_id"])
        latest = max((r["date"] for r in seen), default="none")
        answer = self.llm(
            messages=[{"role": "user", "content": f"{user['user_id']} {item['item_id']} {len(seen)} {latest}"}],
            temperature=0.0,
            max_tokens=64,
            stop_strs=["\\nEND"],
        )
        stars, review = answer.split("|", 1)
        return {"stars": float(stars), "review": review}


class Flaky(ReadsTheStore):
    """By the user id: raises, hangs, returns six stars, or answers."""

    def workflow(self):
        mode = sum(map(ord, self.task["user_id"])) % 4
        if mode == 0:
            raise RuntimeError("my agent broke")
        if mode == 1:
            time.sleep(20)
        if mode == 2:
            return {"stars": 6, "review": "six stars"}
        return super().workflow()


class Embeds(ReadsTheStore):
    def workflow(self):
        vector = self.llm.get_embedding_model().embed_query("good tacos")
        return {"stars": 3, "review": f"a vector of {len(vector)}"}
'''


class EchoLLM:
    """Answers "<1 + n % 5>|seen <n> up to <latest>" then text after a stop string; records batches."""

    def __init__(self):
        self.batches, self.lock = [], threading.Lock()

    def generate(self, conversations, sampling, constraint=None):
        with self.lock:
            self.batches.append(len(conversations))
        out = []
        for conversation in conversations:
            _, _, n, latest = conversation[-1]["content"].split(" ", 3)
            out.append(Answer(f"{1 + int(n) % 5}|seen {n} up to {latest}\nEND and text the stop cuts off"))
        return out


@pytest.fixture(scope="module")
def tasks(yelp_store, tmp_path_factory, make_tasks):
    return make_tasks(yelp_store, tmp_path_factory.mktemp("official_tasks"), n=12, seed=3)


@pytest.fixture
def agent_file(tmp_path):
    path = tmp_path / "my_agent.py"
    path.write_text(AGENT_FILE)
    return path


@pytest.fixture
def backend(monkeypatch):
    llm = EchoLLM()
    monkeypatch.setattr(official, "load_llm", lambda config: llm)
    return llm


def run(agent_file, cls, yelp_store, tasks, out, *extra):
    argv = ["--agent", f"{agent_file}:{cls}", "--data", str(yelp_store), "--tasks", str(tasks)]
    return simulate.main([*argv, "--out", str(out), "--retrieval", "bm25", "--batch_size", "4", *extra])


def rows(out):
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def test_an_official_agent_runs_unchanged_time_aware_batched_and_recorded(
    agent_file, backend, yelp_store, tasks, tmp_path
):
    from agents.plugins import load_class

    assert issubclass(load_class(f"{agent_file}:ReadsTheStore"), websocietysimulator.agent.SimulationAgent)
    summary = run(agent_file, "ReadsTheStore", yelp_store, tasks, tmp_path / "run")
    targets = read_targets(tasks)
    predicted = rows(tmp_path / "run")
    assert len(predicted) == 12 and {r["source"] for r in predicted} == {"agent"}
    for row in predicted:
        n, latest = row["review"].removeprefix("seen ").split(" up to ")
        assert row["stars"] == 1 + int(n) % 5  # the agent's own answer, parsed by the agent
        assert latest < targets[row["task_id"]]["date"]  # it saw nothing from its target's moment on
    assert "END" not in "".join(r["review"] for r in predicted)  # stop_strs cut the answer
    assert max(backend.batches) == 4  # four workflows' calls went to the backend as one batch
    digest = hashlib.sha256(agent_file.read_bytes()).hexdigest()
    assert summary["plugin"]["sha256"] == digest and summary["plugin"]["websocietysimulator"] == "1.0.0a30"
    fingerprint = json.loads((tmp_path / "run" / "fingerprint.json").read_text())["inputs"]
    assert fingerprint["plugin"] == {"target": f"{agent_file}:ReadsTheStore", "sha256": digest}
    official_output = json.loads((tmp_path / "run" / "output.json").read_text())
    assert len(official_output) == 12
    calls = len(backend.batches)
    again = run(agent_file, "ReadsTheStore", yelp_store, tasks, tmp_path / "run")  # a rerun resumes
    assert again["ran_now"] == 0 and again["predicted"] == 12 and len(backend.batches) == calls

    # the leaderboard's visibility, labelled: later reviews reach the agent
    leaderboard = run(
        agent_file, "ReadsTheStore", yelp_store, tasks, tmp_path / "all", "--visibility", "official"
    )
    assert leaderboard["visibility"] == "official"
    later = [
        r for r in rows(tmp_path / "all") if r["review"].split(" up to ")[1] >= targets[r["task_id"]]["date"]
    ]
    assert later  # some task saw a review from its target's moment on

    # a changed agent file is a changed input: the resume is refused, nothing lost
    agent_file.write_text(AGENT_FILE + "\n# edited\n")
    with pytest.raises(SystemExit, match="changed: plugin"):
        run(agent_file, "ReadsTheStore", yelp_store, tasks, tmp_path / "run")
    assert len(rows(tmp_path / "run")) == 12


def test_an_agent_that_raises_hangs_or_answers_out_of_range_is_counted_and_falls_back(
    agent_file, backend, yelp_store, tasks, tmp_path
):
    summary = run(
        agent_file, "Flaky", yelp_store, tasks, tmp_path / "run", "--agent_timeout_s", "1.5", "--limit", "8"
    )
    modes = {t["task_id"]: sum(map(ord, t["user_id"])) % 4 for t in read_tasks(tasks)[:8]}
    expected = {0: "agent_raised", 1: "agent_timeout", 2: "agent_malformed"}
    assert set(modes.values()) == {0, 1, 2, 3}  # the sample exercises every way
    predicted = {r["task_id"]: r for r in rows(tmp_path / "run")}
    assert len(predicted) == 8 and summary["errors"] == 0  # the run went on
    for task_id, mode in modes.items():
        row = predicted[task_id]
        if mode == 3:
            assert row["source"] == "agent"
        else:
            assert row["source"] == "fallback" and row["counts"] == {expected[mode]: 1, "fallbacks": 1}
            assert 1 <= row["stars"] <= 5 and row["review"].strip()  # the stats agent's prediction
    failures = [
        json.loads(line) for line in (tmp_path / "run" / "agent_failures.jsonl").read_text().splitlines()
    ]
    assert sorted(f["task_id"] for f in failures) == sorted(k for k, m in modes.items() if m != 3)
    assert all("my agent broke" in f["detail"] for f in failures if f["reason"] == "agent_raised")
    for mode, reason in expected.items():
        assert summary["counts"].get(reason, 0) == sum(m == mode for m in modes.values())


def test_the_agent_gets_an_embedding_model_without_network(agent_file, backend, yelp_store, tasks, tmp_path):
    run(agent_file, "Embeds", yelp_store, tasks, tmp_path / "run", "--limit", "2")
    assert [r["review"] for r in rows(tmp_path / "run")] == ["a vector of 384"] * 2


def test_the_batcher_answers_every_caller_with_its_own_answers_and_passes_on_errors():
    class Numbered:
        def __init__(self):
            self.batches = []

        def generate(self, conversations, sampling, constraint=None):
            self.batches.append(len(conversations))
            if any(c[0]["content"] == "boom" for c in conversations):
                raise RuntimeError("backend down")
            return [Answer(c[0]["content"].upper()) for c in conversations]

    from agents.llm import Sampling

    backend = Numbered()
    batcher = Batcher(backend, seed=0, window_s=5.0)
    answers, errors = {}, []

    def call(text, n):
        try:
            answers[text] = [a.text for a in batcher.ask([{"role": "user", "content": text}], Sampling(8), n)]
        except RuntimeError as error:
            errors.append(str(error))
        finally:
            batcher.stopped(slots[text])

    slots = {text: {} for text in ("a", "b", "c")}
    threads = [threading.Thread(target=call, args=(t, 2 if t == "b" else 1)) for t in slots]
    for _ in threads:
        batcher.started()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert answers == {"a": ["A"], "b": ["B", "B"], "c": ["C"]}
    assert backend.batches == [4]  # all three callers waited: one batch, without waiting out the window
    batcher.started()
    slots["boom"] = {}
    call("boom", 1)
    assert errors == ["backend down"]


def test_the_suite_scores_a_plugged_agent_beside_the_shipped_ones(
    agent_file, backend, yelp_store, tasks, tmp_path
):
    from eval import baselines, suite

    table, agents, claims = suite.run_suite(
        yelp_store, tasks, tmp_path, adapter=None, kinds=("stats",), plugins=(f"{agent_file}:ReadsTheStore",)
    )
    names = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert names == [*baselines.KINDS, "stats", "ReadsTheStore"]
    assert "| ReadsTheStore | 12/12 |" in agents
    for baseline in ("stats", "nearest-centroid", "user-mean"):
        assert f"| ReadsTheStore > {baseline} | overall |" in claims
