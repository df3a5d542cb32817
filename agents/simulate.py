"""Run a review agent over evaluation tasks: batched, resumable, errors recorded per task.

    python -m agents.simulate --config configs/agents/stats.yaml --data runs/demo/data/amazon \\
        --tasks runs/demo/tasks/amazon --out runs/demo/sim/stats
    python -m agents.simulate --config configs/agents/tuned.yaml ... --limit 50 --adapter runs/demo/sft/smollm2_lora
    # a shard of a job array, then the merge (slurm/simulate.sbatch does both)
    python -m agents.simulate --config ... --out runs/sim/x/shard_3 --shard 3/8
    python -m agents.simulate --merge runs/sim/x/shard_* --out runs/sim/x --tasks runs/demo/tasks/amazon

RUN_DIR/predictions.jsonl gets one line per finished task as it finishes; a rerun skips finished tasks
and never writes one twice (a line cut off by a kill is dropped and redone). A task that raises is
written to errors.jsonl and the run goes on. LLM answers that could not be used (no stars, stars
outside 1-5, no review) stay with their task, in the prediction's "unusable_answers". At the end:
output.json in the official layout
(``[{"task": {...}, "output": {"stars", "review"}}]``) and summary.json (counts, parse failures,
retries, fallbacks, seconds per task, the star model's validation report, provenance).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from agents.agent import AgentConfig, ReviewAgent
from agents.llm import LLMConfig
from data_prep.provenance import provenance
from data_prep.store import ReviewStore
from data_prep.tasks import read_targets, read_tasks


@dataclass
class RunArguments:
    out: str = field(metadata={"help": "run folder"})
    data: str | None = field(default=None, metadata={"help": "build folder (data_prep.build)"})
    tasks: str | None = field(default=None, metadata={"help": "task folder (data_prep.split)"})
    limit: int | None = field(default=None, metadata={"help": "only the first N tasks"})
    shard: str | None = field(default=None, metadata={"help": "i/n: the tasks with task_id % n == i"})
    merge: list[str] | None = field(default=None, metadata={"help": "shard run folders to merge into --out"})


def finished(path: Path) -> dict[int, dict]:
    """Predictions already written; a last line without its newline (a kill mid-write) is cut off."""
    if not path.exists():
        return {}
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    rows = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    return {r["task_id"]: r for r in rows}


def load_tasks(args: RunArguments) -> list[dict]:
    tasks = read_tasks(args.tasks)
    targets = read_targets(args.tasks)
    missing = [t["task_id"] for t in tasks if t["task_id"] not in targets]
    if missing:
        raise SystemExit(
            f"error: {args.tasks}/targets.jsonl has no target time for tasks {missing[:10]}: make the "
            "tasks with data_prep.split (the agent must know what 'strictly older' means)"
        )
    tasks = [{**t, "date": targets[t["task_id"]]["date"]} for t in tasks]
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


def run(agent_config: AgentConfig, llm_config: LLMConfig, args: RunArguments) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tasks = load_tasks(args)
    predictions_path = out / "predictions.jsonl"
    done = finished(predictions_path)
    todo = [t for t in tasks if t["task_id"] not in done]
    print(f"{len(tasks)} tasks: {len(done)} already done, {len(todo)} to run", flush=True)

    started = time.perf_counter()
    store = ReviewStore.open(args.data, tasks=args.tasks)
    encoder = None
    if agent_config.retrieval == "embedding":
        from eval.backends import packaged_minilm

        encoder = packaged_minilm("cpu", 64)
    agent = ReviewAgent(agent_config, llm_config, store, encoder)
    loaded = time.perf_counter()
    errors = 0
    with (
        open(predictions_path, "a") as sink,
        open(out / "errors.jsonl", "a") as error_sink,
        tqdm(total=len(todo), desc=agent_config.kind, unit=" tasks") as bar,
    ):
        for start in range(0, len(todo), agent_config.batch_size):
            batch = todo[start : start + agent_config.batch_size]
            try:
                predictions = agent.predict(batch)
            except Exception:  # one task at a time, to record exactly which ones fail
                predictions = []
                for task in batch:
                    try:
                        predictions += agent.predict([task])
                    except Exception:
                        errors += 1
                        error_sink.write(
                            json.dumps({"task_id": task["task_id"], "error": traceback.format_exc()}) + "\n"
                        )
            for p in predictions:
                row = {"task_id": p.task_id, "stars": p.stars, "review": p.review, "source": p.source}
                if p.unusable:
                    row["unusable_answers"] = p.unusable
                if p.cut_short:
                    row["cut_short"] = True  # the review stopped at max_new_tokens
                sink.write(json.dumps(row, ensure_ascii=False) + "\n")
                done[p.task_id] = row
            sink.flush()
            os.fsync(sink.fileno())
            bar.update(len(batch))
    elapsed = time.perf_counter() - loaded
    sources = Counter(row.get("source") for row in done.values())
    summary = {
        "agent": asdict(agent_config),
        "llm": {**asdict(llm_config), "api_key_env": llm_config.api_key_env}
        if agent_config.kind != "stats"
        else None,
        "tasks": len(tasks),
        "predicted": sum(t["task_id"] in done for t in tasks),
        "errors": errors,
        "ran_now": len(todo),
        "answers_by_source": sources,
        "counts": agent.counts,
        "seconds_loading": round(loaded - started, 1),
        "seconds_running": round(elapsed, 2),
        "seconds_per_task": round(elapsed / len(todo), 4) if todo else None,
        "star_model": agent.stars.report,
        "retrieval": agent.retriever.method,
        "provenance": provenance(["torch", "transformers", "peft", "sentence-transformers"]),
    }
    write_outputs(out, tasks, done, summary)
    print(
        f"-> {predictions_path} ({summary['predicted']}/{len(tasks)} predicted, {errors} errors); "
        f"fallbacks {agent.counts['fallbacks']}, retries {agent.counts['retries']}, "
        f"answers cut at max_new_tokens {agent.counts['cut_short']}"
    )
    return summary


def merge(shards: list[str], out: Path, task_dir: str | None) -> dict:
    """Shard runs -> one run: predictions.jsonl, and with --tasks the official output.json; summary.json
    adds up the shards' counts. A task in two shards, or a task of the folder in none, is reported."""
    out.mkdir(parents=True, exist_ok=True)
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
    summary = {
        "shards": len(shards),
        "predicted": len(rows),
        "errors": sum(s["errors"] for s in summaries),
        "counts": {k: sum(s["counts"][k] for s in summaries) for k in summaries[0]["counts"]}
        if summaries
        else {},
        "agent": summaries[0]["agent"] if summaries else None,
        "provenance": provenance(["torch", "transformers", "peft", "sentence-transformers"]),
    }
    if task_dir:
        tasks = read_tasks(task_dir)
        summary["tasks"] = len(tasks)
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


def main(argv: list[str] | None = None) -> dict | None:
    from trl import TrlParser

    parser = TrlParser((AgentConfig, LLMConfig, RunArguments))
    agent_config, llm_config, args = parser.parse_args_and_config(args=argv)
    if args.merge:
        return merge(args.merge, Path(args.out), args.tasks)
    if not args.data or not args.tasks:
        sys.exit("error: --data and --tasks are required (or --merge)")
    return run(agent_config, llm_config, args)


if __name__ == "__main__":
    main()
