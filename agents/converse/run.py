"""Run the conversational user simulator against recommenders; resumable.

    python -m agents.converse run --config configs/converse/yelp.yaml --out runs/converse/demo
    python -m agents.converse run --config configs/converse/yelp.yaml --out RUN_DIR --set dialogues=40 max_turns=8
    python -m agents.converse run --config configs/converse/yelp.yaml --out RUN_DIR --ratings off   # objective only

Personas are sampled once (RecLLMSim's dictionaries and priors, conflicts resolved by the LLM) and
written to RUN_DIR/personas.json; every recommender in ``crs`` talks to the same personas, so their
ratings compare pairwise. Dialogues run in chunks of ``chunk`` (all LLM calls of a turn batched across
the chunk); after each chunk its dialogues are appended to dialogues.jsonl and every turn to
turns.jsonl (agents.converse.simulator.TurnLog: message, intent, actions, rating, refinements, the
recommender's reply and plan). Each chunk
draws from its own generator (seeded by the config's seed, the recommender and the chunk), so a run
stopped and rerun continues with the next unfinished chunk and ends as the uninterrupted run would; a
rerun with another config or data stops naming what changed (``--overwrite`` discards). Each
recommender's dialogues depend only on the shared inputs and its own (its seed comes from its name):
adding a recommender to ``crs`` and rerunning into the same folder runs only the new one, and a
recommender whose own inputs changed (an edited plug-in) is refused by name. At the end summary.json:
per recommender the mean ratings, turns, end reasons and counts, with provenance.
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agents.converse.config import as_dict, load_config
from agents.converse.crs import RECOMMENDERS, load_restaurants
from agents.converse.goals import read_reviews, yelp_goals
from agents.converse.plugins import PluginCRS, plugin_records
from agents.converse.profiles import Persona, load_sources, resolve_conflicts, sample_personas
from agents.converse.simulator import TurnLog, User, UserSimulator, decoding
from agents.llm import EXECUTION_FIELDS
from agents.plugins import PluginError
from agents.runs import Lock, json_lines, read_jsonl, valid_lines, write_json
from data_prep import fingerprint
from data_prep.io import append_to
from data_prep.provenance import provenance

TASKS = {  # the settings' task types (RecLLMSim's templates)
    "yelp": ["choosing restaurant"],
    "recllmsim": ["travel planning", "preparing gifts", "recipe planning", "skills learning planning"],
}
CHUNK = 8


LLM_CRS = {"base", "agent", "assistant"}  # the built-ins that call crs_llm


def run_inputs(config) -> dict:
    """What the run's results depend on: the shared part (the simulator's settings, the data, the
    personas' sources) and, under ``crs``, each recommender's own part (a built-in's name and, for the
    LLM ones, crs_llm and crs_text; a plug-in's transport, target, options and code digest). A CRS added to
    the list later changes only its own part: the others' dialogues are kept."""
    settings = as_dict(config)
    for section in ("llm", "crs_llm"):
        for key in ("base_url", "api_key_env", *EXECUTION_FIELDS):
            settings[section].pop(key, None)
    crs_llm, crs_text = settings.pop("crs_llm"), settings.pop("crs_text")
    for key in ("crs", "plugins", "questionnaire_read"):  # the questionnaire is asked in replays only
        settings.pop(key)
    data = Path(config.data)
    files = sorted(p for p in data.rglob("*") if p.is_file())
    inputs = {"config": settings, "data": fingerprint.digest_files(files, data)}
    if config.setting == "yelp":
        inputs["catalogue"] = fingerprint.digest_files([Path(config.catalogue)])
    if config.personas == "goals":
        inputs["goals"] = fingerprint.digest_files(
            [Path(config.reviews)] + ([Path(config.goal_users)] if config.goal_users else [])
        )
    try:  # a python plug-in's code is an input too: an edited CRS is a new run, not a resumed one
        plugins = {  # where the file lies is provenance, not an input
            name: {k: v for k, v in record.items() if k != "source"}
            for name, record in plugin_records(config).items()
        }
    except PluginError as error:
        raise SystemExit(f"error: {error}") from None
    inputs["crs"] = {}
    for name in config.crs:
        if name in config.plugins:
            spec = config.plugins[name]
            inputs["crs"][name] = {**plugins[name], "options": spec.options, "model": spec.model,
                                   "system_prompt": spec.system_prompt, "max_tokens": spec.max_tokens}  # fmt: skip
        elif name in LLM_CRS:
            inputs["crs"][name] = {"built_in": name, "crs_llm": crs_llm, "crs_text": crs_text}
        else:
            inputs["crs"][name] = {"built_in": name}
    return inputs


def against_earlier(out: Path, inputs: dict) -> tuple[dict, dict]:
    """(what to check, what to record) for this run's inputs against a run already in ``out``. Checked:
    the shared inputs and the recommenders both runs name, so a recommender new to the folder is simply
    run. Recorded: this run's inputs with the recommenders the earlier run had and this one leaves out
    (their dialogues stay in the folder; naming one again later is checked against what it was)."""
    earlier = fingerprint.recorded(out)
    if not earlier or not isinstance(earlier.get("crs"), dict):
        return inputs, inputs
    check = {**inputs, "crs": {n: v for n, v in inputs["crs"].items() if n in earlier["crs"]}}
    check["crs"].update({n: v for n, v in earlier["crs"].items() if n not in inputs["crs"]})
    return check, {**inputs, "crs": {**earlier["crs"], **inputs["crs"]}}


def crs_seed(name: str) -> int:
    """A recommender's own number in the chunk seeds: its name's, so adding or reordering recommenders
    leaves each one's dialogues as they were."""
    return zlib.crc32(name.encode())


def make_crs(name: str, config, backend, catalogue: list, seed: int):
    """A built-in recommender (one per chunk, seeded) or a plugged-in one (agents/converse/plugins.py)."""
    if name in config.plugins:
        try:
            return PluginCRS(name, config.plugins[name], catalogue, config.match_names)
        except Exception as error:  # the researcher's constructor: a clear error before any dialogue
            raise SystemExit(
                f"error: crs {name!r}: cannot start {config.plugins[name].target}: {error!r}"
            ) from None
    return RECOMMENDERS[name](backend, catalogue, config.temperature, seed, config.crs_text)


def personas_for(config, out: Path, backend) -> tuple[list[Persona], dict]:
    path = out / "personas.json"
    if path.exists():  # the fingerprint says the inputs are the same: the same personas
        saved = json.loads(path.read_text())
        return [Persona(**p) for p in saved["personas"]], saved["report"]
    priors, report, contexts = load_sources(config.data)
    rng = np.random.default_rng([config.seed, 0])
    cities, found = None, None
    if config.setting == "yelp":
        catalogue = load_restaurants(config.catalogue)
        cities = sorted({r.city for r in catalogue if r.city})
        if config.personas == "goals":
            users = None
            if config.goal_users:
                users = {row["user_id"] for _, row in json_lines(Path(config.goal_users))}
            found = yelp_goals(read_reviews(Path(config.reviews)), catalogue, config.dialogues, rng, users)
            report["goals"] = {"users": len({g.user for g in found}), "targets_per_goal": float(
                np.mean([len(g.targets) for g in found]))}  # fmt: skip
    personas = sample_personas(
        config.dialogues, priors, contexts, config, rng, TASKS[config.setting], cities, found
    )
    report["conflicts"] = resolve_conflicts(personas, backend, rng)
    report["priors"] = priors
    write_json(path, {"personas": [p.to_json() for p in personas], "report": report})
    return personas, report


def tidy(out: Path, chunks: list[tuple[int, str, list[int]]]) -> set[tuple[str, int]]:
    """The dialogues of whole chunks, after a kill: dialogues.jsonl and turns.jsonl are rewritten with
    only the lines of chunks whose every dialogue was written (a cut line, or a chunk written in part,
    is dropped and redone). Returns the finished (crs, dialogue) pairs."""
    written = {(row["crs"], row["dialogue"]): line for line, row in valid_lines(out / "dialogues.jsonl")}
    whole = [(name, ids) for _, name, ids in chunks if all((name, i) in written for i in ids)]
    done = {(name, i) for name, ids in whole for i in ids}
    # a recommender this run leaves out keeps its dialogues as they are (named again later, it resumes)
    ours = {name for _, name, _ in chunks}
    kept = lambda key: key in done or key[0] not in ours  # noqa: E731
    (out / "dialogues.jsonl").write_text("".join(line + "\n" for key, line in written.items() if kept(key)))
    turns = [line for line, row in valid_lines(out / "turns.jsonl") if kept((row["crs"], row["dialogue"]))]
    (out / "turns.jsonl").write_text("".join(line + "\n" for line in turns))
    return done


def converse(crs_name: str, personas: list[Persona], ids: list[int], simulator, crs) -> tuple[list, list]:
    """One chunk of dialogues, turn by turn, every LLM call batched across the chunk."""
    users = [User(replace(personas[i], adopted=[])) for i in ids]
    sessions = [type(crs.session)() for _ in ids]
    for session, user in zip(sessions, users, strict=True):  # only the oracle reads them
        session.targets = list(user.persona.goal["targets"]) if user.persona.goal else []
    replies = [None] * len(ids)
    turns: list[TurnLog] = []
    active = list(range(len(ids)))
    while active:
        logs = simulator.step([users[k] for k in active], [replies[k] for k in active])
        reply_to = [k for k, log in zip(active, logs, strict=True) if not users[k].ended]
        answered = crs.respond([sessions[k] for k in reply_to], [users[k].dialogue[-1][1] for k in reply_to])
        for k, reply in zip(reply_to, answered, strict=True):
            replies[k] = reply
            if reply.error:  # a plugged-in CRS failed this turn: the dialogue ends, nothing is rated
                users[k].ended = "crs_error"
        for k, log in zip(active, logs, strict=True):
            reply = replies[k] if k in reply_to else None
            log.update(crs=crs_name, dialogue=ids[k], persona=users[k].persona.id, ended=users[k].ended)
            log["reply"] = asdict(reply) if reply else None
            turns.append(log)
        active = [k for k in reply_to if not users[k].ended]
    dialogues = []
    for k, user in enumerate(users):
        targets = set(user.persona.goal["targets"]) if user.persona.goal else set()
        hit = [n for n, item in enumerate(sessions[k].recommended) if item in targets]
        answered = [t for t in turns if t["dialogue"] == ids[k] and t["reply"]]
        # not scored against the goal: a CRS that failed, or one that does not say what it recommended
        unscored = None
        if user.ended == "crs_error":
            unscored = "crs_error"
        elif targets and any(t["reply"]["recommended"] is None for t in answered):
            unscored = "items_unknown"
        dialogues.append(
            {
                "crs": crs_name,
                "dialogue": ids[k],
                "persona": user.persona.id,
                "turns": user.turn,
                "ended": user.ended,
                "satisfaction": user.scores,
                "adopted": user.persona.adopted,
                "recommended": sessions[k].recommended,
                # catalogue goals: whether a target was recommended, and at which recommendation (0-based)
                "targets": sorted(targets) if targets else None,
                "success": bool(hit) if targets and not unscored else None,
                "unscored": unscored,
                "first_hit": hit[0] if hit else None,
                "success_turn": next(
                    (t["turn"] for t in answered if set(t["reply"]["recommended"] or []) & targets), None
                ),
                "transcript": user.dialogue,
            }
        )
    return dialogues, turns


def summarise(out: Path, config, report: dict) -> dict:
    dialogues = [d for d in read_jsonl(out / "dialogues.jsonl") if d["crs"] in config.crs]  # this run's
    counts = Counter()
    for dialogue in dialogues:
        counts.update(dialogue.get("chunk_counts", {}))
    turns = read_jsonl(out / "turns.jsonl")
    per_crs = {}
    for name in config.crs:
        mine = [t for t in turns if t["crs"] == name and t.get("rating")]
        ratings = {
            key: [t["rating"][key] for t in mine if t["rating"].get(key) is not None]
            for key in ("language_quality", "action_quality", "recommendation_quality")
        }
        ds = [d for d in dialogues if d["crs"] == name]
        per_crs[name] = {
            "dialogues": len(ds),
            "mean_turns": round(float(np.mean([d["turns"] for d in ds])), 2) if ds else None,
            "ended": dict(Counter(d["ended"] for d in ds)),
            "ratings": {k: round(float(np.mean(v)), 3) if v else None for k, v in ratings.items()},
            "rated_turns": len(mine),
            "unrated_turns": sum(
                1 for t in turns if t["crs"] == name and "rating" in t and t["rating"] is None
            ),
            "adopted_preferences": sum(len(d["adopted"]) for d in ds),
        }
    summary = {
        "setting": config.setting,
        "crs": per_crs,
        "counts": dict(counts),
        "personas": report,
        "plugins": plugin_records(config),
        "config": as_dict(config),
        "decoding": decoding(config),
        "provenance": provenance(["torch", "transformers", "numpy"]),
    }
    write_json(out / "summary.json", summary)
    return summary


def run(args, backend=None, crs_backend=None) -> dict:
    config = load_config(args.config, args.set or [])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with Lock(out):
        own = run_inputs(config)
        check, inputs = against_earlier(out, own)
        has_work = (out / "personas.json").exists()
        if not fingerprint.verdict(out, check, overwrite=args.overwrite, has_work=has_work):
            for name in ("personas.json", "dialogues.jsonl", "turns.jsonl", "summary.json"):
                (out / name).unlink(missing_ok=True)
            print(f"--overwrite: discarded the earlier run in {out}")
            inputs = own
        fingerprint.record(out, inputs)
        if backend is None:
            from agents.llm import load_llm

            backend = load_llm(config.llm)
        if crs_backend is None:
            from agents.llm import load_llm

            crs_backend = (
                backend if asdict(config.crs_llm) == asdict(config.llm) else load_llm(config.crs_llm)
            )
        personas, report = personas_for(config, out, backend)
        catalogue = load_restaurants(config.catalogue) if config.setting == "yelp" else []
        # plugged-in CRSs are stateless (the dialogue comes with each call): one per run
        plugged = {n: make_crs(n, config, None, catalogue, 0) for n in config.crs if n in config.plugins}
        chunks = [
            (c, name, list(range(start, min(start + CHUNK, len(personas)))))
            for c, name in enumerate(config.crs)
            for start in range(0, len(personas), CHUNK)
        ]
        done = tidy(out, chunks)
        todo = [chunk for chunk in chunks if any((chunk[1], i) not in done for i in chunk[2])]
        if done:
            print(f"resuming: {len(done)} dialogues done, {len(todo)} chunks to go")
        try:
            for _, name, ids in tqdm(todo, desc="dialogue chunks", unit="chunk"):
                rng = np.random.default_rng([config.seed, crs_seed(name), ids[0]])
                simulator = UserSimulator(config, backend, rng, catalogue)
                crs = plugged.get(name) or make_crs(
                    name, config, crs_backend, catalogue, int(rng.integers(2**31 - 1))
                )
                hung = getattr(crs, "hung", 0)
                dialogues, turns = converse(name, personas, ids, simulator, crs)
                chunk_counts = Counter(simulator.counts)
                chunk_counts[f"crs_hung_calls:{name}"] += getattr(crs, "hung", 0) - hung
                for reply in (t["reply"] for t in turns if t["reply"]):
                    chunk_counts[f"crs_fallbacks:{name}"] += reply["fallback"]
                    chunk_counts[f"crs_refused_items:{name}"] += len(reply["refused"])
                    chunk_counts[f"crs_cut_short:{name}"] += reply["cut_short"]
                    if reply["matched_by"] == "names":  # a CRS without ids: the places its words named
                        found = bool(reply["recommended"])
                        chunk_counts[f"crs_names_{'matched' if found else 'unmatched'}:{name}"] += 1
                        chunk_counts[f"crs_names_ambiguous:{name}"] += len(reply["ambiguous"])
                    if reply["error"]:
                        chunk_counts[f"crs_errors:{name}:{reply['error'].split(':')[0]}"] += 1
                chunk_counts = +chunk_counts  # zeros left out
                dialogues[0]["chunk_counts"] = dict(chunk_counts)  # summed by summarise: resume-proof
                with append_to(out / "turns.jsonl") as handle:
                    handle.writelines(json.dumps(t, ensure_ascii=False) + "\n" for t in turns)
                with append_to(out / "dialogues.jsonl") as handle:  # written last: the chunk is done
                    handle.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in dialogues)
        except KeyboardInterrupt:
            print("\nstopped; rerun the same command to resume", file=sys.stderr)
            raise SystemExit(130) from None
        summary = summarise(out, config, report)
    print(json.dumps(summary["crs"], indent=1))
    print(f"-> {out}/dialogues.jsonl, turns.jsonl, personas.json, summary.json")
    return summary


def main(argv: list[str] | None = None) -> None:
    """``python -m agents.converse run``'s options (agents/converse/cli.py has the verbs)."""
    parser = argparse.ArgumentParser(
        prog="python -m agents.converse run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--set", nargs="*", action="extend", help="section.field=value overrides of the config"
    )
    parser.add_argument(
        "--ratings",
        choices=["on", "off"],
        help="off: no rating is asked, only the objective figures (rating.enabled=false; a run of its own)",
    )
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if args.ratings:
        args.set = [*(args.set or []), f"rating.enabled={args.ratings == 'on'}"]
    run(args)
