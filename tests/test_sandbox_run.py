"""The sandbox runner with the scripted backend: a stopped run resumes to the same interactions as an
uninterrupted one, a resume with another config refuses, an edited profile reaches the next round's
prompts, the data's bad line is kept in rejects.jsonl."""

import argparse
import json
import os

import pytest
from sandbox_fakes import Recording, embed

from agents.sandbox.run import intervene, keep_rounds, run

SETTINGS = [
    "recommender.kind=popularity",
    "activity.pareto_xmin=1",
    "agents=4",
    "graph.mean_degree=2",
    "memory.reflect_every=2",  # forgetting and reflection happen within the tests' rounds
    "memory.enhance_times=1",  # and promotions with insights
]


def args(raw, out, rounds, *extra, overwrite=False):
    return argparse.Namespace(
        config=None, out=str(out), rounds=rounds, agents=None, human=None, overwrite=overwrite,
        set=[f"data={raw / 'movielens_latest_small'}", *SETTINGS, *extra],
    )  # fmt: skip


def lines(path):
    return path.read_text().splitlines()


@pytest.mark.slow
def test_a_stopped_run_resumes_to_the_same_interactions(raw, tmp_path):
    straight = tmp_path / "straight"
    run(args(raw, straight, 3), Recording(), embed)
    stopped = tmp_path / "stopped"
    run(args(raw, stopped, 2), Recording(), embed)
    with open(stopped / "interactions.jsonl", "a") as handle:  # a round cut off by a kill
        handle.write(json.dumps({"round": 3, "agent": "x", "action": "half-written"}) + "\n")
    summary = run(args(raw, stopped, 3), Recording(), embed)
    assert summary["rounds"] == 3
    assert lines(stopped / "interactions.jsonl") == lines(straight / "interactions.jsonl")
    assert lines(stopped / "stats.jsonl") == lines(straight / "stats.jsonl")
    assert summary["totals"]["watches"] > 0 and (stopped / "stats.png").stat().st_size > 0
    rejects = [json.loads(line) for line in lines(stopped / "rejects.jsonl")]
    assert [(r["file"], r["reason"]) for r in rejects] == [("ratings.csv", "unknown_movie")]


def test_a_resume_keeps_the_checkpoints_rounds_drops_a_cut_line_and_refuses_a_damaged_one(tmp_path):
    """keep_rounds drops rounds after the checkpoint and a last line a kill cut off mid-write; a line
    damaged in the middle is an error naming it, not a shorter file."""
    path = tmp_path / "interactions.jsonl"
    rows = [json.dumps({"round": r, "agent": "a"}) for r in (1, 2, 2, 3)]
    path.write_text("\n".join(rows) + '\n{"round": 3, "ag')
    keep_rounds(path, 2)
    assert [json.loads(line)["round"] for line in lines(path)] == [1, 2, 2]
    path.write_text(rows[0] + "\n{not json\n" + rows[1] + "\n")
    with pytest.raises(ValueError, match="line 2: not JSON"):
        keep_rounds(path, 2)
    assert lines(path)[1] == "{not json"  # nothing was rewritten


@pytest.mark.slow
def test_a_resume_with_another_config_refuses_naming_what_changed(raw, tmp_path):
    run(args(raw, tmp_path, 1), Recording(), embed)
    with pytest.raises(SystemExit, match=r"changed: config\.memory\.enhance_times"):
        run(args(raw, tmp_path, 2, "memory.enhance_times=5"), Recording(), embed)
    summary = run(args(raw, tmp_path, 1, "memory.enhance_times=5", overwrite=True), Recording(), embed)
    assert summary["config"]["memory"]["enhance_times"] == 5


@pytest.mark.slow
def test_an_edited_profile_reaches_the_next_rounds_prompts(raw, tmp_path):
    run(args(raw, tmp_path, 1), Recording(), embed)
    state = json.loads((tmp_path / "checkpoint.json").read_text())
    name = state["agents"][0]["profile"]["name"]
    edit = argparse.Namespace(
        run=str(tmp_path), command="edit", agent=name, field="traits", value="loves silent films"
    )
    intervene(edit)
    backend = Recording()
    run(args(raw, tmp_path, 2), backend, embed)
    assert any(p.startswith(f"You are {name}; traits: loves silent films") for p in backend.prompts)
    log = [json.loads(line) for line in lines(tmp_path / "interventions.jsonl")]
    assert log == [
        {
            "round": 1,
            "command": "edit",
            "agent": name,
            "field": "traits",
            "old": "",
            "new": "loves silent films",
        }
    ]
    for field, value, message in (
        ("age", "500", "not a whole number in"),
        ("features", "Lurker", "unknown behaviour"),
    ):
        bad = argparse.Namespace(run=str(tmp_path), command="edit", agent=name, field=field, value=value)
        with pytest.raises(SystemExit, match=message):
            intervene(bad)
    assert (
        json.loads((tmp_path / "checkpoint.json").read_text())["agents"][0]["profile"]["age"] is None
    )  # unchanged
    with pytest.raises(SystemExit, match="no agent 'Nobody'"):
        intervene(
            argparse.Namespace(run=str(tmp_path), command="edit", agent="Nobody", field="traits", value="x")
        )


def test_the_cluster_script_serves_on_localhost_and_keeps_the_key_off_the_command_line():
    import subprocess

    from data_prep.paths import REPO_ROOT

    result = subprocess.run(
        ["bash", "slurm/sandbox.sbatch", "--dry-run", "configs/sandbox/movielens.yaml", "runs/x", "--agents", "500"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True,
        env={k: v for k, v in os.environ.items() if k not in ("SLURM_JOB_ID", "PORT", "MODEL")},
    )  # fmt: skip
    server, client = result.stdout.splitlines()
    assert "--host 127.0.0.1 --port 42345" in server and "key" not in server.lower()
    assert "llm.base_url=http://127.0.0.1:42345/v1" in client and "llm.api_key_env=SANDBOX_LLM_KEY" in client
    assert client.rstrip().endswith("--agents 500")


class Writer(Recording):
    """Recording, and the profile writer's answers (a distinct name per prompt)."""

    def answer(self, conversation, constraint):
        if constraint.kind == "json" and '"career"' in constraint.schema:
            self.prompts.append(conversation[-1]["content"])
            return json.dumps(
                {
                    "name": f"Person {len(self.prompts)}",
                    "gender": "man",
                    "age": 50,
                    "traits": "shy",
                    "career": "baker",
                    "interests": ["Comedy"],
                    "features": ["Watcher"],
                }
            )
        return super().answer(conversation, constraint)


@pytest.mark.slow
def test_profiles_written_by_the_llm_are_kept_and_not_rewritten_on_resume(raw, tmp_path):
    out = tmp_path / "run"
    first = Writer()
    run(args(raw, out, 1, "profile_prompt=bakers who love films"), first, embed)
    written = [p for p in first.prompts if "bakers who love films" in p]
    assert len(written) == 4
    state = json.loads((out / "checkpoint.json").read_text())
    names = [a["profile"]["name"] for a in state["agents"]]
    assert names == ["Person 1", "Person 2", "Person 3", "Person 4"]
    assert (out / "profiles.yaml").exists() and json.loads((out / "profiles_written.json").read_text())[
        "fallbacks"
    ] == 0
    again = Writer()
    run(args(raw, out, 2, "profile_prompt=bakers who love films"), again, embed)
    assert not [p for p in again.prompts if "bakers who love films" in p]  # the checkpoint has them
    state = json.loads((out / "checkpoint.json").read_text())
    assert [a["profile"]["name"] for a in state["agents"]] == names and state["round"] == 2


def test_a_missing_data_folder_is_fetched_when_asked_and_an_error_otherwise(raw, tmp_path, monkeypatch):
    """The demo on a machine without ../shared: ml-latest-small comes from GroupLens (here a local
    server with a zip cut from the shared copy), and the run says so."""
    import http.server
    import io
    import threading
    import zipfile

    from agents.sandbox import run as runner
    from data_prep import movielens

    source = raw / "movielens_latest_small"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("ml-latest-small/movies.csv", (source / "movies.csv").read_text())
        ratings = (source / "ratings.csv").read_text().splitlines()[:3001]
        archive.writestr("ml-latest-small/ratings.csv", "\n".join(ratings) + "\n")
    payload = buffer.getvalue()

    class Zip(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Zip)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(movielens, "URL", f"http://127.0.0.1:{server.server_port}/ml-latest-small.zip")
    monkeypatch.setattr(runner, "FETCHED", tmp_path / "fetched")
    missing = args(raw, tmp_path / "run", 1, f"data={tmp_path / 'nowhere'}")
    with pytest.raises(SystemExit, match="nowhere not found"):
        run(missing, Recording(), embed)
    missing.fetch_missing = True
    summary = run(missing, Recording(), embed)
    server.shutdown()
    assert summary["rounds"] == 1 and summary["config"]["data"] == str(tmp_path / "fetched")
    assert (tmp_path / "fetched" / "ratings.csv").read_text().splitlines() == ratings


@pytest.mark.slow
def test_the_recommender_can_train_on_the_agents_own_history_only(raw, tmp_path):
    from agents.sandbox.config import load_config
    from agents.sandbox.run import build

    settings = [f"data={raw / 'movielens_latest_small'}", *SETTINGS]
    everyone = build(load_config(None, settings), tmp_path, Recording(), embed)
    own = build(load_config(None, [*settings, "recommender.train_on=agents"]), tmp_path, Recording(), embed)
    ids = {a.profile.id for a in own.agents.values()}
    assert {u for u, _ in own.history} == ids
    assert len(everyone.history) == 100836 and len(own.history) < len(everyone.history)


@pytest.mark.slow
def test_bad_input_is_an_error_naming_what_is_wrong_before_any_round(raw, tmp_path):
    from agents.sandbox.config import ConfigError
    from data_prep import movielens

    data = movielens.load(raw / "movielens_latest_small")
    late = next(
        u for u, rs in sorted(data.by_user().items()) if rs[0].ts > movielens.parse_moment("2015-01-01", data)
    )
    profiles = tmp_path / "p.csv"
    header = "id,name,gender,age,traits,career,interests,features,user\n"
    cases = [
        (header + "1,Ana,f,30,calm,nurse,Drama,,99999\n", [], "profile 'Ana' names MovieLens user 99999"),
        (
            header + f"1,Ana,f,30,calm,nurse,Drama,,{late}\n",
            ["start=2015-01-01"],
            f"user {late} has 0 ratings before the start \\(2015-01-01\\)",
        ),
        (header + "1,Ana,f,30,calm,nurse,Drama,Lurker,\n", [], "unknown behaviour feature 'Lurker'"),
    ]
    for k, (text, extra, message) in enumerate(cases):
        profiles.write_text(text)
        with pytest.raises(SystemExit, match=message):
            run(args(raw, tmp_path / f"bad{k}", 1, f"profiles={profiles}", *extra), Recording(), embed)
        assert not (tmp_path / f"bad{k}" / "interactions.jsonl").exists()  # no round was played
    with pytest.raises(SystemExit, match=r"no rating in .* is older than the start \(1990-01-01\)"):
        run(args(raw, tmp_path / "too-early", 1, "start=1990-01-01"), Recording(), embed)
    with pytest.raises(SystemExit, match="'soon' is not a date"):
        run(args(raw, tmp_path / "bad-start", 1, "start=soon"), Recording(), embed)
    with pytest.raises(ConfigError, match="decision.mode"):
        run(args(raw, tmp_path / "bad-mode", 1, "decision.mode=maybe"), Recording(), embed)
    with pytest.raises(ConfigError, match="features.sample_share"):
        run(args(raw, tmp_path / "bad-share", 1, "features.sample_share=2"), Recording(), embed)
