"""AgentSociety Challenge agents, run unchanged through this project's runner.

    python -m agents.review run --agent path/to/my_agent.py:MySimulationAgent \\
        --data runs/demo/data/amazon --tasks runs/demo/tasks/amazon --out runs/demo/sim/mine
    python -m agents.review run --agent my_package.agents:MySimulationAgent --config configs/review/official.yaml ...

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
  timeout (``agent_timeout_s``, 300 s) on its own clock: the time its LLM calls waited while the
  backend served other tasks' calls is not counted. A batch the backend refuses (a prompt longer than
  the model's window) is retried call by call, so only the offending task fails.
- **the official attributes**: the tool's ``item_data``, ``user_data`` and ``review_data`` (read from
  the store with the run's visibility), reviews in the review file's order as the official tool gives
  them, and the LLM's ``client`` (``chat.completions.create``) and ``embedding_model``. Agents built on
  ``websocietysimulator.agent.modules`` (planning, reasoning, memory, tool use) run: their vector store
  (chromadb, through langchain-chroma) embeds with the run's embedding model, in ``./db`` as the
  package writes it.

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
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from agents.llm import Answer, Sampling, load_llm
from agents.plugins import PluginError, describe, load_class
from agents.review.agent import AgentConfig, Prediction, ReviewAgent, usable
from data_prep.io import append_to

FAILURES = "agent_failures.jsonl"


# what the official agent modules (websocietysimulator.agent.modules: the planning, reasoning, memory and
# tool-use classes most entries build on) import beyond the package's core
MODULE_PACKAGES = {"langchain_chroma", "langchain", "chromadb"}
SETUP_HINT = (
    "make setup installs websocietysimulator's core (--no-deps), what it imports (langchain-openai, tenacity, "
    "lmdb) and what its agent modules import (langchain-chroma, chromadb, langchain's docstore) in .venv; "
    "make vllm-env does the same in .venv-vllm"
)


def official_package() -> dict:
    """Where the agents' ``websocietysimulator`` comes from (for provenance); a clear error without it.

    Before the import: the rebuilt VADER lexicon goes on nltk's path (the package's import downloads it
    when nltk cannot find it), and chromadb's usage telemetry is off (``ANONYMIZED_TELEMETRY``, unless
    set): nothing leaves the machine."""
    import os

    from agents.lexicon import put_on_nltk_path

    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    put_on_nltk_path()
    try:
        from importlib.metadata import version

        import websocietysimulator  # noqa: F401
    except ImportError as error:
        raise SystemExit(
            f"error: --agent runs AgentSociety agents, which import websocietysimulator ({error}): {SETUP_HINT}"
        ) from error
    return {"package": "websocietysimulator", "version": version("websocietysimulator")}


def load_agent(target: str) -> type:
    """The agent class; an agent whose import misses a package of the official modules is told which
    make target installs it."""
    official_package()
    try:
        return load_class(target)
    except PluginError as error:
        cause = error.__cause__
        if isinstance(cause, ModuleNotFoundError) and (cause.name or "").split(".")[0] in MODULE_PACKAGES:
            raise SystemExit(f"error: {error}: {SETUP_HINT}") from None
        raise


class StoreView(Mapping):
    """One of the official tool's dicts (``item_data``, ``user_data``, ``review_data``), read from the
    store when asked: reviews with the run's visibility (none from the task's moment on, none of a task
    pair); ids in the store's file order."""

    def __init__(self, tool: StoreTool, table: str):
        self.tool, self.table = tool, table

    def __getitem__(self, key: str) -> dict:
        with self.tool.lock:
            if self.table == "reviews":
                found = self.tool.store.get_reviews(review_id=key, before=self.tool.before)
                value = found[0] if found else None
            else:
                value = (self.tool.store.get_item if self.table == "items" else self.tool.store.get_user)(key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self):
        with self.tool.lock:
            ids = self.tool.store.ids(self.table, before=self.tool.before)
        return iter(ids)

    def __len__(self) -> int:
        with self.tool.lock:
            return len(self.tool.store.ids(self.table, before=self.tool.before))


class StoreTool:
    """The official InteractionTool over this project's review store, at one moment: its three calls
    (reviews in the order the official tool gives them, the files' order) and its ``item_data``,
    ``user_data`` and ``review_data`` dicts (StoreView)."""

    def __init__(self, store, before: int | None, lock: threading.Lock):
        self.store, self.before, self.lock = store, before, lock
        self.item_data = StoreView(self, "items")
        self.user_data = StoreView(self, "users")
        self.review_data = StoreView(self, "reviews")

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
        """As the official tool: by review id, else by item, else by user (one key, in that order), in
        the review file's order."""
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
            return self.store.get_reviews(**key, before=self.before, order="file")


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
        # per thread, the seconds its calls waited while the backend served other calls (not the task's
        # own time, so not counted against its timeout), and since when a call of it is waiting now
        self.queued: Counter = Counter()
        self.waiting_since: dict[int, float] = {}
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
        slot = {"messages": messages, "sampling": sampling, "n": n, "done": threading.Event(),
                "thread": threading.get_ident(), "asked": time.monotonic()}  # fmt: skip
        with self.cond:
            self.pending.append(slot)
            self.waiting_since[slot["thread"]] = slot["asked"]
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
                self.calls += len(slots)
                self.answer(slots)

    def own(self, slots: list[dict]) -> None:
        """These calls go to the backend now: the time they waited behind other calls (and the batching
        window) is credited to their threads, and their waiting ends."""
        now = time.monotonic()
        with self.cond:
            for s in slots:
                since = self.waiting_since.pop(s["thread"], None)
                if since is not None:
                    self.queued[s["thread"]] += now - since

    def queued_now(self, thread: int) -> float:
        """The seconds a thread's calls have waited for other calls so far, a wait in progress included."""
        with self.cond:
            since = self.waiting_since.get(thread)
            return self.queued[thread] + (time.monotonic() - since if since is not None else 0.0)

    def answer(self, slots: list[dict]) -> None:
        """One batch to the backend. If it fails, each call is tried alone, so one bad call (a prompt
        longer than the model's window) fails only its own workflow; while one is retried, the others
        wait (not their own time)."""
        self.own(slots)
        sampling = slots[0]["sampling"]
        conversations = [s["messages"] for s in slots for _ in range(s["n"])]
        self.batches += 1
        try:
            answers = self.backend.generate(conversations, replace(sampling, seed=self.seed + self.batches))
        except Exception as error:
            if len(slots) > 1:
                now = time.monotonic()
                with self.cond:
                    for s in slots:
                        self.waiting_since[s["thread"]] = now
                for s in slots:
                    self.answer([s])
                return
            slots[0]["error"] = error
            slots[0]["done"].set()
            return
        at = 0
        for s in slots:
            s["answers"], at = answers[at : at + s["n"]], at + s["n"]
            s["done"].set()


def embedding_model():
    """The packaged all-MiniLM-L6-v2 (no network) behind LangChain's Embeddings interface, which is
    what the official LLMs' get_embedding_model() returns."""
    from langchain_core.embeddings import Embeddings

    from agents.encoders import packaged_minilm

    encoder = packaged_minilm("auto", 64)

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
            messages: list[dict] | str | None = None,
            model: str | None = None,
            temperature: float = 0.0,
            max_tokens: int = 500,
            stop_strs: list[str] | None = None,
            n: int = 1,
            messaage: str | None = None,
        ) -> str | list[str]:
            """The official call. Two forms the package's own modules use are accepted: ``messaage=``
            (MemoryTP's spelling) and a plain string (one user message)."""
            messages = messaage if messages is None else messages
            if isinstance(messages, str):
                messages = [{"role": "user", "content": messages}]
            sampling = Sampling(max_new_tokens=int(max_tokens), temperature=float(temperature))
            answers = [cut_at_stop(a.text, stop_strs) for a in self.batcher.ask(messages, sampling, int(n))]
            return answers[0] if n == 1 else answers

        def get_embedding_model(self):
            with self.lock:
                if self.embedding is None:
                    self.embedding = embedding_model()
            return self.embedding

        @property
        def embedding_model(self):
            """The official LLMs' attribute: the same model as get_embedding_model()."""
            return self.get_embedding_model()

        @property
        def client(self):
            """The official LLMs' OpenAI client: ``client.chat.completions.create(...)`` answered by the
            run's backend, through the same batches."""
            return ChatClient(self)

    return ProjectLLM


class ChatClient:
    """``client.chat.completions.create(model=, messages=, temperature=, max_tokens=, stop=, n=)`` over a
    ProjectLLM, returning the openai package's ChatCompletion (other arguments are not supported: an
    error names them)."""

    def __init__(self, llm):
        self.llm = llm
        self.chat = self
        self.completions = self

    def create(self, *, messages, model=None, temperature=0.0, max_tokens=500, stop=None, n=1, **other):
        from openai.types.chat import ChatCompletion

        if other:
            raise TypeError(
                f"chat.completions.create: not supported by the project's backend: {sorted(other)}"
            )
        stops = [stop] if isinstance(stop, str) else stop
        n = int(n or 1)
        texts = self.llm(messages, model, temperature, max_tokens or 500, stops, n)
        texts = [texts] if n == 1 else texts
        return ChatCompletion.model_validate(
            {
                "id": "local",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model or self.llm.model,
                "choices": [
                    {"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": t}}
                    for i, t in enumerate(texts)
                ],
            }
        )


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
        self.agent_class = load_agent(config.agent)
        self.task_class = SimulationTask
        self.fallback = ReviewAgent(replace(config, kind="stats", selection="answer"), None, store, encoder)
        self.stars = self.fallback.stars  # its report is the run's star_model.json
        self.backend = load_llm(llm_config)
        self.batcher = Batcher(self.backend, config.seed)
        self.llm = project_llm_class()(self.batcher, llm_config.model)
        self.lock = threading.Lock()

    def workflow(self, task: dict, result: dict) -> None:
        """One task in its own thread: the official Simulator's steps; the outcome into ``result``."""
        with self.batcher.cond:  # a thread id can be reused: this task starts with no wait and no refusal
            self.batcher.queued[threading.get_ident()] = 0.0
            self.batcher.waiting_since.pop(threading.get_ident(), None)
            self.batcher.abandoned.discard(threading.get_ident())
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
        threads, started = [], {}
        for task, result in zip(tasks, results, strict=True):
            self.batcher.started()
            thread = threading.Thread(target=self.workflow, args=(task, result), daemon=True)
            thread.start()
            threads.append(thread)
            started[thread] = time.monotonic()
        # each task's own clock: from its start, less the time its LLM calls waited while the backend
        # served other tasks' calls; past agent_timeout_s it is abandoned (checked every 0.05 s)
        late = set()
        while alive := [k for k, t in enumerate(threads) if t.is_alive() and t not in late]:
            now = time.monotonic()
            for k in alive:
                queued = self.batcher.queued_now(threads[k].ident)
                if now - started[threads[k]] - queued > self.config.agent_timeout_s:
                    late.add(threads[k])
                    self.batcher.stopped(results[k], threads[k])  # abandoned: its calls are refused
            threads[alive[0]].join(0.05)
        with self.lock:  # abandoned workflows may still read the store
            fallbacks = self.fallback.predict(tasks)
        out = []
        with append_to(self.out / FAILURES) as failures:
            for task, result, thread, fallback in zip(tasks, results, threads, fallbacks, strict=True):
                if thread in late:
                    reason, detail = (
                        "agent_timeout",
                        f"no answer after {self.config.agent_timeout_s} s of its own",
                    )
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
    version = official_package()["version"]
    load_agent(target)  # a clear error, naming the make target, for a module the agent's imports miss
    return {**describe(target), "websocietysimulator": version}
