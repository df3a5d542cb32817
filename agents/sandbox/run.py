"""Run the recommender sandbox round by round; resumable; steer it between rounds.

    python -m agents.sandbox run --config configs/sandbox/movielens.yaml --out runs/sandbox/demo
    python -m agents.sandbox run --config ... --out RUN_DIR --rounds 10 --agents 50 --set recommender.kind=popularity
    python -m agents.sandbox run --config ... --out RUN_DIR --human "User 414"   # play one agent yourself
    python -m agents.sandbox interview RUN_DIR --agent "User 414" --question "What do you watch lately?"
    python -m agents.sandbox edit RUN_DIR --agent "User 414" --field traits --value "impatient, funny"
    python -m agents.sandbox broadcast RUN_DIR --message "A new sci-fi season starts tonight"

RUN_DIR gets, as the run goes: interactions.jsonl (round, agent, action, item, text, ...), stats.jsonl
(per round: active agents, watches, chats, posts, exposure genre entropy), checkpoint.json (the whole
state, JSON, written after every round; each round's also kept as checkpoints/round_K.json.gz, what
``fork`` branches from), interventions.jsonl (every edit, broadcast and interview), config.json (the resolved config),
rejects.jsonl (data lines not used, with file, line and reason); at the end stats.png and summary.json
(counts, the config, provenance). Stop it at any time (Ctrl-C): the rerun of the same command resumes
after the last complete round; a rerun with another config or data stops naming what changed, unless
--overwrite. ``--rounds`` may grow on a resume (it is not part of the fingerprint).

Interventions change the checkpoint between rounds (pause the run, intervene, rerun to resume); they are
refused while a run holds the folder (RUN_DIR/.lock).

    python -m agents.sandbox fork RUN_DIR --round 3 --out RUN_B --set recommender.kind=popularity
    python -m agents.sandbox run --config RUN_B/config.json --out RUN_B --rounds 10   # the branch goes on
    python -m agents.sandbox compare RUN_A RUN_B                 # paired per-round statistics after the fork
    python -m agents.sandbox export RUN_DIR --format recbole     # or csv: the interactions for a recsys library

(agents/sandbox/cli.py: the command line; agents/sandbox/branches.py: fork and compare;
agents/sandbox/export.py: export. This module is the run-folder library the others build on.)
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import signal
import sys
import threading
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agents.llm import EXECUTION_FIELDS
from agents.plugins import describe, is_target
from agents.runs import Lock, write_json
from agents.sandbox.config import FEATURES, as_dict, load_config
from agents.sandbox.profiles import (
    ProfileError,
    aligned_profiles,
    combine,
    load_profiles,
    movielens_profiles,
    to_yaml,
    written_by_llm,
)
from agents.sandbox.social import generate_graph, load_edges
from agents.sandbox.world import World
from data_prep import fingerprint, movielens
from data_prep.io import append_to, read_jsonl, valid_lines, write_atomic
from data_prep.movielens import day, parse_moment
from data_prep.provenance import provenance

CHECKPOINTS = "checkpoints"


def round_checkpoint(out: Path, round_: int) -> Path:
    return out / CHECKPOINTS / f"round_{round_:04d}.json.gz"


def checkpoint_round(path: Path) -> int:
    """The round a checkpoints/round_K.json.gz file holds (any number of digits)."""
    return int(re.fullmatch(r"round_(\d+)\.json\.gz", path.name)[1])


def keep_checkpoint(out: Path, state: dict) -> None:
    """The state after this round, kept (gzip JSON, atomically) for ``fork``."""
    path = round_checkpoint(out, state["round"])
    path.parent.mkdir(exist_ok=True)
    write_atomic(path, gzip.compress(json.dumps(state).encode(), mtime=0))


def keep_rounds(path: Path, last: int) -> None:
    """Drop lines of rounds after the checkpoint (written before a kill, redone on resume), and a last
    line a kill cut off (valid_lines leaves it out; a line damaged in the middle is an error)."""
    if path.exists():
        kept = [line for line, row in valid_lines(path) if row["round"] <= last]
        path.write_text("".join(line + "\n" for line in kept))


def make_profiles(config, data, start: int, rng: np.random.Generator) -> list:
    """The run's profiles: handcrafted ones over the MovieLens users they name (``user``, else the one
    with their id, if the data has it), or ``agents`` users drawn with the run's generator; each aligned
    profile at the start."""
    if not config.profiles:
        return movielens_profiles(data, config.agents, start, rng, config.features, config.min_history)
    handcrafted = load_profiles(config.profiles)
    users = set(data.by_user())
    for hand in handcrafted:
        if hand.user is not None and hand.user not in users:
            raise ProfileError(
                f"{config.profiles}: profile {hand.name!r} names MovieLens user {hand.user}, not in {config.data}"
            )
    key = {h.id: h.user if h.user is not None else h.id for h in handcrafted}
    aligned = aligned_profiles(
        data,
        sorted(key[h.id] for h in handcrafted if key[h.id] in users),
        start,
        rng,
        config.features,
        config.min_history,
    )
    return combine(aligned, handcrafted) + [h for h in handcrafted if key[h.id] not in users]


def build(config, out: Path, backend=None, embed=None, human=None, fresh: bool = True) -> World:
    """The world for a config: data, profiles at the start, graph, backend and encoder (offline
    defaults). A world that a checkpoint will restore (``fresh=False``) skips the LLM-written profiles
    and the agents' start (the checkpoint has them)."""
    data = movielens.load(config.data)
    (out / "rejects.jsonl").write_text("".join(json.dumps(r) + "\n" for r in data.rejects))
    if data.rejects and fresh:
        reasons = {
            k.removeprefix("rejected:"): v for k, v in data.counts.items() if k.startswith("rejected:")
        }
        print(f"{len(data.rejects)} data lines not used ({reasons}): kept in {out}/rejects.jsonl")
    rng = np.random.default_rng(config.seed)
    try:
        start = parse_moment(config.start, data)
        if not data.ratings or data.ratings[0].ts >= start:
            raise ValueError(
                f"no rating in {config.data} is older than the start ({day(start)}): nothing to start from"
            )
        profiles = make_profiles(config, data, start, rng)
    except (ProfileError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None
    if backend is None:
        from agents.llm import load_llm

        backend = load_llm(config.llm)
    if config.profile_prompt and fresh:
        off = getattr(backend, "adapter_off", None)  # an adapter trained for choices does not write people
        with off() if off and config.decision.adapter_scope != "all" else nullcontext():
            profiles, report = written_by_llm(profiles, backend, config.profile_prompt, rng, data.movies)
        write_json(out / "profiles_written.json", report)
        (out / "profiles.yaml").write_text(to_yaml(profiles))  # reusable as handcrafted profiles
        print(
            f"the LLM wrote profile fields for {len(profiles) - report['fallbacks']} of {len(profiles)} "
            f"agents ({report['fallbacks']} unusable answers, {report['renamed']} names made unique)"
            f" -> {out}/profiles.yaml"
        )
    names = [p.name for p in profiles]
    if config.graph.edges:
        graph = load_edges(config.graph.edges, names)
    else:
        interests = [p.interests for p in profiles]
        graph = generate_graph(names, interests, config.graph.mean_degree, config.graph.homophily, rng)
    if embed is None:
        from agents.encoders import packaged_minilm
        from agents.retrieval import Retriever

        embed = Retriever(packaged_minilm("auto", 64)).embed
    print(decisions(config))
    if fresh:
        aligned = sum(p.user is not None for p in profiles)
        print(
            f"{len(profiles)} agents ({aligned} standing for MovieLens users, with their ratings before "
            f"{day(start)}); starting their memories"
        )
    return World(config, profiles, data, backend, embed, graph, rng, human, fresh=fresh)


def decisions(config) -> str:
    """One line at start: which model and rule make the agents' decisions and stars."""
    model = (
        f"{config.llm.model} with the adapter {config.llm.adapter}"
        if config.llm.adapter
        else (f"{config.llm.model} (base model, no adapter)")
    )
    d = config.decision
    if d.mode == "score":
        choice = f"films scored by {model} ({d.normalisation})"
        choice += (
            f" plus {d.choice_weight:g} x the choice model's log-odds"
            if d.choice_weight
            else ", the LLM alone"
        )
    else:
        choice = f"films chosen by {model} generating its answer"
    stars = (
        f"the star model, blended with the LLM's {config.stars.read} stars where {config.stars.llm_validation} "
        "validation ratings show it helps"
        if config.stars.llm_validation
        else "the star model fitted on real ratings, alone (no LLM asked)"
    )
    memory = "by the LLM" if config.memory.writer == "llm" else "a template (no LLM call)"
    return f"decisions: {choice}; stars: {stars}; memory texts: {memory}"


# how to reach the model, not which model (a requeued job gets another port), and how fast it answers
CONNECTION = ("base_url", "api_key_env", *EXECUTION_FIELDS)


def run_inputs(config) -> dict:
    settings = as_dict(config)
    settings.pop("rounds")  # a resume may run longer
    for key in CONNECTION:
        settings["llm"].pop(key, None)
    data = Path(config.data)
    files = [data / name for name in ("movies.csv", "ratings.csv", "tags.csv") if (data / name).exists()]
    inputs = {"config": settings, "data": fingerprint.digest_files(files, data)}
    if config.llm.adapter:  # the adapter's weights, not only its folder's name
        inputs["adapter"] = fingerprint.adapter_digest(config.llm.adapter)
    if config.profiles:
        inputs["profiles"] = fingerprint.digest_files([Path(config.profiles)])
    if config.graph.edges:
        inputs["edges"] = fingerprint.digest_files([Path(config.graph.edges)])
    if is_target(config.recommender.kind):  # a plug-in: its code, so a changed file refuses a resume
        record = describe(config.recommender.kind)
        inputs["recommender_plugin"] = {"target": record["target"], "sha256": record["sha256"]}
    return inputs


FETCHED = Path("runs/data/movielens_latest_small")  # where --fetch-missing puts the public sample


def resolve_config(args):
    """The config with the command line's overrides; a missing data folder fetched when asked."""
    overrides = list(args.set or [])
    if getattr(args, "rounds", None):
        overrides.append(f"rounds={args.rounds}")
    if getattr(args, "agents", None):
        overrides.append(f"agents={args.agents}")
    config = load_config(args.config, overrides)
    if not Path(config.data).exists():
        if not getattr(args, "fetch_missing", False):
            raise SystemExit(f"error: {config.data} not found (--fetch-missing downloads ml-latest-small)")
        if (FETCHED / "ratings.csv").exists():  # fetched by an earlier run: no network needed
            print(f"{config.data} not found: using the copy fetched earlier, {FETCHED}")
        else:
            print(
                f"{config.data} not found: fetching MovieLens ml-latest-small from {movielens.URL} into {FETCHED}"
            )
            movielens.fetch(FETCHED, movielens.URL)
        config = load_config(args.config, [*overrides, f"data={FETCHED}"])
    return config


RUN_FILES = (
    "checkpoint.json",
    "interactions.jsonl",
    "stats.jsonl",
    "interventions.jsonl",
    "summary.json",
    "profiles_written.json",
    "profiles.yaml",
)


def open_world(config, out: Path, overwrite: bool, backend=None, embed=None, human=None) -> World:
    """The run's world, fresh or resumed from its checkpoint; called while holding the run's Lock. A
    resume from other inputs stops naming what changed (``overwrite`` discards the earlier run)."""
    checkpoint = out / "checkpoint.json"
    inputs = run_inputs(config)
    if not fingerprint.verdict(out, inputs, overwrite=overwrite, has_work=checkpoint.exists()):
        for name in RUN_FILES:
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
        print(f"--overwrite: discarded the earlier run in {out}")
    fingerprint.record(out, inputs)
    write_json(out / "config.json", as_dict(config))  # what interviews rebuild the world from
    world = build(config, out, backend, embed, human, fresh=not checkpoint.exists())
    if checkpoint.exists():
        world.restore(json.loads(checkpoint.read_text()))
        print(f"resuming after round {world.round}")
    for name in ("interactions.jsonl", "stats.jsonl"):
        keep_rounds(out / name, world.round)
    for path in (out / CHECKPOINTS).glob("round_*.json.gz"):  # written after a checkpoint a kill lost
        if checkpoint_round(path) > world.round:
            path.unlink()
    if not round_checkpoint(out, world.round).exists():  # round 0: the start, before any round
        keep_checkpoint(out, world.state())
    return world


def run(args, backend=None, embed=None) -> dict:
    config = resolve_config(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with Lock(out):
        human = HumanPlayer(args.human) if args.human else None
        world = open_world(config, out, args.overwrite, backend, embed, human)
        if args.human and args.human not in world.agents:
            names = ", ".join(list(world.agents)[:10])
            raise SystemExit(f"error: --human {args.human!r} is not an agent of this run ({names} ...)")
        stop = StopRequest()
        try:
            with stop, tqdm(total=config.rounds, initial=world.round, desc="rounds", unit="round") as bar:
                while world.round < config.rounds and not stop.signal:
                    _, stats = play_round(out, world)
                    bar.update(1)
                    bar.set_postfix(watches=stats["watches"], chats=stats["chats"], posts=stats["posts"])
        except KeyboardInterrupt:
            paused(world, "Ctrl-C")
        if stop.signal and world.round < config.rounds:
            paused(world, stop.signal)
        summary = finish(out, world, config)
    return summary


PAUSED = 130  # the exit status of a run stopped before its last round (slurm/sandbox.sbatch requeues it)


def paused(world: World, why: str) -> None:
    print(f"\n{why}: paused after round {world.round}; rerun the same command to resume", file=sys.stderr)
    raise SystemExit(PAUSED)


class StopRequest:
    """SIGUSR1 or SIGTERM (a batch system's warning before the time limit, or its cancel) asks the run to
    stop after the round in progress, once its checkpoint is written. Ctrl-C still stops at once (the
    round in progress is redone on resume). A handler, not SIGINT: a command started in the background
    of a batch script ignores SIGINT."""

    def __enter__(self):
        self.signal, self.previous = None, {}
        if threading.current_thread() is threading.main_thread():  # the web page runs rounds elsewhere
            for number in (signal.SIGUSR1, signal.SIGTERM):
                self.previous[number] = signal.signal(number, self.request)
        return self

    def request(self, number, frame) -> None:
        self.signal = signal.Signals(number).name
        print(f"\n{self.signal}: stopping after this round", file=sys.stderr, flush=True)

    def __exit__(self, *exc) -> None:
        for number, handler in self.previous.items():
            signal.signal(number, handler)


def play_round(out: Path, world: World) -> tuple[list[dict], dict]:
    """One round, its interactions and statistics appended, then the checkpoint (the CLI and the web
    page both run rounds through here)."""
    events, stats = world.step()
    with append_to(out / "interactions.jsonl") as handle:
        handle.writelines(json.dumps(e) + "\n" for e in events)
    with append_to(out / "stats.jsonl") as handle:
        handle.write(json.dumps(stats) + "\n")
    state = world.state()
    write_json(out / "checkpoint.json", state)
    keep_checkpoint(out, state)
    return events, stats


def finish(out: Path, world: World, config) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(out / "stats.jsonl")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
    rounds = [r["round"] for r in rows]
    for key in ("active_agents", "watches", "chats", "posts"):
        axes[0].plot(rounds, [r[key] for r in rows], marker="o", label=key.replace("_", " "))
    axes[0].set_xlabel("round")
    axes[0].legend()
    shown = [r for r in rows if r["exposure_genre_entropy"] is not None]
    axes[1].plot([r["round"] for r in shown], [r["exposure_genre_entropy"] for r in shown], marker="o")
    axes[1].set_xlabel("round")
    axes[1].set_ylabel("exposure genre entropy (bits)")
    fig.tight_layout()
    fig.savefig(out / "stats.png", dpi=110)
    plt.close(fig)
    asked = [
        c for c in ("repetition_penalty", "no_repeat_ngram_size") if getattr(config.text, c) not in (1.0, 0)
    ]
    controls = getattr(world.backend, "decoding_controls", ())
    summary = {
        "rounds": world.round,
        "agents": len(world.agents),
        "start": {"unix": world.start, "date": day(world.start), "round_days": config.round_days},
        "counts": dict(world.counts),
        "memory_model": dict(world.model.counts),
        "memories": dict(sum((Counter(a.memory.counts) for a in world.agents.values()), Counter())),
        "totals": {k: sum(r[k] for r in rows) for k in ("watches", "chats", "posts")},
        "features": {
            "agents_with": dict(Counter(f for a in world.agents.values() for f in a.profile.features)),
            "sources": dict(
                Counter(s for a in world.agents.values() for s in a.profile.feature_sources.values())
            ),
        },
        "activity_fit": world.activity_fit,
        "stars": {"model_report": world.rater.model.report, **world.rater.counts},
        "decision": as_dict(config)["decision"],
        "decoding": dict(sorted(world.decider.decoding.items())),  # what each kind of call was asked with
        "decoding_controls": {
            "applied": [c for c in asked if c in controls],
            "not_available": [c for c in asked if c not in controls],
        },
        "messages_by": config.text.messages,
        "chat_mode": config.chat,
        "config": as_dict(config),
        "recommender_plugin": describe(config.recommender.kind)
        if is_target(config.recommender.kind)
        else None,
        "provenance": provenance(["torch", "transformers", "implicit", "cornac", "numpy"]),
    }
    write_json(out / "summary.json", summary)
    print(json.dumps({k: summary[k] for k in ("rounds", "agents", "totals", "counts")}, indent=1))
    print(f"-> {out}/interactions.jsonl, stats.jsonl, stats.png, summary.json")
    return summary


class HumanPlayer:
    """One agent played at the terminal: its prompts are shown, the person answers."""

    def __init__(self, name: str):
        self.name = name

    def plays(self, name: str) -> bool:
        return name == self.name

    def answer(self, kind: str, prompt: list[dict], constraint) -> str:
        print("\n" + prompt[-1]["content"])
        if constraint.kind == "choice":
            return input(f"[{self.name}] one of {', '.join(constraint.options)}: ").strip()
        keys = list(json.loads(constraint.schema)["properties"])
        print(f"[{self.name}] answer as JSON with {', '.join(keys)}")
        return input("> ").strip()


class InterventionError(ValueError):
    """Bad input to an intervention: nothing was changed."""


EDITABLE = ("gender", "age", "traits", "career", "interests", "features")
MAX_TEXT = 1000  # characters of a profile value, a message or a question


def check_agent(state: dict, agent: str) -> dict:
    for entry in state["agents"]:
        if entry["profile"]["name"] == agent:
            return entry
    names = [a["profile"]["name"] for a in state["agents"]]
    raise InterventionError(f"no agent {agent!r} (agents: {', '.join(names[:10])} ...)")


def check_text(what: str, text: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InterventionError(f"{what} is empty")
    if len(text) > MAX_TEXT:
        raise InterventionError(f"{what} is {len(text)} characters, more than {MAX_TEXT}")
    return text


def edit_profile(state: dict, agent: str, field: str, value: str) -> dict:
    """Change one profile field of an agent in a world state (a checkpoint). Returns the log record;
    raises InterventionError, changing nothing, on an unknown agent or field or a bad value."""
    entry = check_agent(state, agent)
    if field not in EDITABLE:
        raise InterventionError(f"field must be one of {', '.join(EDITABLE)}")
    check_text("the value", value)
    new = [v.strip() for v in value.split(";") if v.strip()] if field in ("interests", "features") else value
    if field == "age":
        if not value.strip().isdigit() or not 0 <= int(value) <= 120:
            raise InterventionError(f"age {value!r} is not a whole number in [0, 120]")
        new = int(value)
    unknown = sorted(set(new) - set(FEATURES)) if field == "features" else []
    if unknown:
        raise InterventionError(f"unknown behaviour feature {unknown[0]!r} (one of {', '.join(FEATURES)})")
    record = {"round": state["round"], "command": "edit", "agent": agent, "field": field}
    record.update(old=entry["profile"][field], new=new)
    entry["profile"][field] = new
    if field == "features":
        entry["profile"]["feature_sources"] = dict.fromkeys(new, "edited")
    return record


def add_broadcast(state: dict, message: str) -> dict:
    """A message every agent hears at the start of the next round."""
    state.setdefault("pending_broadcasts", []).append(check_text("the message", message))
    return {"round": state["round"], "command": "broadcast", "message": message}


def interview(world: World, agent: str, question: str) -> dict:
    check_agent({"agents": [{"profile": {"name": n}} for n in world.agents]}, agent)
    answer = world.interview(agent, check_text("the question", question))
    return {
        "round": world.round,
        "command": "interview",
        "agent": agent,
        "question": question,
        "answer": answer,
    }


def log_intervention(out: Path, record: dict) -> None:
    with append_to(out / "interventions.jsonl") as handle:
        handle.write(json.dumps(record) + "\n")


def intervene(args) -> None:
    """interview / edit / broadcast on a paused run's checkpoint; every change is logged."""
    out = Path(args.run)
    checkpoint = out / "checkpoint.json"
    if not checkpoint.exists():
        raise SystemExit(f"error: {checkpoint} is missing: start the run first")
    with Lock(out):
        state = json.loads(checkpoint.read_text())
        try:
            if args.command == "edit":
                record = edit_profile(state, args.agent, args.field, args.value)
                write_json(checkpoint, state)
            elif args.command == "broadcast":
                record = add_broadcast(state, args.message)
                write_json(checkpoint, state)
            else:
                world = build(load_config(out / "config.json"), out, fresh=False)
                world.restore(state)
                record = interview(world, args.agent, args.question)
        except InterventionError as err:
            raise SystemExit(f"error: {err}; nothing changed") from None
        log_intervention(out, record)
    print(json.dumps(record))


if __name__ == "__main__":  # the old entry point, kept for one release: python -m agents.sandbox
    import runpy
    import sys

    print("note: python -m agents.sandbox.run is now python -m agents.sandbox", file=sys.stderr)
    runpy.run_module(
        "agents.sandbox", run_name="__main__", alter_sys=True
    )  # by name: the library never imports its command line
