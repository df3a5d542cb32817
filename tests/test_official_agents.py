"""AgentSociety agents (files written for the official websocietysimulator package) run unchanged by
agents.review run --agent, against the project's store, with a scripted backend behind self.llm."""

import hashlib
import json
import threading
from pathlib import Path

import pytest
import websocietysimulator.agent

from agents.llm import Answer
from agents.review import official, simulate
from agents.review.official import FAILURES, Batcher
from data_prep.tasks import read_targets, read_tasks

HERE = Path(__file__).parent

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


class UsesTheAttributes(SimulationAgent):
    """The official tool's dicts and the official LLM's client and embedding model."""

    def workflow(self):
        tool = self.interaction_tool
        item, user = tool.item_data[self.task["item_id"]], tool.user_data[self.task["user_id"]]
        mine = tool.get_reviews(user_id=self.task["user_id"])
        assert all(tool.review_data[r["review_id"]] == r for r in mine)
        first = mine[0]["review_id"] if mine else "none"
        content = f"{user['user_id']} {item['item_id']} {len(mine)} {first}"
        reply = self.llm.client.chat.completions.create(
            model="any", messages=[{"role": "user", "content": content}], temperature=0.0, max_tokens=32
        )
        dims = len(self.llm.embedding_model.embed_query("x"))
        order = ",".join(r["review_id"] for r in mine)
        return {"stars": 3, "review": f"{reply.choices[0].message.content.splitlines()[0]} dims {dims} order {order}"}


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_suite_scores_a_plugged_agent_beside_the_shipped_ones(
    agent_file, backend, yelp_store, tasks, tmp_path
):
    from eval.review import baselines, suite

    table, agents, claims = suite.run_suite(
        yelp_store, tasks, tmp_path, adapter=None, kinds=("stats",), plugins=(f"{agent_file}:ReadsTheStore",)
    )
    names = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert names == [*baselines.KINDS, "stats", "ReadsTheStore"]
    assert "| ReadsTheStore | 12/12 |" in agents
    for baseline in ("stats", "nearest-centroid", "user-mean"):
        assert f"| ReadsTheStore > {baseline} | overall |" in claims


MODULES = HERE / "official_agents" / "modules_agent.py"


class ModulesLLM:
    """Answers the official modules' prompts: a memory's relevance score, a plan, a trajectory summary,
    and the agent's own review prompt with the review it recalled."""

    def generate(self, conversations, sampling, constraint=None):
        out = []
        for conversation in conversations:
            text = conversation[-1]["content"]
            if text.rstrip().endswith("Score:"):
                out.append("7")
            elif text.rstrip().endswith("Plan:"):
                out.append("Read the reviews first.")
            elif "task resolution trajectory" in text:
                out.append("A summary of: " + text[-40:])
            else:
                recalled = text.split("A review you remembered: ", 1)[1].split("\nAnswer in this format", 1)[
                    0
                ]
                out.append(f"stars: 4.0\nreview: recalled {recalled}")
        return [Answer(t) for t in out]


@pytest.mark.slow
def test_an_agent_on_the_official_modules_runs_unchanged_and_its_memory_embeds_with_the_runs_model(
    monkeypatch, yelp_store, tasks, tmp_path
):
    """PlanningBase, ReasoningBase and MemoryDILU (chromadb through langchain-chroma), from a submission
    split in two files: the memory holds the item's visible reviews, embedded with the run's MiniLM, and
    recalls the one nearest the user's first review (file order)."""
    import numpy as np

    from agents.encoders import packaged_minilm
    from data_prep.store import ReviewStore

    monkeypatch.setattr(official, "load_llm", lambda config: ModulesLLM())
    monkeypatch.chdir(tmp_path)  # the official memory modules write their vector store under ./db
    summary = run(MODULES, "WithMemoryDILU", yelp_store, tasks, tmp_path / "run", "--limit", "6")
    assert summary["counts"].get("agent_raised", 0) == 0
    predicted = rows(tmp_path / "run")
    assert {r["source"] for r in predicted} == {"agent"} and len(predicted) == 6
    assert (tmp_path / "db" / "dilu").is_dir()
    store, encoder = ReviewStore(yelp_store), packaged_minilm("cpu", 64)
    tasks_by_id, moments = {t["task_id"]: t for t in read_tasks(tasks)}, read_targets(tasks)
    checked = 0
    for row in predicted:
        task = {**tasks_by_id[row["task_id"]], "ts": moments[row["task_id"]]["ts"]}
        pool = [  # what the memory stores: MemoryBase drops the "review:" marker it was handed
            f"review: {r['text']}".replace("review:", "")
            for r in store.get_reviews(item_id=task["item_id"], before=task["ts"], order="file")
        ]
        mine = store.get_reviews(user_id=task["user_id"], before=task["ts"], order="file")
        recalled = row["review"].removeprefix("recalled ")
        if not pool or not mine:
            assert recalled == ""
            continue
        vectors = encoder.model.encode([mine[0]["text"], *pool], convert_to_numpy=True)
        nearest = pool[int(np.argmin(np.linalg.norm(vectors[1:] - vectors[0], axis=1)))]
        assert (
            recalled.strip() == nearest.strip()
        )  # a visible review of the item, the one the run's model puts nearest
        checked += 1
    assert checked >= 3


@pytest.mark.parametrize("agent", ["WithMemoryGenerative", "WithMemoryTP", "WithMemoryVoyager"])
def test_agents_on_the_other_official_memory_modules_run(agent, monkeypatch, yelp_store, tasks, tmp_path):
    monkeypatch.setattr(official, "load_llm", lambda config: ModulesLLM())
    monkeypatch.chdir(tmp_path)
    summary = run(MODULES, agent, yelp_store, tasks, tmp_path / "run", "--limit", "3")
    predicted = rows(tmp_path / "run")
    assert {r["source"] for r in predicted} == {"agent"}, summary["counts"]
    recalled = [r["review"].removeprefix("recalled ") for r in predicted]
    if agent == "WithMemoryTP":  # the module's misspelt keyword (messaage=) reached the backend
        assert any(r.startswith("Plan from successful attempt") for r in recalled)
    else:
        assert any(recalled)


def test_the_tool_gives_reviews_in_file_order_and_the_official_attributes(
    agent_file, backend, raw, yelp_store, tasks, tmp_path
):
    run(agent_file, "UsesTheAttributes", yelp_store, tasks, tmp_path / "run")
    predicted = rows(tmp_path / "run")
    assert {r["source"] for r in predicted} == {"agent"}, [r.get("counts") for r in predicted]
    lines = [json.loads(line) for line in open(raw / "yelp_asc_sample" / "review_subset.json")]
    moments, by_id = read_targets(tasks), {t["task_id"]: t for t in read_tasks(tasks)}
    for row in predicted:
        task, when = by_id[row["task_id"]], moments[row["task_id"]]["date"]
        shown = row["review"].split(" order ", 1)[1].split(",")
        in_file = [
            r["review_id"]
            for r in lines
            if r["user_id"] == task["user_id"] and r["date"] < when and r["item_id"] != task["item_id"]
        ]
        assert shown == in_file  # the review file's order; the task's moment on and its pair hidden
        assert " dims 384 " in row["review"]


def test_reviews_come_in_the_files_order_not_by_time(raw, tmp_path):
    """The sample's file is sorted by time; reversed, the tool must give the reversed order."""
    import shutil
    import threading

    from data_prep import build
    from data_prep.store import ReviewStore

    source = tmp_path / "reversed"
    shutil.copytree(raw / "yelp_asc_sample", source, ignore=shutil.ignore_patterns("review_subset.json"))
    lines = (raw / "yelp_asc_sample" / "review_subset.json").read_text().splitlines()
    (source / "review_subset.json").write_text("\n".join(reversed(lines)) + "\n")
    build.main(
        ["--source", "asc", "--platform", "yelp", "--input", str(source), "--out", str(tmp_path / "store")]
    )
    store = ReviewStore(tmp_path / "store")
    rows = [json.loads(line) for line in reversed(lines)]
    user = max({r["user_id"] for r in rows}, key=lambda u: sum(r["user_id"] == u for r in rows))
    tool = official.StoreTool(store, None, threading.Lock())
    shown = [r["review_id"] for r in tool.get_reviews(user_id=user)]
    assert shown == [r["review_id"] for r in rows if r["user_id"] == user] and len(shown) > 2
    assert shown != [
        r["review_id"] for r in store.get_reviews(user_id=user)
    ]  # the agents' own order: by time
    assert list(tool.review_data)[:3] == [r["review_id"] for r in rows[:3]] and len(tool.review_data) == len(
        rows
    )


def test_an_official_task_folder_without_targets_runs_and_is_not_scored(
    agent_file, backend, yelp_store, tasks, tmp_path
):
    import shutil

    from eval.review import score

    folder = tmp_path / "official_tasks"
    shutil.copytree(tasks / "tasks", folder / "tasks")  # what the challenge hands out: tasks alone
    with pytest.raises(SystemExit, match="--visibility official"):
        run(agent_file, "ReadsTheStore", yelp_store, folder, tmp_path / "timed")
    summary = run(
        agent_file, "ReadsTheStore", yelp_store, folder, tmp_path / "run", "--visibility", "official"
    )
    assert (
        summary["predicted"] == 12 and len(json.loads((tmp_path / "run" / "output.json").read_text())) == 12
    )
    with pytest.raises(SystemExit, match="nothing to score"):
        score.main(
            [
                "--tasks",
                str(folder),
                "--predictions",
                str(tmp_path / "run" / "predictions.jsonl"),
                "--out",
                str(tmp_path / "e"),
            ]
        )


def test_an_agent_file_imports_the_file_beside_it_and_a_failed_import_is_not_kept(tmp_path):
    import sys

    from agents.plugins import PluginError, load_class

    (tmp_path / "helper_for_agent.py").write_text("VALUE = 7\n")
    (tmp_path / "agent_with_helper.py").write_text(
        "from helper_for_agent import VALUE\nclass A:\n    value = VALUE\n"
    )
    assert load_class(f"{tmp_path / 'agent_with_helper.py'}:A").value == 7
    broken = tmp_path / "half.py"
    broken.write_text("class A:\n    pass\nraise RuntimeError('halfway')\n")
    before = set(sys.modules)
    with pytest.raises(PluginError, match="halfway"):
        load_class(f"{broken}:A")
    assert set(sys.modules) == before  # no half module left behind
    broken.write_text("class A:\n    fixed = True\n")
    assert load_class(f"{broken}:A").fixed  # the next load reads the file again


def test_one_bad_call_fails_only_its_own_workflow_and_waiting_is_not_the_tasks_own_time():
    import time

    from agents.llm import Sampling

    class Picky:
        def __init__(self):
            self.batches = []

        def generate(self, conversations, sampling, constraint=None):
            self.batches.append([c[0]["content"] for c in conversations])
            if sampling.max_new_tokens == 16:
                time.sleep(0.6)  # a slow batch of another setting, served first
            if any(c[0]["content"] == "far too long" for c in conversations):
                raise ValueError("the prompt is longer than the model's window")
            return [Answer(c[0]["content"].upper()) for c in conversations]

    backend = Picky()
    batcher = Batcher(backend, seed=0, window_s=0.2)
    out, idents = {}, {}

    def call(text, tokens):
        idents[text] = threading.get_ident()
        try:
            out[text] = batcher.ask([{"role": "user", "content": text}], Sampling(tokens), 1)[0].text
        except ValueError as error:
            out[text] = f"error: {error}"
        finally:
            batcher.stopped({})

    threads = [threading.Thread(target=call, args=a) for a in (("slow", 16), ("a", 8), ("far too long", 8))]
    for _ in threads:
        batcher.started()
    for thread in threads:
        thread.start()
        time.sleep(0.03)  # in this order: the slow setting's group is served first
    for thread in threads:
        thread.join(10)
    assert out == {
        "slow": "SLOW",
        "a": "A",
        "far too long": "error: the prompt is longer than the model's window",
    }
    assert ["a", "far too long"] in backend.batches and ["a"] in backend.batches  # retried alone
    # the calls of the second setting waited for the slow batch: not their own time
    assert batcher.queued[idents["a"]] >= 0.5 and batcher.queued[idents["slow"]] < 0.4


@pytest.mark.slow
def test_importing_the_official_package_does_not_reach_for_the_network():
    """websocietysimulator's import downloads the VADER lexicon when nltk cannot find it; the runner puts
    the rebuilt lexicon on nltk's path first (a fresh interpreter, with downloads made to fail loudly)."""
    import subprocess
    import sys

    code = (
        "import nltk\n"
        "def refuse(*a, **k): raise SystemExit('nltk.download was called')\n"
        "nltk.download = refuse\n"
        "from agents.review.official import official_package\n"
        "print(official_package()['version'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=HERE.parent
    )
    assert done.returncode == 0 and done.stdout.strip() == "1.0.0a30", done.stderr[-2000:]


def test_an_agent_on_the_official_modules_runs_on_an_openai_compatible_server(
    yelp_store, tasks, tmp_path, monkeypatch
):
    """The same agent file through the real openai backend, against a stand-in server on loopback that
    answers as ModulesLLM does; the key travels from the environment."""
    from http.server import ThreadingHTTPServer

    from openai_fakes import ChatHandler, chat_completion

    seen = []

    class Served(ChatHandler):
        def do_POST(self):  # noqa: N802
            body = self.body()
            seen.append(self.headers.get("Authorization"))
            (answer,) = ModulesLLM().generate([body["messages"]], None)
            self.send_json(chat_completion(body["model"], answer.text))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Served)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("MODULES_KEY", "sk-modules")
    monkeypatch.chdir(tmp_path)
    try:
        base = f"http://127.0.0.1:{server.server_port}/v1"
        flags = [
            "--limit",
            "3",
            "--backend",
            "openai",
            "--base_url",
            base,
            "--model",
            "served",
            "--api_key_env",
            "MODULES_KEY",
        ]
        run(MODULES, "WithMemoryDILU", yelp_store, tasks, tmp_path / "run", *flags)
    finally:
        server.shutdown()
    assert {r["source"] for r in rows(tmp_path / "run")} == {"agent"} and len(rows(tmp_path / "run")) == 3
    assert seen and set(seen) == {"Bearer sk-modules"}


@pytest.mark.slow
def test_an_agent_on_the_official_modules_runs_on_the_offline_default_model(
    yelp_store, tasks, tmp_path, monkeypatch
):
    """The real SmolLM2-135M (the offline default): the run finishes; every task is the agent's answer or
    a counted fallback with its reason (the small model may not write the agent's format)."""
    monkeypatch.chdir(tmp_path)
    summary = run(MODULES, "WithMemoryDILU", yelp_store, tasks, tmp_path / "run", "--limit", "2")
    predicted = rows(tmp_path / "run")
    assert len(predicted) == 2 and summary["errors"] == 0
    failures = [json.loads(line) for line in (tmp_path / "run" / FAILURES).read_text().splitlines()] if (
        tmp_path / "run" / FAILURES).exists() else []  # fmt: skip
    assert sum(r["source"] == "fallback" for r in predicted) == len(failures)
    assert all(f["reason"] in ("agent_raised", "agent_malformed", "agent_timeout") for f in failures)
