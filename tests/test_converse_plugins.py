"""A researcher's own CRS in the conversational simulator (agents/converse/plugins.py): a python class
named by import path, a FastAPI CRS on loopback speaking the HTTP JSON protocol, and an
OpenAI-compatible endpoint; every way a plug-in fails is counted, ends only its dialogue, and is
never rated."""

import argparse
import hashlib
import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from converse_fakes import Scripted
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse

from agents.converse.config import ConfigError, PluginConfig, load_config
from agents.converse.crs import Session, load_restaurants
from agents.converse.plugins import PluginCRS
from agents.converse.run import run

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def catalogue(raw):
    return load_restaurants(raw / "yelp_asc_sample" / "item_subset.json")


def args(raw, out, *extra):
    settings = [f"data={raw / 'recllmsim'}", f"catalogue={raw / 'yelp_asc_sample' / 'item_subset.json'}",
                "dialogues=10", "max_turns=3", *extra]  # fmt: skip
    return argparse.Namespace(config=None, out=str(out), set=settings, overwrite=False)


def serve(app: FastAPI):
    """A real uvicorn server on a free loopback port, in a thread; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, thread, f"http://127.0.0.1:{port}"


def test_a_python_plugin_by_import_path_runs_in_a_full_run_beside_a_built_in(raw, catalogue, tmp_path):
    plugin = tmp_path / "my_crs.py"
    shutil.copy(HERE / "crs_plugins.py", plugin)
    items = [r.id for r in catalogue[:3]]
    spec = json.dumps({"transport": "python", "target": f"{plugin}:FirstPlace", "options": {"items": items}})
    out = tmp_path / "run"
    summary = run(args(raw, out, "crs=[base, mine]", f"plugins={{mine: {spec}}}"), Scripted(), Scripted())
    assert summary["crs"]["mine"]["dialogues"] == summary["crs"]["base"]["dialogues"] == 10
    assert summary["plugins"]["mine"]["sha256"] == hashlib.sha256(plugin.read_bytes()).hexdigest()
    turns = [json.loads(line) for line in (out / "turns.jsonl").read_text().splitlines()]
    replies = [t["reply"] for t in turns if t["crs"] == "mine" and t["reply"]]
    assert len(replies) == 10 * 2  # every user turn answered but the closing third
    for reply in replies:  # the known id is kept as a recommendation, the unknown one refused
        assert len(reply["recommended"]) == 1 and reply["recommended"][0] in items
        assert reply["refused"] == ["no-such-place"] and reply["error"] is None
    assert summary["counts"]["crs_refused_items:mine"] == 20
    # the plug-in's words reached the simulated user, and the user rated them
    rated = [t for t in turns if t["crs"] == "mine" and t.get("rating")]
    assert rated and summary["crs"]["mine"]["rated_turns"] == len(rated)
    dialogues = [json.loads(line) for line in (out / "dialogues.jsonl").read_text().splitlines()]
    mine = [d for d in dialogues if d["crs"] == "mine"]
    assert all(d["transcript"][1][1].startswith("Try place ") for d in mine)
    assert all(d["recommended"] == items[:2] for d in mine)  # one per turn, in order
    # an edited plug-in is a new run: the resume refuses, naming the plug-in
    plugin.write_text(plugin.read_text() + "\n# tuned\n")
    with pytest.raises(SystemExit, match=r"crs\.mine\.sha256"):
        run(args(raw, out, "crs=[base, mine]", f"plugins={{mine: {spec}}}"), Scripted(), Scripted())


def test_a_plugin_sees_the_whole_dialogue_and_a_plain_string_is_a_reply(catalogue):
    spec = PluginConfig(transport="python", target=f"{HERE / 'crs_plugins.py'}:FirstPlace",
                        options={"items": [catalogue[0].id]})  # fmt: skip
    crs = PluginCRS("mine", spec, catalogue)
    session = Session()
    for said in ["one", "two", "three"]:
        crs.respond([session], [said])
    seen = crs.transport.instance.seen
    assert [len(d) for d in seen] == [1, 3, 5]  # everything so far, not a window
    assert [t["role"] for t in seen[-1]] == ["user", "assistant"] * 2 + ["user"]
    assert [t["content"] for t in seen[-1] if t["role"] == "user"] == ["one", "two", "three"]
    plain = PluginCRS(
        "plain", PluginConfig(transport="python", target=f"{HERE / 'crs_plugins.py'}:Plain"), []
    )
    reply = plain.respond([Session()], ["hi"])[0]
    assert reply.text == "Tell me more about what you like." and reply.recommended is None


def test_a_failing_python_plugin_is_counted_and_ends_only_its_dialogue():
    spec = PluginConfig(transport="python", target=f"{HERE / 'crs_plugins.py'}:Broken", timeout=1.0,
                        options={"hang": 3.0})  # fmt: skip
    crs = PluginCRS("broken", spec, [])
    started = time.monotonic()
    replies = crs.respond([Session() for _ in range(5)], ["raise", "hang", "shape", "blank", "ok"])
    assert time.monotonic() - started < 2.5  # the hung call was not waited for
    kinds = [r.error.split(":")[0] if r.error else None for r in replies]
    assert kinds == ["raised", "timeout", "bad_answer", "empty_reply", None] and crs.hung == 1
    assert "my model fell over" in replies[0].error and replies[4].text == "fine"
    assert "a key the protocol does not have" in replies[2].raw  # the reject kept as it came


def test_a_plugin_that_fails_in_a_run_is_counted_per_crs_and_never_rated(raw, tmp_path):
    target = f"{HERE / 'crs_plugins.py'}:FailsLater"
    out = tmp_path / "run"
    summary = run(args(raw, out, f"crs=['{target}']", "refinement.enabled=false"), Scripted(), Scripted())
    assert summary["crs"][target]["ended"] == {"crs_error": 10}
    assert summary["counts"][f"crs_errors:{target}:raised"] == 10
    turns = [json.loads(line) for line in (out / "turns.jsonl").read_text().splitlines()]
    assert len(turns) == 20  # two user turns per dialogue: the second one's reply failed
    second = [t for t in turns if t["turn"] == 2]
    assert all(t["reply"]["error"].startswith("raised") and "turn two" in t["reply"]["error"] for t in second)
    assert [t["ended"] for t in second] == ["crs_error"] * 10  # the turn's log says why the dialogue ended
    assert all(t["rating"] for t in second)  # the first reply was rated on turn two ...
    assert summary["crs"][target]["rated_turns"] == 10  # ... and the failed one never


def test_concurrency_one_calls_a_python_plugin_one_dialogue_at_a_time():
    spec = PluginConfig(transport="python", target=f"{HERE / 'crs_plugins.py'}:OneAtATime", concurrency=1)
    crs = PluginCRS("serial", spec, [])
    assert all(r.text == "ok" for r in crs.respond([Session() for _ in range(4)], ["hi"] * 4))
    assert crs.transport.instance.most == 1
    wide = PluginCRS("wide", PluginConfig(transport="python", target=spec.target, concurrency=4), [])
    wide.respond([Session() for _ in range(4)], ["hi"] * 4)
    assert wide.transport.instance.most > 1


def crs_app() -> FastAPI:
    app = FastAPI()
    state = {"flaky": 0}

    @app.post("/ok")
    async def ok(request: Request):
        body = await request.json()
        return {"reply": f"You said {len(body['dialogue'])} turns so far.", "items": ["b1"]}

    @app.post("/slow")
    async def slow(request: Request):
        import asyncio

        await asyncio.sleep(2.0)
        return {"reply": "late"}

    @app.post("/flaky")
    async def flaky(request: Request):
        state["flaky"] += 1
        if state["flaky"] % 2:
            return PlainTextResponse("overloaded", status_code=503)
        return {"reply": "second try"}

    @app.post("/down")
    async def down(request: Request):
        return PlainTextResponse("broken for good", status_code=500)

    @app.post("/html")
    async def html(request: Request):
        return PlainTextResponse("<html>not json</html>")

    @app.post("/empty")
    async def empty(request: Request):
        return {"reply": ""}

    return app


@pytest.fixture(scope="module")
def http_crs():
    server, thread, url = serve(crs_app())
    yield url
    server.should_exit = True
    thread.join(5)


@pytest.mark.slow
def test_an_http_crs_on_loopback_answers_retries_and_fails_clearly(http_crs, catalogue):
    def crs(path, **settings):
        return PluginCRS("http", PluginConfig(transport="http", target=f"{http_crs}{path}", **settings),
                         catalogue)  # fmt: skip

    reply = crs("/ok").respond([Session()], ["hi"])[0]
    assert reply.text == "You said 1 turns so far." and reply.recommended == [] and reply.refused == ["b1"]
    assert crs("/flaky", retries=1).respond([Session()], ["hi"])[0].text == "second try"  # 503, then ok
    failures = {
        "/slow": ("timeout", {"timeout": 0.5, "retries": 1}),
        "/down": ("server_error", {"retries": 2}),
        "/html": ("not_json", {}),
        "/empty": ("bad_answer", {}),  # reply must be at least one character
        "/missing": ("http_status", {}),  # 404
    }
    for path, (kind, settings) in failures.items():
        reply = crs(path, **settings).respond([Session()], ["hi"])[0]
        assert reply.error and reply.error.startswith(kind), (path, reply.error)
    assert crs("/html").respond([Session()], ["hi"])[0].raw == "<html>not json</html>"
    refused = PluginCRS("x", PluginConfig(transport="http", target="http://127.0.0.1:9/none", retries=0), [])
    assert refused.respond([Session()], ["hi"])[0].error.startswith("connection")


def test_an_http_crs_takes_part_in_a_run(raw, http_crs, tmp_path):
    spec = json.dumps({"transport": "http", "target": f"{http_crs}/ok"})
    summary = run(
        args(raw, tmp_path / "run", "crs=[web]", f"plugins={{web: {spec}}}"), Scripted(), Scripted()
    )
    assert summary["crs"]["web"]["dialogues"] == 10 and summary["crs"]["web"]["ended"] == {"max_turns": 10}
    assert summary["counts"]["crs_refused_items:web"] == 20  # b1 is no Yelp restaurant of the catalogue


def test_the_openai_transport_sends_the_whole_dialogue_after_the_researchers_system_prompt(tmp_path):
    app, seen = FastAPI(), []

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        seen.append(body)
        return {
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Noted."}}],
        }  # fmt: skip

    server, thread, url = serve(app)
    try:
        spec = PluginConfig(
            transport="openai", target=f"{url}/v1", model="mine", system_prompt="You are MyCRS."
        )
        crs, session = PluginCRS("gpt", spec, []), Session()
        for said in ["one", "two"]:
            reply = crs.respond([session], [said])[0]
    finally:
        server.should_exit = True
        thread.join(5)
    assert reply.text == "Noted." and reply.recommended is None
    last = seen[-1]
    assert last["messages"][0] == {"role": "system", "content": "You are MyCRS."}
    assert [m["content"] for m in last["messages"][1:]] == ["one", "Noted.", "two"]
    assert "max_tokens" not in last and "max_completion_tokens" not in last  # only the window bounds it


def test_plugin_settings_are_checked():
    with pytest.raises(ConfigError, match="crs"):
        load_config(None, ["crs=[nobody]"])
    with pytest.raises(ConfigError, match="transport"):
        load_config(None, ["crs=[x]", "plugins={x: {transport: grpc, target: a}}"])
    with pytest.raises(ConfigError, match="built-in"):
        load_config(None, ["plugins={base: {transport: http, target: 'http://a'}}"])
    with pytest.raises(ConfigError, match="model"):
        load_config(None, ["crs=[x]", "plugins={x: {transport: openai, target: 'http://a/v1'}}"])
    with pytest.raises(ConfigError, match="URL"):
        load_config(None, ["crs=[x]", "plugins={x: {transport: http, target: 'localhost:8000'}}"])
    with pytest.raises(ConfigError, match="options"):
        load_config(None, ["crs=[x]", "plugins={x: {transport: http, target: 'http://a', options: {k: 1}}}"])
    config = load_config(None, ["crs=[base, 'my_pkg.crs:Mine']"])
    assert config.plugins["my_pkg.crs:Mine"].transport == "python"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """The offline SmolLM2 GGUF served by llama-cpp-python's own OpenAI-compatible server (a process of
    code nobody here wrote). CI installs it (.ci/run); elsewhere the test says how."""
    pytest.importorskip(
        "llama_cpp.server",
        reason='llama-cpp-python[server] is not installed (pip install "llama-cpp-python[server]==0.3.6"; .ci/run does)',
    )
    import subprocess
    import sys

    import httpx

    from data_prep.offline_models import _smollm2_gguf

    folder, name = _smollm2_gguf()
    port = free_port()
    # its log goes to a file: a pipe nobody reads fills up and stops the server mid-load
    log = tmp_path_factory.mktemp("llama") / "server.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "llama_cpp.server", "--model", str(folder / name), "--host", "127.0.0.1",
         "--port", str(port), "--model_alias", "smollm2", "--n_ctx", "2048"],
        stdout=open(log, "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1"
    try:
        for _ in range(240):
            if process.poll() is not None:
                pytest.fail(f"llama_cpp.server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"llama_cpp.server did not answer in 120 s: {log.read_text()[-2000:]}")
        yield url
    finally:
        process.terminate()
        process.wait(10)


def test_the_openai_transport_against_a_real_llama_cpp_server(llama_server):
    spec = PluginConfig(transport="openai", target=llama_server, model="smollm2", timeout=120,
                        system_prompt="You are a restaurant recommender. Answer in one sentence.")  # fmt: skip
    crs, session = PluginCRS("served", spec, []), Session()
    for said in ["I want sushi in Tampa.", "Something cheaper, please."]:
        reply = crs.respond([session], [said])[0]
        assert reply.error is None and reply.text.strip() and reply.recommended is None
    assert [r for r, _ in session.dialogue] == ["user", "assistant"] * 2
    capped = PluginCRS("capped", PluginConfig(transport="openai", target=llama_server, model="smollm2",
                                              max_tokens=3, timeout=120), [])  # fmt: skip
    cut = capped.respond([Session()], ["Tell me a long story about restaurants."])[0]
    assert cut.cut_short and cut.error is None  # kept, and marked: the run counts it
    wrong = PluginCRS("down", PluginConfig(transport="openai", target=llama_server.replace("/v1", "/nope"),
                                           model="smollm2", retries=0), [])  # fmt: skip
    assert wrong.respond([Session()], ["hi"])[0].error.startswith("http_status")


@pytest.mark.slow
def test_the_example_http_crs_stands_in_the_ladder(raw, tmp_path):
    from agents.converse.http_example import make_app
    from eval.converse import evaluate

    server, thread, url = serve(make_app(str(raw / "yelp_asc_sample" / "item_subset.json")))
    try:
        spec = json.dumps({"transport": "http", "target": f"{url}/respond"})
        out = tmp_path / "run"
        extra = ["personas=goals", "user_text=template", "max_turns=5", "crs=[random, web, oracle]"]
        summary = run(args(raw, out, *extra, f"plugins={{web: {spec}}}"), Scripted(), Scripted())
    finally:
        server.should_exit = True
        thread.join(5)
    assert summary["counts"].get("crs_refused_items:web", 0) == 0 and not any(
        k.startswith("crs_errors") for k in summary["counts"]
    )
    goals = evaluate(out, raw / "recllmsim", tmp_path / "eval")["goals"]["per_crs"]
    assert goals["oracle"]["success"]["mean"] == 1.0 and goals["web"]["success"]["dialogues"] == 10
    assert (
        goals["web"]["objective_fit"]["mean"] > goals["random"]["objective_fit"]["mean"]
    )  # BM25 finds the slots
    dialogues = [json.loads(line) for line in (out / "dialogues.jsonl").read_text().splitlines()]
    web = [d for d in dialogues if d["crs"] == "web"]
    assert all(len(set(d["recommended"])) == len(d["recommended"]) for d in web)  # never the same place twice
