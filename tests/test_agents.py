import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from agents import agent as agent_module
from agents import simulate, suite
from agents.agent import KINDS, AgentConfig, ReviewAgent
from agents.llm import LLMConfig, OpenAIBackend, Sampling, load_llm, vllm_lora_rank
from agents.stars import StarModel, Tables, candidates, split_visible
from data_prep.store import ReviewStore, to_epoch
from data_prep.tasks import read_targets, read_tasks


@pytest.fixture(scope="module")
def yelp_tasks(yelp_store, tmp_path_factory, make_tasks):
    return make_tasks(yelp_store, tmp_path_factory.mktemp("agent_tasks"), n=20, seed=1)


def tasks_with_dates(task_dir):
    targets = read_targets(task_dir)
    return [{**t, "date": targets[t["task_id"]]["date"]} for t in read_tasks(task_dir)]


# -- the OpenAI-compatible backend against a real HTTP server on loopback ------------------------------


class Scripted(BaseHTTPRequestHandler):
    script: list[str] = []  # per request: "429", "500", "slow" or "ok"
    seen: list[str] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Scripted.seen.append(self.headers.get("Authorization", ""))
        action = Scripted.script.pop(0) if Scripted.script else "ok"  # or "long": cut at max_tokens
        if action == "slow":
            time.sleep(1.5)
        if action in ("429", "500"):
            self.send_response(int(action))
            self.send_header("Content-Type", "application/json")
            self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "try later"}}')
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
                        "content": "stars: 4\nreview: " + body["messages"][-1]["content"],
                    },
                }
            ],
        }
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    Scripted.seen = []
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
    assert backend.generate([[{"role": "user", "content": "a"}]], Sampling()) == ["stars: 4\nreview: a"]
    assert len(Scripted.seen) == 3 and Scripted.seen[0] == "Bearer sk-test-secret"
    Scripted.script = ["slow", "ok"]  # the first answer comes after the 0.5 s timeout: retried
    conversations = [[{"role": "user", "content": str(i)}] for i in range(3)]
    assert backend.generate(conversations, Sampling()) == [f"stars: 4\nreview: {i}" for i in range(3)]
    assert "sk-test-secret" not in json.dumps(backend.info)
    Scripted.script = ["long"]  # an answer that stopped at max_tokens is flagged
    backend.generate([[{"role": "user", "content": "x"}]], Sampling())
    assert backend.cut_short == [True]
    backend.generate([[{"role": "user", "content": "x"}]], Sampling())
    assert backend.cut_short == [False]


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

    def generate(self, conversations, sampling):
        self.calls.append(conversations)
        self.cut_short = [False] * len(conversations)  # as every backend reports
        return self.first if len(self.calls) == 1 else self.retry[: len(conversations)]


def test_context_never_shows_a_target_or_a_later_review(yelp_store, yelp_tasks):
    store = ReviewStore.open(yelp_store, tasks=yelp_tasks)
    agent = ReviewAgent(AgentConfig(kind="stats", retrieval="bm25", k_user=50, k_item=50), None, store)
    targets = {row["review_id"] for row in read_targets(yelp_tasks).values()}
    for task in tasks_with_dates(yelp_tasks):
        ctx = agent.context(task)
        shown = ctx["history"] + ctx["item_pool"] + ctx["item_reviews"] + ctx["user_reviews"]
        assert not {r["review_id"] for r in shown} & targets
        assert all(r["date"] < task["date"] for r in shown)
        assert not any(r["user_id"] == task["user_id"] and r["item_id"] == task["item_id"] for r in shown)


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
    assert [p.cut_short for p in predictions] == [False] * 4 and agent.counts["cut_short"] == 0
    unusable = [[], ["I think it is good."], ["stars: nine\nreview: ", "still nothing"], []]
    assert [p.unusable for p in predictions] == unusable  # kept with their task, not lost
    assert agent.counts == {
        "llm_answers": 4,
        "parse_failures": 2,
        "retries": 2,
        "retry_successes": 1,
        "fallbacks": 1,
        "cut_short": 0,
    }
    assert "exactly two lines" in fake.calls[1][0][-1]["content"]  # the stricter instruction


def test_answers_cut_at_max_new_tokens_are_flagged_and_counted(yelp_store, yelp_tasks, monkeypatch):
    class Cut(ConstantLLM):
        def generate(self, conversations, sampling):
            self.cut_short = [True, False][: len(conversations)]
            return ["stars: 4\nreview: It was good but the", "stars: 2\nreview: Bad."][: len(conversations)]

    monkeypatch.setattr(agent_module, "load_llm", lambda config: Cut())
    agent = ReviewAgent(
        AgentConfig(kind="retrieval-llm", retrieval="bm25"),
        LLMConfig(),
        ReviewStore.open(yelp_store, tasks=yelp_tasks),
    )
    predictions = agent.predict(tasks_with_dates(yelp_tasks)[:2])
    assert [p.cut_short for p in predictions] == [True, False] and agent.counts["cut_short"] == 1


def test_star_model_reports_every_candidate_and_beats_the_user_mean(yelp_store, yelp_tasks):
    store = ReviewStore.open(yelp_store, tasks=yelp_tasks)
    agent = ReviewAgent(AgentConfig(kind="stats", retrieval="bm25"), None, store)
    report = agent.stars.report
    scores = report["candidates_pe"]
    assert report["chosen"] == max(scores, key=scores.get) and len(scores) >= 10
    assert scores[report["chosen"]] >= scores["user_mean_shrink0"]


def test_star_tables_match_hand_computed_values():
    # an additive grid: stars = 3 + b_user + b_item with b_user = (-1, 0, 1), b_item = (0.5, -0.5)
    ratings = [
        (f"r{u}{i}", f"u{u}", f"i{i}", 10 * u + i, 3 + bu + bi)
        for u, bu in enumerate((-1, 0, 1))
        for i, bi in enumerate((0.5, -0.5))
    ]
    tables = Tables(ratings, lambdas=(0.0,))
    model = candidates(tables)
    u, i = tables.indices(["u0", "u2", "new"], ["i1", "i0", "i0"])
    assert model["bias_lambda0"](u, i) == pytest.approx([1.5, 4.5, 3.5])  # exact: the data is additive
    assert model["user_mean_shrink0"](u, i) == pytest.approx([2.0, 4.0, 3.0])  # unseen user: the mean
    assert model["user_mean_shrink10"](u, i)[0] == pytest.approx((4.0 + 10 * 3.0) / 12)
    assert model["user_median"](u, i)[0] == 2.0 and model["global_mean_rounded"](u, i).tolist() == [3, 3, 3]
    train, validation = split_visible([*ratings, ("solo", "u9", "i0", 0, 5.0)])
    assert [r[0] for r in validation] == ["r01", "r11", "r21"]  # each user's latest; u9 has one review
    assert len(train) == 4 and ("solo", "u9", "i0", 0, 5.0) in train


def test_star_model_blends_with_llm_stars_only_when_validation_says_so(yelp_store, yelp_tasks):
    visible = ReviewStore.open(yelp_store, tasks=yelp_tasks).visible_ratings()
    validation = StarModel().fit(visible).validation
    oracle = {r[0]: r[4] for r in validation[::2]}  # an LLM that knows half the answers
    model = StarModel().fit(visible, llm_validation=oracle)
    scores = model.report["candidates_pe"]
    assert model.name.startswith("blend_0_") and scores[model.name] == 1.0
    assert model.blend_weight == 0.0 and model.report["llm_validation_stars"] == len(oracle)
    assert model.predict("any user", "any item", llm_stars=2.0) == 2.0
    liar = {r[0]: 6 - r[4] for r in validation}  # always wrong: no blend
    model = StarModel().fit(visible, llm_validation=liar)
    assert model.blend_weight is None and not model.name.startswith("blend")
    assert model.predict("u", "i", llm_stars=1.0) == model.predict("u", "i")


class ConstantLLM:
    def __init__(self):
        self.calls = []

    def generate(self, conversations, sampling):
        self.calls.append(conversations)
        self.cut_short = [False] * len(conversations)
        return ["stars: 5\nreview: Fine." for _ in conversations]


def test_tuned_agent_asks_the_llm_for_validation_stars_to_fit_the_blend(yelp_store, yelp_tasks, monkeypatch):
    fake = ConstantLLM()
    monkeypatch.setattr(agent_module, "load_llm", lambda config: fake)
    store = ReviewStore.open(yelp_store, tasks=yelp_tasks)
    config = AgentConfig(kind="tuned", retrieval="bm25", blend_validation=10, batch_size=4)
    agent = ReviewAgent(config, LLMConfig(), store)
    report = agent.stars.report
    assert report["llm_validation_asked"] == 10 and report["llm_validation_stars"] == 10
    assert any(name.startswith("blend_0.5_") for name in report["candidates_pe"])
    assert [len(c) for c in fake.calls] == [4, 4, 2] and agent.counts["llm_answers"] == 0
    asked = random.Random(config.seed).sample(agent.stars.validation, 10)  # the agent's sample
    targets = {row["review_id"] for row in read_targets(yelp_tasks).values()}
    assert not {r[0] for r in asked} & targets  # carved from visible reviews, never the tasks
    conversations = [c for call in fake.calls for c in call]
    shown = 0
    for (review_id, user, item, ts, _), conversation in zip(asked, conversations, strict=True):
        # each validation review is asked like a task: older reviews are shown, never its own text
        prompt = conversation[-1]["content"]
        assert store.get_reviews(review_id=review_id)[0]["text"].strip()[:80] not in prompt
        ctx = agent.context({"task_id": 0, "user_id": user, "item_id": item, "date": ts})
        assert all(to_epoch(r["date"]) < ts for r in ctx["user_reviews"])
        shown += sum(r["text"].strip()[:80] in prompt for r in ctx["user_reviews"])
    assert shown >= 10


# -- the runner ----------------------------------------------------------------------------------------


def test_a_killed_run_resumes_without_duplicates(yelp_store, yelp_tasks, tmp_path):
    config = tmp_path / "stats.yaml"
    config.write_text("kind: stats\nretrieval: bm25\nbatch_size: 4\n")
    base = [
        "--config",
        str(config),
        "--data",
        str(yelp_store),
        "--tasks",
        str(yelp_tasks),
        "--out",
        str(tmp_path / "run"),
    ]
    simulate.main([*base, "--limit", "8"])
    path = tmp_path / "run" / "predictions.jsonl"
    with open(path, "a") as f:  # killed in the middle of writing a line
        f.write('{"task_id": 9, "stars": 4')
    summary = simulate.main(base)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    ids = [r["task_id"] for r in rows]
    assert sorted(ids) == list(range(20)) and len(ids) == len(set(ids))
    assert summary["ran_now"] == 12 and summary["predicted"] == 20 and summary["errors"] == 0
    official = json.loads((tmp_path / "run" / "output.json").read_text())
    assert len(official) == 20 and all(o["output"]["review"] for o in official)


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
    simulate.main(["--out", str(tmp_path / "some"), "--tasks", str(yelp_tasks), "--merge", *shards[:2]])
    some = json.loads((tmp_path / "some" / "summary.json").read_text())
    assert some["missing"] == [t for t in range(20) if t % 3 == 2]  # reported, not hidden
    with pytest.raises(SystemExit, match="two shards"):
        simulate.main(["--out", str(tmp_path / "twice"), "--merge", shards[0], shards[0]])


def test_simulate_slurm_dry_run_prints_shard_and_merge():
    import subprocess

    script = ["bash", "slurm/simulate.sbatch", "--dry-run", "configs/agents/tuned_qwen7b_vllm.yaml", "d", "t"]
    result = subprocess.run(script, capture_output=True, text=True, cwd=Path(__file__).parents[1], check=True)
    shard, merge = result.stdout.splitlines()
    assert "agents.simulate --config configs/agents/tuned_qwen7b_vllm.yaml --data d --tasks t" in shard
    assert "--shard 0/8" in shard and "--out runs/sim/tuned_qwen7b_vllm/shard_0" in shard
    assert "--tasks t --merge runs/sim/tuned_qwen7b_vllm/shard_" in merge


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
    assert all(together) and len(together) == 3
    # a random model does not end its answer within 8 tokens: every answer is flagged as cut short
    assert batched.cut_short == single.cut_short == [True, True, True]
    real = batched.model.generate

    def first_row_ends(**kwargs):  # the first answer ends at once (EOS), the others run to the cap
        out = real(**kwargs)
        out[0, kwargs["input_ids"].shape[1] :] = batched.tokenizer.eos_token_id  # EOS, then padding
        return out

    monkeypatch.setattr(batched.model, "generate", first_row_ends)
    assert batched.generate(conversations, sampling)[0] == "" and batched.cut_short == [False, True, True]


def test_suite_scores_the_stats_agent_against_both_baselines(yelp_store, yelp_tasks, tmp_path):
    table, agents, claims = suite.run_suite(yelp_store, yelp_tasks, tmp_path, adapter=None, kinds=("stats",))
    lines = table.splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["previous-review", "user-mean", "stats"]
    assert "| stats | 20/20 |" in agents
    assert "| stats > user-mean | preference_estimation |" in claims
    for name in ("compare.md", "compare.png", "agents.md", "claims.md"):
        assert (tmp_path / name).stat().st_size > 0
    with pytest.raises(SystemExit, match="--adapter"):
        suite.run_suite(yelp_store, yelp_tasks, tmp_path / "t", adapter=None, kinds=("tuned",))


def test_vllm_backend_passes_the_adapter_as_a_lora_request(tmp_path, monkeypatch):
    """vLLM needs a GPU, so a stand-in module records what the backend asks of it: engine arguments
    (max_lora_rank rounded up to a value vLLM accepts), the LoRA request, the sampling parameters."""
    import sys
    import types

    seen = {}

    class LLM:
        def __init__(self, **kwargs):
            seen["engine"] = kwargs

        def chat(self, conversations, params, lora_request=None, use_tqdm=True):
            seen.update(params=params, lora=lora_request)

            def reply(c):  # an answer ending in "..." stands for one cut at max_tokens
                reason = "length" if c[-1]["content"].endswith("...") else "stop"
                return types.SimpleNamespace(
                    outputs=[types.SimpleNamespace(text=c[-1]["content"], finish_reason=reason)]
                )

            return [reply(c) for c in conversations]

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, lambda **kw: kw
    lora = types.ModuleType("vllm.lora.request")
    lora.LoRARequest = lambda name, index, path: (name, index, path)
    for name, module in {
        "vllm": vllm,
        "vllm.lora": types.ModuleType("vllm.lora"),
        "vllm.lora.request": lora,
    }.items():
        monkeypatch.setitem(sys.modules, name, module)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"r": 12}')
    backend = load_llm(LLMConfig(backend="vllm", model="org/model", adapter=str(adapter)))
    out = backend.generate(
        [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b..."}]], Sampling(7, 0.0, seed=3)
    )
    assert out == ["a", "b..."] and backend.cut_short == [False, True]
    assert seen["engine"]["enable_lora"] and seen["engine"]["max_lora_rank"] == 16
    assert seen["lora"] == ("adapter", 1, str(adapter))
    assert seen["params"] == {"max_tokens": 7, "temperature": 0.0, "top_p": 1.0, "seed": 3}
    with pytest.raises(ValueError, match="above vLLM"):
        vllm_lora_rank(1024)


def test_every_shipped_agent_config_parses():
    from trl import TrlParser

    configs = sorted((Path(__file__).parents[1] / "configs" / "agents").glob("*.yaml"))
    assert {p.stem for p in configs} >= {"stats", "asc-baseline", "retrieval-llm", "tuned"}
    for path in configs:
        parser = TrlParser((AgentConfig, simulate.LLMConfig, simulate.RunArguments))
        agent, llm, _ = parser.parse_args_and_config(["--config", str(path), "--out", "x"])
        assert agent.kind in KINDS and agent.kind == yaml.safe_load(path.read_text())["kind"]
        assert llm.backend in ("hf", "vllm", "openai") and (agent.kind == "stats" or llm.model)
