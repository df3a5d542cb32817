"""AgentSociety Challenge agents, run unchanged through this project's runner.

    python -m agents.simulate --agent path/to/my_agent.py:MySimulationAgent \\
        --data runs/demo/data/amazon --tasks runs/demo/tasks/amazon --out runs/demo/sim/mine
    python -m agents.simulate --agent my_package.agents:MySimulationAgent --config configs/agents/official.yaml ...

The agent is a file written for the official ``websocietysimulator`` package (make setup installs its
core): a ``SimulationAgent`` subclass whose ``workflow()`` reads ``self.task`` ({"user_id", "item_id",
"description"}), calls ``self.interaction_tool.get_user(user_id=...)``, ``get_item(item_id=...)``,
``get_reviews(item_id=..., user_id=..., review_id=...)`` and ``self.llm(messages=..., temperature=...,
max_tokens=..., stop_strs=..., n=...)`` (and ``self.llm.get_embedding_model()``), and returns
``{"stars": ..., "review": ...}``. It is run as the official Simulator runs it: ``Agent(llm=llm)``,
``set_interaction_tool``, ``insert_task(SimulationTask(user_id, item_id))``, ``workflow()``. What it
gets from this project instead of the official objects:

- **the store** behind the interaction tool (``StoreTool``), time-aware by default: a task sees only
  reviews strictly older than its target, and never a review of a task pair; ``--visibility official``
  shows everything but the task pairs, as the leaderboard does (labelled in every table);
- **an LLMBase** (``ProjectLLM``) backed by the run's backend (hf with an adapter, vllm, openai);
  ``stop_strs`` cut the answer after generation (the text before a stop is what the model wrote);
  ``get_embedding_model()`` is the packaged all-MiniLM-L6-v2 behind LangChain's ``Embeddings``;
- **batching**: ``batch_size`` workflows run in threads at once, and the LLM calls they make at the
  same moment go to the backend as one batch (``Batcher``); each task has the official per-task
  timeout (``agent_timeout_s``, 300 s).

A workflow that raises, runs past the timeout, or returns no usable ``stars`` (a number from 1 to 5)
and ``review`` (non-empty text) is counted (``agent_raised``, ``agent_timeout``, ``agent_malformed``),
written with its reason to ``agent_failures.jsonl``, and falls back to the stats agent's prediction
(source ``fallback``), as the LLM agents fall back; the run goes on. Stars are never clamped: 0 or 6 is
malformed. The agent file's import path and SHA-256 are in the run's fingerprint and provenance, so a
resume after the file changed is refused like any other changed input.
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections import Counter
from dataclasses import replace
from pathlib import Path

from agents.llm import Answer, Sampling, load_llm
from agents.plugins import describe, load_class
from agents.review.agent import AgentConfig, Prediction, ReviewAgent, usable

FAILURES = "agent_failures.jsonl"


def official_package() -> dict:
    """Where the agents' ``websocietysimulator`` comes from (for provenance); a clear error without it."""
    try:
        from importlib.metadata import version

        import websocietysimulator  # noqa: F401
    except ImportError as error:
        raise SystemExit(
            f"error: --agent runs AgentSociety agents, which import websocietysimulator ({error}): "
            "`pip install --no-deps websocietysimulator==1.0.0a30` and its core's imports, langchain-openai, "
            "tenacity and lmdb (make setup does both)"
        ) from error
    return {"package": "websocietysimulator", "version": version("websocietysimulator")}


class StoreTool:
    """The official InteractionTool's three calls over this project's review store, at one moment."""

    def __init__(self, store, before: int | None, lock: threading.Lock):
        self.store, self.before, self.lock = store, before, lock

    def get_user(self, user_id: str) -> dict | None:
        with self.lock:
            return self.store.get_user(user_id)

    def get_item(self, item_id: str | None = None) -> dict | None:
        if not item_id:
            return None
        with self.lock:
            return self.store.get_item(item_id)

    def get_reviews(
        self, item_id: str | None = None, user_id: str | None = None, review_id: str | None = None
    ) -> list[dict]:
        """As the official tool: by review id, else by item, else by user (one key, in that order)."""
        key = (
            {"review_id": review_id}
            if review_id
            else {"item_id": item_id}
            if item_id
            else {"user_id": user_id}
            if user_id
            else None
        )
        if key is None:
            return []
        with self.lock:
            return self.store.get_reviews(**key, before=self.before)


class Batcher:
    """One thread that serves every workflow's LLM calls: the calls waiting at the same moment (all
    running workflows are waiting, or ``window_s`` passed) go to the backend together, one batch per
    sampling setting. Only this thread touches the backend."""

    def __init__(self, backend, seed: int, window_s: float = 0.05):
        self.backend, self.seed, self.window_s = backend, seed, window_s
        self.cond = threading.Condition()
        self.pending: list[dict] = []
        self.running = 0  # workflows that may still call the LLM
        self.abandoned: set[int] = set()  # threads past their timeout: their calls are refused
        self.calls, self.batches = 0, 0
        threading.Thread(target=self.serve, daemon=True, name="llm-batcher").start()

    def started(self) -> None:
        with self.cond:
            self.running += 1

    def stopped(self, result: dict, thread: threading.Thread | None = None) -> None:
        """A workflow ended, or was abandoned past its timeout (``thread``: its later LLM calls are
        refused, so it cannot hold up or reseed the batches after it); counted once either way."""
        with self.cond:
            if thread is not None:
                self.abandoned.add(thread.ident)
            if not result.get("released"):
                result["released"] = True
                self.running -= 1
                self.cond.notify_all()

    def ask(self, messages: list[dict], sampling: Sampling, n: int) -> list[Answer]:
        if threading.get_ident() in self.abandoned:
            raise TimeoutError("this workflow ran past its timeout: its task has fallen back")
        slot = {"messages": messages, "sampling": sampling, "n": n, "done": threading.Event()}
        with self.cond:
            self.pending.append(slot)
            self.cond.notify_all()
        slot["done"].wait()
        if "error" in slot:
            raise slot["error"]
        return slot["answers"]

    def serve(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.pending)
                self.cond.wait_for(lambda: len(self.pending) >= self.running, timeout=self.window_s)
                batch, self.pending = self.pending, []
            groups: dict[tuple, list[dict]] = {}
            for slot in batch:
                key = (slot["sampling"].max_new_tokens, slot["sampling"].temperature)
                groups.setdefault(key, []).append(slot)
            for slots in groups.values():
                sampling = slots[0]["sampling"]
                conversations = [s["messages"] for s in slots for _ in range(s["n"])]
                self.batches += 1
                self.calls += len(slots)
                try:
                    answers = self.backend.generate(
                        conversations, replace(sampling, seed=self.seed + self.batches)
                    )
                except Exception as error:  # every waiting workflow gets the backend's error
                    for s in slots:
                        s["error"] = error
                        s["done"].set()
                    continue
                at = 0
                for s in slots:
                    s["answers"], at = answers[at : at + s["n"]], at + s["n"]
                    s["done"].set()


def embedding_model():
    """The packaged all-MiniLM-L6-v2 (no network) behind LangChain's Embeddings interface, which is
    what the official LLMs' get_embedding_model() returns."""
    from langchain_core.embeddings import Embeddings

    from agents.encoders import packaged_minilm

    encoder = packaged_minilm("cpu", 64)

    class MiniLMEmbeddings(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return encoder.model.encode(list(texts), convert_to_numpy=True).tolist()

        def embed_query(self, text: str) -> list[float]:
            return self.embed_documents([text])[0]

    return MiniLMEmbeddings()


def project_llm_class():
    """ProjectLLM, a subclass of the official LLMBase (made once the package is importable)."""
    from websocietysimulator.llm import LLMBase

    class ProjectLLM(LLMBase):
        """The official LLM interface over the run's backend, through the Batcher."""

        def __init__(self, batcher: Batcher, model: str):
            super().__init__(model=model)
            self.batcher = batcher
            self.embedding = None
            self.lock = threading.Lock()

        def __call__(
            self,
            messages: list[dict],
            model: str | None = None,
            temperature: float = 0.0,
            max_tokens: int = 500,
            stop_strs: list[str] | None = None,
            n: int = 1,
        ) -> str | list[str]:
            sampling = Sampling(max_new_tokens=int(max_tokens), temperature=float(temperature))
            answers = [cut_at_stop(a.text, stop_strs) for a in self.batcher.ask(messages, sampling, int(n))]
            return answers[0] if n == 1 else answers

        def get_embedding_model(self):
            with self.lock:
                if self.embedding is None:
                    self.embedding = embedding_model()
            return self.embedding

    return ProjectLLM


def cut_at_stop(text: str, stops: list[str] | None) -> str:
    cuts = [text.find(s) for s in stops or [] if s and s in text]
    return text[: min(cuts)] if cuts else text


def usable_output(output) -> tuple[float, str] | None:
    """(stars, review) from a workflow's return value, or None: a dict with numeric stars in [1, 5]
    and a non-empty review string."""
    if not isinstance(output, dict):
        return None
    stars, review = output.get("stars"), output.get("review")
    try:
        stars = float(stars)
    except (TypeError, ValueError):
        return None
    if not isinstance(review, str) or not usable(stars, review):
        return None
    return stars, review.strip()


class OfficialAgentRunner:
    """Runs an AgentSociety SimulationAgent over tasks; ``predict(tasks)`` as ReviewAgent.predict."""

    def __init__(self, config: AgentConfig, llm_config, store, out: Path, encoder=None):
        from websocietysimulator.tasks.simulation_task import SimulationTask

        self.package = official_package()
        self.config, self.store, self.out = config, store, out
        self.agent_class = load_class(config.agent)
        self.task_class = SimulationTask
        self.fallback = ReviewAgent(replace(config, kind="stats", selection="answer"), None, store, encoder)
        self.stars = self.fallback.stars  # its report is the run's star_model.json
        self.backend = load_llm(llm_config)
        self.batcher = Batcher(self.backend, config.seed)
        self.llm = project_llm_class()(self.batcher, llm_config.model)
        self.lock = threading.Lock()

    def workflow(self, task: dict, result: dict) -> None:
        """One task in its own thread: the official Simulator's steps; the outcome into ``result``."""
        try:
            before = None if self.config.visibility == "official" else task["ts"]
            agent = self.agent_class(llm=self.llm)
            agent.set_interaction_tool(StoreTool(self.store, before, self.lock))
            agent.insert_task(self.task_class(user_id=task["user_id"], item_id=task["item_id"]))
            result["output"] = agent.workflow()
        except BaseException:  # the agent's own error, whatever it is: recorded, the run goes on
            result["error"] = traceback.format_exc(limit=8)
        finally:
            self.batcher.stopped(result)

    def predict(self, tasks: list[dict]) -> list[Prediction]:
        results = [{} for _ in tasks]
        threads = []
        for task, result in zip(tasks, results, strict=True):
            self.batcher.started()
            thread = threading.Thread(target=self.workflow, args=(task, result), daemon=True)
            thread.start()
            threads.append(thread)
        deadline = time.monotonic() + self.config.agent_timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self.lock:  # abandoned workflows may still read the store
            fallbacks = self.fallback.predict(tasks)
        out = []
        with open(self.out / FAILURES, "a") as failures:
            for task, result, thread, fallback in zip(tasks, results, threads, fallbacks, strict=True):
                if thread.is_alive():
                    reason, detail = "agent_timeout", f"no answer after {self.config.agent_timeout_s} s"
                    self.batcher.stopped(result, thread)  # abandoned: no longer waited for, nor served
                elif "error" in result:
                    reason, detail = "agent_raised", result["error"]
                elif (answer := usable_output(result.get("output"))) is None:
                    reason, detail = "agent_malformed", repr(result.get("output"))[:2000]
                else:
                    out.append(
                        Prediction(
                            task["task_id"],
                            task["user_id"],
                            task["item_id"],
                            answer[0],
                            answer[1],
                            "agent",
                            counts=Counter(),
                        )
                    )
                    continue
                failures.write(
                    json.dumps({"task_id": task["task_id"], "reason": reason, "detail": detail}) + "\n"
                )
                fallback.source = "fallback"
                fallback.counts = Counter({reason: 1, "fallbacks": 1})
                out.append(fallback)
        return out


def plugin_record(target: str) -> dict:
    """The agent's import path and file digest, and the official package's version (provenance)."""
    return {**describe(target), "websocietysimulator": official_package()["version"]}
