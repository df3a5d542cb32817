"""A web page to watch and steer a sandbox run: FastAPI + uvicorn, one page of plain HTML, CSS and
JavaScript (agents/sandbox/web/; charts and the graph drawn as SVG by the page itself, no library).

    python -m agents.sandbox.serve --run runs/sandbox/demo --config configs/sandbox/movielens.yaml
    python -m agents.sandbox.serve --run runs/sandbox/demo --read-only      # a finished run, or one the CLI runs
    SANDBOX_TOKEN=... python -m agents.sandbox.serve --run RUN_DIR --config ... --host 0.0.0.0 --port 8000

then open http://127.0.0.1:8000 (with a token: http://HOST:8000/#token=...; the token stays in the
page, never in a URL the server sees or logs).

The server owns the run folder like the CLI does (the same lock: a CLI run on the folder is refused,
and refuses it), builds or resumes the world through the runner's ``open_world`` and plays rounds
through ``play_round``, so a run steered from the page resumes from the terminal and the other way
round. Controls: start (play the remaining rounds), pause (after the current round), step (one
round); edit a profile, broadcast a message, interview an agent (the runner's intervention functions:
each change is logged in interventions.jsonl and written to the checkpoint); take over one agent (its
decisions wait for the person on the page). ``--read-only`` opens a run without the lock and without
a model, from its files, and follows a run the CLI is writing.

Safety: bound to 127.0.0.1 unless ``--host`` says otherwise. Every API call carries a token, on every
host (other users of a shared login node reach its 127.0.0.1 too): ``SANDBOX_TOKEN`` from the
environment, or one made at start and printed once in the page's address; it is never logged, and
uvicorn's access log is off. ``--no-token`` turns it off for a single-user laptop (refused with a
non-local host). The Host header must name this server (the local names, the bound address, a wildcard
address's machine names, ``--allowed-host``): a page elsewhere cannot rebind its own name to this port. Input is validated (unknown agent: 404; a bad field or value, or text
over 1,000 characters: 4xx, nothing changed); the page shows text as text, never as HTML.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Literal

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, Field

from agents.runs import Lock, read_jsonl, write_json
from agents.sandbox.run import (
    EDITABLE,
    MAX_TEXT,
    InterventionError,
    add_broadcast,
    edit_profile,
    finish,
    interview,
    log_intervention,
    open_world,
    play_round,
    resolve_config,
)
from data_prep import movielens
from data_prep.movielens import day

WEB = Path(__file__).parent / "web"
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


class WebHuman:
    """One agent played from the page: a decision waits (up to ``timeout`` seconds) for the person's
    answer; no answer in time is an empty answer (the world's counted fallback)."""

    def __init__(self, timeout: float = 600.0):
        self.name: str | None = None
        self.timeout = timeout
        self.pending: dict | None = None
        self._answer: str | None = None
        self._ready = threading.Event()

    def plays(self, name: str) -> bool:
        return name == self.name

    def answer(self, kind: str, prompt: list[dict], constraint) -> str:
        options = list(constraint.options) if constraint.kind == "choice" else None
        keys = list(json.loads(constraint.schema)["properties"]) if constraint.kind == "json" else None
        self._ready.clear()
        self.pending = {
            "agent": self.name,
            "kind": kind,
            "prompt": prompt[-1]["content"],
            "options": options,
            "keys": keys,
        }
        answered = self._ready.wait(self.timeout)
        self.pending = None
        return self._answer if answered else ""

    def give(self, answer: str) -> None:
        if self.pending is None:
            raise InterventionError("no decision is waiting for an answer")
        self._answer = answer
        self._ready.set()


class Runner:
    """The world, played round by round in a background thread; interventions happen between rounds
    (``self.lock``)."""

    def __init__(self, out: Path, config, world, human: WebHuman):
        self.out, self.config, self.world, self.human = out, config, world, human
        self.lock = threading.Lock()
        self.playing = False  # keep playing rounds
        self.steps = 0  # single rounds asked for
        self.busy = False
        self.error: str | None = None
        self.wake = threading.Event()
        self.closed = False
        self.snapshot = world.state()  # what the page reads: the state between rounds
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.closed:
            self.wake.wait(0.5)
            self.wake.clear()
            while (self.playing or self.steps) and not self.closed:
                if self.world.round >= self.config.rounds:
                    self.playing, self.steps = False, 0
                    break
                with self.lock:
                    self.busy = True
                    try:
                        play_round(self.out, self.world)
                        self.snapshot = self.world.state()
                        if self.world.round >= self.config.rounds:
                            finish(self.out, self.world, self.config)  # stats.png and summary.json
                    except Exception as err:  # shown on the page, the run paused
                        self.error, self.playing, self.steps = f"{type(err).__name__}: {err}", False, 0
                    finally:
                        self.busy = False
                self.steps = max(0, self.steps - 1)

    def control(self, action: str) -> None:
        """start / resume: play the remaining rounds; pause: stop after the current round; step: one
        more round."""
        if action == "pause":
            self.playing, self.steps = False, 0
        else:
            self.error = None
            if action == "step":
                self.steps += 1
            else:
                self.playing = True
        self.wake.set()

    def state(self) -> dict:
        return self.snapshot

    def intervene(self, change) -> dict:
        """A change to the world's state between rounds, through the runner's functions; logged and
        checkpointed."""
        with self.lock:
            state = self.world.state()
            record = change(state)
            self.world.restore(state)
            self.snapshot = self.world.state()
            write_json(self.out / "checkpoint.json", state)
            log_intervention(self.out, record)
        return record

    def ask(self, agent: str, question: str) -> dict:
        with self.lock:
            record = interview(self.world, agent, question)
            log_intervention(self.out, record)
        return record


class Edit(BaseModel):
    field: Literal[EDITABLE]  # type: ignore[valid-type]
    value: str = Field(min_length=1, max_length=MAX_TEXT)


class Message(BaseModel):
    message: str = Field(min_length=1, max_length=MAX_TEXT)


class Question(BaseModel):
    agent: str = Field(min_length=1, max_length=200)
    question: str = Field(min_length=1, max_length=MAX_TEXT)


class Control(BaseModel):
    action: Literal["start", "pause", "resume", "step"]


class Takeover(BaseModel):
    agent: str | None = Field(None, max_length=200)  # None: hand the agent back to the model


class Answer(BaseModel):
    answer: str = Field(max_length=MAX_TEXT)


def host_name(header: str) -> str:
    """The name in a Host header, without its port (``[::1]:8000`` -> ``[::1]``)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header.split("]")[0] + "]"
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def allowed_hosts(host: str, extra: list[str] = ()) -> set[str]:
    """The names a page bound to ``host`` may be reached by: the local names, the bound address (for a
    wildcard, this machine's names) and any given. Another Host header is refused (DNS rebinding: a web
    page elsewhere that points its own name at this address)."""
    import contextlib
    import socket

    names = {"127.0.0.1", "localhost", "[::1]", *(n.lower() for n in extra)}
    if host in ("0.0.0.0", "::"):
        hostname = socket.gethostname()
        names |= {hostname.lower(), socket.getfqdn().lower()}
        with contextlib.suppress(OSError):  # the machine's own addresses, as a browser types them
            names |= set(socket.gethostbyname_ex(hostname)[2])
    elif host not in LOCAL_HOSTS:
        names.add(f"[{host}]" if ":" in host else host.lower())
    return names


def create_app(
    out: Path, runner: Runner | None, token: str | None = None, hosts: set[str] | None = None
) -> FastAPI:
    """The app for a run folder; ``runner`` None is read-only (everything from the files). ``token``: every
    API call must carry it; ``hosts``: the Host names requests may name (None: not checked)."""
    app = FastAPI(title="usersim sandbox", docs_url=None, redoc_url=None)

    if hosts is not None:

        @app.middleware("http")
        async def check_host(request: Request, call_next):
            if host_name(request.headers.get("host", "")) not in hosts:
                from fastapi.responses import PlainTextResponse

                return PlainTextResponse("this page is not served under that host name", status_code=400)
            return await call_next(request)

    def authorised(request: Request) -> None:
        if token is None:
            return
        given = request.headers.get("authorization", "").removeprefix("Bearer ")
        if not secrets.compare_digest(given, token):
            raise HTTPException(401, "a token is required (open the page as /#token=...)")

    def owner() -> Runner:
        if runner is None:
            raise HTTPException(409, "read-only: this server does not own the run")
        return runner

    def state() -> dict:
        if runner is not None:
            return runner.state()
        path = out / "checkpoint.json"
        if not path.exists():
            raise HTTPException(404, "the run has no checkpoint yet")
        return json.loads(path.read_text())

    def agent_entry(name: str) -> dict:
        for entry in state()["agents"]:
            if entry["profile"]["name"] == name:
                return entry
        raise HTTPException(404, f"no agent {name!r}")

    api = Depends(authorised)
    titles: dict[int, str] = {}

    def title(movie: int) -> str | None:
        """A movie's title (from the run's data, read once)."""
        if not titles and (out / "config.json").exists():
            data = Path(json.loads((out / "config.json").read_text())["data"])
            if (data / "movies.csv").exists():
                titles.update({m.id: m.title for m in movielens.load_movies(data).values()})
        return titles.get(movie)

    def titled(row: dict) -> dict:
        """An interaction with its movie's title."""
        return row if row.get("item") is None else {**row, "title": title(row["item"])}

    @app.get("/")
    def page():
        return FileResponse(WEB / "index.html")

    @app.get("/api/status", dependencies=[api])
    def status():
        rounds = (
            json.loads((out / "config.json").read_text())["rounds"]
            if (out / "config.json").exists()
            else None
        )
        current = state()["round"] if runner is not None or (out / "checkpoint.json").exists() else 0
        return {
            "run": str(out),
            "round": current,
            "rounds": runner.config.rounds if runner else rounds,
            "read_only": runner is None,
            "playing": bool(runner and runner.playing),
            "busy": bool(runner and runner.busy),
            "error": runner.error if runner else None,
            "human": runner.human.name if runner else None,
            "pending": runner.human.pending if runner else None,
        }

    @app.get("/api/agents", dependencies=[api])
    def agents(q: str = "", feature: str = ""):
        rows = []
        for entry in state()["agents"]:
            p = entry["profile"]
            text = " ".join(
                [p["name"], p.get("traits", ""), p.get("career", ""), *p.get("interests", [])]
            ).lower()
            if q.lower() not in text or (feature and feature not in p.get("features", [])):
                continue
            rows.append({"name": p["name"], "id": p["id"], "interests": p["interests"], "features": p["features"],
                         "activity": round(entry["activity"], 3), "history": len(p.get("history", [])),
                         "watched": len(entry["rated"])})  # fmt: skip
        return rows

    @app.get("/api/agents/{name}", dependencies=[api])
    def agent(name: str):
        entry = agent_entry(name)
        memory = entry["memory"]

        def strip(records: list[dict]) -> list[dict]:
            return [{k: r[k] for k in ("text", "importance", "created", "kind", "enhanced")} for r in records]

        events = [
            e
            for e in read_jsonl(out / "interactions.jsonl")
            if e.get("agent") == name or e.get("partner") == name
        ]
        profile = {k: v for k, v in entry["profile"].items() if k != "history"}
        real = entry["profile"].get("history", [])
        start = entry["profile"].get("start")
        long = sorted(memory["long"], key=lambda r: -r["created"])  # the newest first
        return {
            "profile": profile,
            "real_history": {  # the user's ratings before the start, the newest first
                "ratings": len(real),
                "before": day(start) if start else None,
                "last": [{"title": title(m), "stars": s, "date": day(t)} for m, s, t in real[-20:][::-1]],
            },
            "simulated_watches": entry["rated"],
            "memory": {
                "short_term": strip(memory["short"][::-1]),
                "long_term": strip([r for r in long if r["kind"] in ("observation", "history")][:50]),
                "insights": strip([r for r in long if r["kind"] in ("insight", "reflection")]),
                "started_with": memory["counts"].get("seeded", 0),
                "long_term_records": len(memory["long"]),
            },
            "history": [titled(e) for e in events[-50:]],
        }

    @app.get("/api/graph", dependencies=[api])
    def graph():
        links = state()["graph"]
        edges = sorted({tuple(sorted((a, b))) for a, others in links.items() for b in others})
        return {"nodes": sorted(links), "edges": edges}

    @app.get("/api/stats", dependencies=[api])
    def stats():
        return read_jsonl(out / "stats.jsonl")

    @app.get("/api/log", dependencies=[api])
    def log(after: int = Query(0, ge=0), limit: int = Query(200, ge=1, le=1000)):
        rows = read_jsonl(out / "interactions.jsonl")
        return {"total": len(rows), "rows": [titled(r) for r in rows[after : after + limit]]}

    @app.get("/api/events", dependencies=[api])
    async def events(after: int = 0):
        """Server-sent events: every new interaction line, and the status every second."""

        async def stream():
            seen = after
            while True:
                rows = read_jsonl(out / "interactions.jsonl")
                for row in rows[seen:]:
                    yield f"event: interaction\ndata: {json.dumps(titled(row))}\n\n"
                seen = len(rows)
                yield f"event: status\ndata: {json.dumps(status())}\n\n"
                await asyncio.sleep(1.0)

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/api/control", dependencies=[api])
    def control(body: Control):
        owner().control(body.action)
        return status()

    def change(apply):
        try:
            return owner().intervene(apply)
        except InterventionError as err:
            raise HTTPException(422, f"{err}; nothing changed") from None

    @app.post("/api/agents/{name}/profile", dependencies=[api])
    def edit(name: str, body: Edit):
        agent_entry(name)  # 404 first
        return change(lambda s: edit_profile(s, name, body.field, body.value))

    @app.post("/api/broadcast", dependencies=[api])
    def broadcast(body: Message):
        return change(lambda s: add_broadcast(s, body.message))

    @app.post("/api/interview", dependencies=[api])
    def ask(body: Question):
        agent_entry(body.agent)
        try:
            return owner().ask(body.agent, body.question)
        except InterventionError as err:
            raise HTTPException(422, str(err)) from None

    @app.post("/api/human", dependencies=[api])
    def takeover(body: Takeover):
        run = owner()
        if body.agent is not None:
            agent_entry(body.agent)
        run.human.name = body.agent
        log_intervention(out, {"round": run.world.round, "command": "human", "agent": body.agent})
        return {"human": body.agent}

    @app.post("/api/human/answer", dependencies=[api])
    def answer(body: Answer):
        try:
            owner().human.give(body.answer)
        except InterventionError as err:
            raise HTTPException(409, str(err)) from None
        return {"ok": True}

    app.mount("/static", StaticFiles(directory=WEB), name="static")
    return app


def serve_app(args, backend=None, embed=None) -> tuple[FastAPI, Runner | None, Lock | None]:
    """The app for the command line's arguments: the run's world (holding its lock) or read-only."""
    out = Path(args.run)
    if args.read_only:
        if not out.exists():
            raise SystemExit(f"error: {out} does not exist")
        return create_app(out, None, args.token, getattr(args, "hosts", None)), None, None
    if not args.config and not (out / "config.json").exists():
        raise SystemExit("error: --config is needed to start a new run")
    args.config = args.config or str(out / "config.json")
    config = resolve_config(args)
    out.mkdir(parents=True, exist_ok=True)
    lock = Lock(out).__enter__()  # held for the server's life; the kernel releases it on exit
    human = WebHuman()
    world = open_world(config, out, args.overwrite, backend, embed, human)
    runner = Runner(out, config, world, human)
    return create_app(out, runner, args.token, getattr(args, "hosts", None)), runner, lock


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(
        prog="python -m agents.sandbox.serve", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--run", required=True, help="the run folder (created when new)")
    parser.add_argument(
        "--config", help="the sandbox config (a new run; a resumed one reads RUN/config.json)"
    )
    parser.add_argument(
        "--set", nargs="*", action="extend", help="section.field=value overrides of the config"
    )
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--read-only", action="store_true", help="open a finished run or follow a CLI run")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--no-token",
        action="store_true",
        help="no token: a single-user laptop (refused with a non-local --host)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        help="another name the page is reached by (Host is checked)",
    )
    args = parser.parse_args(argv)
    args.hosts = allowed_hosts(args.host, args.allowed_host)
    made = False
    if args.no_token:
        if args.host not in LOCAL_HOSTS:
            raise SystemExit(f"error: --no-token is for a page on this machine alone, not --host {args.host}")
        args.token = None
    else:  # other users of a shared machine reach 127.0.0.1 too: a token always, unless --no-token
        args.token = os.environ.get("SANDBOX_TOKEN")
        if not args.token:
            args.token, made = secrets.token_urlsafe(24), True
    app, _, _ = serve_app(args)
    shown = args.token if made else "(SANDBOX_TOKEN)"  # a made token is shown once, here; never logged
    import socket

    where = socket.getfqdn() if args.host in ("0.0.0.0", "::") else args.host  # a name the Host check allows
    print(f"the sandbox page: http://{where}:{args.port}/" + (f"#token={shown}" if args.token else ""))
    uvicorn.run(app, host=args.host, port=args.port, access_log=False, log_level="warning")


if __name__ == "__main__":
    main()
