"""Run a review agent over evaluation tasks: batched, resumable, errors recorded per task.

    python -m agents.review run --config configs/review/stats.yaml --data runs/demo/data/amazon \\
        --tasks runs/demo/tasks/amazon --out runs/demo/sim/stats
    python -m agents.review run --config configs/review/tuned.yaml ... --limit 50 --adapter runs/demo/sft/smollm2_lora
    python -m agents.review run --config configs/review/stats.yaml ... --visibility official   # the leaderboard's
    # a shard of a job array, then the merge (slurm/simulate.sbatch does both)
    python -m agents.review run --config ... --out runs/sim/x/shard_3 --shard 3/8
    python -m agents.review run --merge runs/sim/x/shard_* --out runs/sim/x --tasks runs/demo/tasks/amazon

RUN_DIR/predictions.jsonl gets one line per finished task as it finishes (its ids, stars, review, where
the answer came from, this task's counts and seconds); a rerun skips finished tasks and never writes
one twice (a line cut off by a kill is dropped and redone). A task that raises is written to
errors.jsonl and the run goes on. LLM answers that could not be used stay with their task
("unusable_answers").

RUN_DIR/fingerprint.json records what the run started from (agent and LLM config, the adapter's files,
the task folder, the store's build, the shard); a rerun whose inputs differ stops and names what
changed, unless --overwrite (which discards the earlier work). A rerun with nothing left to do loads no
model. At the end: output.json in the official layout and summary.json, computed from every
prediction line, so a killed and resumed run reports the same counts as an uninterrupted one.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tqdm import tqdm

from agents.config import parse_flat
from agents.llm import EXECUTION_FIELDS as LLM_EXECUTION_FIELDS
from agents.llm import LLMConfig, Sampling
from agents.review import official
from agents.review.agent import (
    COUNTS,
    MBR_FIELDS,
    POOL_VERSION,
    RULE_SAMPLING,
    AgentConfig,
    ReviewAgent,
)
from agents.review.select import chosen_for, option_name, read_rule
from agents.runs import Lock, drop_cut_line, read_jsonl
from data_prep import fingerprint
from data_prep.io import append_to, numbered_text
from data_prep.provenance import provenance
from data_prep.schema import format_utc
from data_prep.store import ReviewStore
from data_prep.tasks import read_targets, read_tasks

# Settings that change how fast a run goes, not what it predicts: left out of the fingerprint.
EXECUTION_FIELDS = {"batch_size", "gpu_memory_utilization", *LLM_EXECUTION_FIELDS}
WORK_FILES = (
    "predictions.jsonl",
    "errors.jsonl",
    "invocations.jsonl",
    "star_model.json",
    "agent_failures.jsonl",
)
PACKAGES = ["torch", "transformers", "peft", "sentence-transformers"]


@dataclass
class RunArguments:
    out: str = field(metadata={"help": "run folder"})
    data: str | None = field(default=None, metadata={"help": "build folder (data_prep.build)"})
    tasks: str | None = field(default=None, metadata={"help": "task folder (data_prep.split)"})
    limit: int | None = field(default=None, metadata={"help": "only the first N tasks"})
    shard: str | None = field(default=None, metadata={"help": "i/n: the tasks with task_id % n == i"})
    merge: list[str] | None = field(default=None, metadata={"help": "shard run folders to merge into --out"})
    overwrite: bool = field(
        default=False, metadata={"help": "discard earlier work in --out made from other inputs"}
    )


# A review config file is flat: its keys are the fields of these three (agents/config.py's parse_flat).
CONFIG_CLASSES = (AgentConfig, LLMConfig, RunArguments)


def finished(path: Path) -> dict[int, dict]:
    """Predictions already written; a last line without its newline (a kill mid-write) is cut off."""
    data = drop_cut_line(path)  # rewritten without it: the lines appended next start clean
    return {r["task_id"]: r for _, _, r in numbered_text(data.decode(), path)}


def load_tasks(args: RunArguments, visibility: str = "time-aware") -> list[dict]:
    """The task folder's tasks with their target times (targets.jsonl, written by data_prep.split).
    Under the official visibility no time is needed: an official task folder without targets.jsonl
    runs, its tasks with no moment (``ts`` None)."""
    tasks = read_tasks(args.tasks)
    targets = read_targets(args.tasks)
    missing = [t["task_id"] for t in tasks if t["task_id"] not in targets]
    if missing and not (visibility == "official" and not targets):
        raise SystemExit(
            f"error: {args.tasks}/targets.jsonl has no target time for tasks {missing[:10]}: make the "
            "tasks with data_prep.split (the agent must know what 'strictly older' means), or run an "
            "official task folder (no targets.jsonl) with --visibility official"
        )
    none = {"date": None, "ts": None}
    tasks = [{**t, **{k: targets.get(t["task_id"], none)[k] for k in ("date", "ts")}} for t in tasks]
    if args.limit is not None:
        tasks = tasks[: args.limit]
    if args.shard:
        index, count = map(int, args.shard.split("/"))
        tasks = [t for t in tasks if t["task_id"] % count == index]
    return tasks


def write_outputs(out: Path, tasks: list[dict], done: dict[int, dict], summary: dict) -> None:
    official = [
        {
            "task": {"type": t["type"], "user_id": t["user_id"], "item_id": t["item_id"]},
            "output": {"stars": done[t["task_id"]]["stars"], "review": done[t["task_id"]]["review"]},
        }
        for t in tasks
        if t["task_id"] in done
    ]
    (out / "output.json").write_text(json.dumps(official, indent=1, ensure_ascii=False))
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))


def fingerprint_inputs(agent_config: AgentConfig, llm_config: LLMConfig, args: RunArguments, store) -> dict:
    """What decides a run's predictions (see data_prep.fingerprint); a plug-in agent by its import path
    and its file's digest."""
    uses_llm = uses_an_llm(agent_config)
    keep = lambda config: {k: v for k, v in asdict(config).items() if k not in EXECUTION_FIELDS}  # noqa: E731
    build = json.loads(store.meta().get("fingerprint") or "{}")
    build.pop("inputs", None)  # file paths: the same data in another clone or mount is the same store
    agent = keep(agent_config)
    if agent_config.agent is None:  # the timeout decides which tasks fall back only for a plug-in agent
        agent.pop("agent_timeout_s")
    if agent_config.selection == "answer":  # the pool's settings decide nothing then
        agent = {k: v for k, v in agent.items() if k not in (*MBR_FIELDS, "selection")}
    agent.pop("selection_rule", None)  # by its contents (below), not its path
    if agent_config.selection == "mbr":
        agent["pool_version"] = POOL_VERSION
    return {
        "agent": agent,
        "llm": {k: v for k, v in keep(llm_config).items() if k != "adapter"} if uses_llm else None,
        "adapter": fingerprint.adapter_digest(llm_config.adapter) if uses_llm else None,
        "tasks": fingerprint.task_folder_digest(args.tasks),
        # its choices (pool and weight per group), not its validation figures: a rule chosen again
        # with the same choices resumes the run; check_rule compares what it was chosen with
        "selection_rule": rule_choices(agent_config.selection_rule),
        # which tasks draw samples under a rule (outside "agent": a rule is chosen without one)
        **({"rule_sampling": RULE_SAMPLING} if agent_config.selection_rule else {}),
        "store": hashlib.sha256(json.dumps(build, sort_keys=True).encode()).hexdigest(),
        "shard": args.shard,
        **({"plugin": plugin(agent_config)} if agent_config.agent else {}),
    }


def rule_choices(path: str | None) -> dict | None:
    """A selection rule's choices, each group's by its option name (the same choice however it is
    written: a direct pool with or without a sentiment weight); a malformed rule is a clear error."""
    if not path:
        return None
    rule = json.loads(Path(path).read_text())
    # tuned-write's weights (eval.review.selection --utility)
    if isinstance(rule, dict) and "utility" in rule:
        return {"utility": rule.get("chosen", "as written")}
    try:
        groups = read_rule(path)["groups"]
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: selection_rule {path}: {e}") from e
    return {g: option_name(c["pool"], c.get("sentiment_weight")) for g, c in groups.items()}


def check_rule(agent_config: AgentConfig, inputs: dict) -> None:
    """A selection rule chosen by eval.review.selection names what it was chosen with (``chosen_for``): a run
    with another agent config, visibility, LLM, adapter or store may not read it. A rule written by
    hand, without ``chosen_for``, is read as it is (the summary keeps it)."""
    if not agent_config.selection_rule:
        return
    recorded = json.loads(Path(agent_config.selection_rule).read_text()).get("chosen_for")
    if recorded is not None and recorded != chosen_for(inputs):
        raise SystemExit(
            f"error: {agent_config.selection_rule} was chosen on validation with another agent config, "
            "visibility, LLM, adapter or store than this run's: choose it again with this run's settings "
            "(eval.review.selection on this agent's validation run)"
        )


def uses_an_llm(agent_config: AgentConfig) -> bool:
    return agent_config.kind != "stats" or agent_config.agent is not None


def plugin(agent_config: AgentConfig) -> dict:
    """An --agent plug-in's target and file digest (agents.plugins.describe) for the fingerprint."""
    record = official.plugin_record(agent_config.agent)
    return {"target": record["target"], "sha256": record["sha256"]}


def adapter_postdates(adapter: str | None, tasks: list[dict], store: ReviewStore) -> dict | None:
    """How many tasks are at or before the latest review of this store the adapter trained on: for
    those, the adapter's weights carry information from after the task's moment (labelled, not hidden).
    An adapter trained on several stores counts only this one's reviews; one trained on none of them
    postdates no task."""
    path = Path(adapter or "") / "training_data.json"
    if not adapter or not path.exists():
        return None
    record = json.loads(path.read_text())
    ids = record.get("train_review_ids")
    if not ids:  # an older card, or pairs of another kind: the latest target of all, if recorded
        latest = record.get("latest_target_ts")
        if latest is None:
            return None
    elif (latest := store.latest_ts_of(ids)) is None:
        return {"latest_training_review": None, "tasks_at_or_before_it": 0, "tasks": len(tasks)}
    timed = [t for t in tasks if t["ts"] is not None]  # an official task folder's tasks have no moment
    return {
        "latest_training_review": format_utc(latest),
        "tasks_at_or_before_it": sum(t["ts"] <= latest for t in timed) if timed else None,
        "tasks": len(tasks),
    }


def summarise(out: Path, tasks: list[dict], done: dict[int, dict], extra: dict) -> dict:
    """The summary, from the prediction lines of the tasks in scope, so it is the same however many
    invocations (and kills) the run took."""
    rows = [done[t["task_id"]] for t in tasks if t["task_id"] in done]
    counts = Counter(dict.fromkeys(COUNTS, 0))
    for row in rows:
        counts.update(row.get("counts", {}))
    failed = {e["task_id"] for e in read_jsonl(out / "errors.jsonl")} - set(done)
    invocations = read_jsonl(out / "invocations.jsonl")
    running = sum(row.get("seconds", 0.0) for row in rows)
    star_model = out / "star_model.json"
    return {
        **extra,
        "tasks": len(tasks),
        "predicted": len(rows),
        "errors": len(failed),
        "error_task_ids": sorted(failed),
        "answers_by_source": Counter(row.get("source") for row in rows),
        "star_models_used": Counter(row.get("star_model") or "the LLM's own" for row in rows),
        "reviews_chosen_from": Counter(row["chosen_source"] for row in rows if "chosen_source" in row),
        "selections_used": Counter(row["selection"] for row in rows if row.get("selection")),
        "counts": dict(counts),
        "prompts": prompt_summary(counts),
        "invocations": len(invocations),
        "seconds_loading": round(sum(i["seconds_loading"] for i in invocations), 1),
        "seconds_running": round(running, 2),
        "seconds_per_task": round(running / len(rows), 4) if rows else None,
        "star_model": json.loads(star_model.read_text()) if star_model.exists() else None,
        "provenance": provenance(PACKAGES),
    }


def prompt_summary(counts: Counter) -> dict | None:
    """What the LLM's prompts showed (agents.review.agent.prompt_counts, summed): how many of the
    user's reviews (0 / 1 / 2+), how many showed none of a user who has older ones, the mean tokens of
    each part and the cuts made to fit; None for a run without prompts."""
    asked = sum(counts.get(f"prompt_user_reviews:{k}", 0) for k in ("0", "1", "2+"))
    if not asked:
        return None
    parts = sorted(k.split(":", 1)[1] for k in counts if k.startswith("prompt_tokens:"))
    return {
        "prompts": asked,
        "user_reviews_shown": {k: counts.get(f"prompt_user_reviews:{k}", 0) for k in ("0", "1", "2+")},
        "hiding_the_users_reviews": counts.get("prompt_hides_the_users_reviews", 0),
        "of_users_with_reviews": counts.get("prompt_user_has_reviews", 0),
        "mean_tokens": {p: round(counts[f"prompt_tokens:{p}"] / asked, 1) for p in parts},
        "cuts": {k.split(":", 1)[1]: v for k, v in counts.items() if k.startswith("prompt_cut:")},
    }


def decoding(config) -> dict:
    """How the agent's LLM calls decode (the run's record): the answer, the MBR samples, the stars."""
    answer = Sampling(config.max_new_tokens, config.temperature, seed=config.seed)
    sampled = Sampling(config.sample_max_new_tokens or config.max_new_tokens, config.sample_temperature)
    return {
        "answer": answer.settings(),
        "samples": sampled.settings() if config.selection == "mbr" and config.samples else None,
        "stars": {"read": config.llm_stars, "from": "option probabilities after 'stars: '"}
        if config.llm_stars == "expected"
        else {"read": "greedy", "from": "the answer's stars"},
    }


def prediction_row(p, seconds: float) -> dict:
    row = {
        "task_id": p.task_id,
        "user_id": p.user_id,
        "item_id": p.item_id,
        "stars": p.stars,
        "review": p.review,
        "source": p.source,
        "star_model": p.star_model,
        "counts": {k: v for k, v in p.counts.items() if v},
        "seconds": round(seconds, 4),
    }
    if p.unusable:
        row["unusable_answers"] = p.unusable
    if p.cut_short:
        row["cut_short"] = True  # the review stopped at max_new_tokens
    if p.candidates is not None:  # selection: mbr
        row["candidates"], row["chosen"] = p.candidates, p.chosen
        row["chosen_source"] = p.candidates[p.chosen]["source"]
        row["group"] = p.group
        if p.selection:
            row["selection"] = p.selection
    return row


def run(agent_config: AgentConfig, llm_config: LLMConfig, args: RunArguments) -> dict:
    """One run into ``args.out``, which one process holds at a time (a second run into the same folder
    stops with an error instead of appending to the same predictions)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with Lock(out):
        return run_locked(agent_config, llm_config, args, out)


def run_locked(agent_config: AgentConfig, llm_config: LLMConfig, args: RunArguments, out: Path) -> dict:
    tasks = load_tasks(args, agent_config.visibility)
    store = ReviewStore.open(args.data, tasks=args.tasks)
    has_work = any((out / name).exists() for name in WORK_FILES)
    inputs = fingerprint_inputs(agent_config, llm_config, args, store)
    if not fingerprint.verdict(out, inputs, overwrite=args.overwrite, has_work=has_work):
        for name in (*WORK_FILES, "output.json", "summary.json"):
            (out / name).unlink(missing_ok=True)
        print(f"--overwrite: discarded the earlier work in {out}")
    check_rule(agent_config, inputs)
    fingerprint.record(out, inputs)
    predictions_path = out / "predictions.jsonl"
    done = finished(predictions_path)
    todo = [t for t in tasks if t["task_id"] not in done]
    print(f"{len(tasks)} tasks: {len(done)} already done, {len(todo)} to run", flush=True)
    if todo:
        run_tasks(agent_config, llm_config, store, args, todo, done, out)
    else:
        print("nothing left to run: no model loaded")
    uses_llm = uses_an_llm(agent_config)
    extra = {
        "agent": asdict(agent_config),
        "visibility": agent_config.visibility,
        "llm": asdict(llm_config) if uses_llm else None,
        "decoding": decoding(agent_config) if uses_llm else None,
        "ran_now": len(todo),
        "retrieval": agent_config.retrieval,
        "plugin": official.plugin_record(agent_config.agent) if agent_config.agent else None,
        "selection_rule": json.loads(Path(agent_config.selection_rule).read_text())
        if agent_config.selection_rule
        else None,
        "adapter_training_data": adapter_postdates(llm_config.adapter, tasks, store) if uses_llm else None,
    }
    summary = summarise(out, tasks, done, extra)
    write_outputs(out, tasks, done, summary)
    c = summary["counts"]
    print(
        f"-> {predictions_path} ({summary['predicted']}/{len(tasks)} predicted, {summary['errors']} errors); "
        f"fallbacks {c['fallbacks']}, retries {c['retries']}, answers cut at max_new_tokens {c['cut_short']}"
    )
    return summary


def run_tasks(agent_config, llm_config, store, args, todo: list[dict], done: dict, out: Path) -> None:
    """Load the agent and predict ``todo`` batch by batch, appending each batch's lines (flushed)."""
    started = time.perf_counter()
    encoder = None
    if agent_config.retrieval == "embedding":
        from agents.encoders import packaged_minilm

        encoder = packaged_minilm("auto", 64)  # the GPU when there is one
    if agent_config.agent:  # an AgentSociety agent named by import path
        agent = official.OfficialAgentRunner(agent_config, llm_config, store, out, encoder)
    else:
        agent = ReviewAgent(agent_config, llm_config, store, encoder)
    (out / "star_model.json").write_text(json.dumps(agent.stars.report, indent=2, default=str))
    with append_to(out / "invocations.jsonl") as log:
        record = {
            "started_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "tasks_to_run": len(todo),
            "seconds_loading": round(time.perf_counter() - started, 2),
        }
        log.write(json.dumps(record) + "\n")
    with (
        append_to(out / "predictions.jsonl") as sink,
        append_to(out / "errors.jsonl") as error_sink,
        tqdm(total=len(todo), desc=agent_config.kind, unit=" tasks") as bar,
    ):
        for start in range(0, len(todo), agent_config.batch_size):
            batch = todo[start : start + agent_config.batch_size]
            began = time.perf_counter()
            try:
                predictions = agent.predict(batch)
            except Exception:  # one task at a time, to record exactly which ones fail
                predictions = []
                for task in batch:
                    try:
                        predictions += agent.predict([task])
                    except Exception:
                        error_sink.write(
                            json.dumps({"task_id": task["task_id"], "error": traceback.format_exc()}) + "\n"
                        )
                        error_sink.flush()
            seconds = (time.perf_counter() - began) / max(len(predictions), 1)
            for p in predictions:
                row = prediction_row(p, seconds)
                sink.write(json.dumps(row, ensure_ascii=False) + "\n")
                done[p.task_id] = row
            sink.flush()
            os.fsync(sink.fileno())
            bar.update(len(batch))


def check_complete(shards: list[str], specs: dict[str, str | None]) -> None:
    """Every shard of the run is there and finished: shards 0..N-1 of one count N (each shard's
    fingerprint says which it is), each with the summary.json its finished run writes and none held by a
    run in progress. Otherwise an error naming the missing, unfinished or running shards (nothing is
    merged)."""
    for shard in shards:  # a shard still running (rerun after it first finished) holds its folder
        if Path(shard).is_dir():
            with Lock(Path(shard)):
                pass
    found = {shard: spec for shard, spec in specs.items() if spec}
    counts = {spec.split("/")[1] for spec in found.values()}
    if len(counts) > 1:
        raise SystemExit(f"error: these shards split the tasks in different counts: {sorted(found.values())}")
    count = int(counts.pop()) if counts else 1
    indices = [int(spec.split("/")[0]) for spec in found.values()]
    missing = sorted(set(range(count)) - set(indices))
    unfinished = sorted(shard for shard in shards if not (Path(shard) / "summary.json").exists())
    if missing or unfinished:
        raise SystemExit(
            f"error: not every shard of {count} is complete: missing shards {missing or 'none'}, "
            f"unfinished {unfinished or 'none'}; nothing merged (rerun those shards, then merge again)"
        )


def merge(shards: list[str], out: Path, task_dir: str | None) -> dict:
    """Shard runs -> one run: predictions.jsonl, and with --tasks the official output.json; summary.json
    counts every shard's prediction lines. Only a whole run merges: every shard 0..N-1, finished
    (check_complete). Shards run from other inputs (their fingerprints differ in more than the shard)
    are refused; a task in two shards is an error; a task of the folder in none (one that failed in its
    shard) is reported."""
    out.mkdir(parents=True, exist_ok=True)
    with Lock(out):
        return merge_locked(shards, out, task_dir)


def merge_locked(shards: list[str], out: Path, task_dir: str | None) -> dict:
    inputs, specs = {}, {}  # each shard's fingerprint without its shard (they must agree), and its "i/N"
    for shard in shards:
        path = Path(shard) / fingerprint.FILE
        if path.exists():
            recorded = json.loads(path.read_text())["inputs"]
            specs[shard] = recorded.get("shard")
            inputs[shard] = {k: v for k, v in recorded.items() if k != "shard"}
    check_complete(shards, specs)
    for shard, shard_inputs in inputs.items():
        changed = fingerprint.differences(next(iter(inputs.values())), shard_inputs)
        if changed:
            raise SystemExit(
                f"error: {shard} was run from other inputs than {next(iter(inputs))} ({', '.join(changed)}); "
                "shards of one run must share config, adapter, tasks and store"
            )
    rows: dict[int, dict] = {}
    summaries = []
    for shard in shards:
        for task_id, row in finished(Path(shard) / "predictions.jsonl").items():
            if task_id in rows:
                raise SystemExit(f"error: task {task_id} is in two shards")
            rows[task_id] = row
        if (Path(shard) / "summary.json").exists():
            summaries.append(json.loads((Path(shard) / "summary.json").read_text()))
    with open(out / "predictions.jsonl", "w") as f:
        f.writelines(json.dumps(rows[k], ensure_ascii=False) + "\n" for k in sorted(rows))
    with open(out / "errors.jsonl", "w") as f:
        for shard in shards:
            f.writelines(json.dumps(e) + "\n" for e in read_jsonl(Path(shard) / "errors.jsonl"))
    first = summaries[0] if summaries else {}
    agent = next(iter(inputs.values()))["agent"] if inputs else first.get("agent")
    extra = {"shards": len(shards), "agent": agent, "visibility": (agent or {}).get("visibility")}
    tasks = read_tasks(task_dir) if task_dir else [{"task_id": k} for k in sorted(rows)]
    summary = summarise(out, tasks, rows, extra)
    summary["star_model"] = first.get("star_model")
    summary["seconds_loading"] = round(sum(s.get("seconds_loading", 0) for s in summaries), 1)
    if task_dir:
        summary["missing"] = [t["task_id"] for t in tasks if t["task_id"] not in rows]
        write_outputs(out, tasks, rows, summary)
    else:
        (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(f"merged {len(rows)} predictions from {len(shards)} shards -> {out / 'predictions.jsonl'}")
    if summary.get("missing"):
        print(
            f"note: {len(summary['missing'])} tasks have no prediction in any shard (listed in summary.json)"
        )
    return summary


def moved_config(argv: list[str]) -> list[str]:
    """A ``--config configs/agents/X.yaml`` that is gone read from configs/review/, with a note (the
    review configs moved there; for one release)."""
    argv = list(argv)
    for i in range(len(argv) - 1):
        if argv[i] == "--config" and "configs/agents/" in argv[i + 1] and not Path(argv[i + 1]).exists():
            argv[i + 1] = argv[i + 1].replace("configs/agents/", "configs/review/")
            print(
                f"note: the review configs moved to configs/review/; reading {argv[i + 1]}", file=sys.stderr
            )
    return argv


def main(argv: list[str] | None = None) -> dict | None:
    argv = moved_config(sys.argv[1:] if argv is None else argv)
    agent_config, llm_config, args = parse_flat(
        argv, CONFIG_CLASSES, prog="python -m agents.review run", description=__doc__.split("\n\n")[0]
    )
    if args.merge:
        return merge(args.merge, Path(args.out), args.tasks)
    if not args.data or not args.tasks:
        sys.exit("error: --data and --tasks are required (or --merge)")
    return run(agent_config, llm_config, args)


if __name__ == "__main__":
    main()
