"""All shipped agents and the model-free baselines on one task folder, scored side by side.

    python -m eval.review.suite --data runs/demo/data/amazon --tasks runs/demo/tasks/amazon \\
        --adapter runs/demo/sft/smollm2_lora --out runs/demo/suite/amazon

For each agent config in configs/review/ (stats, stats-mbr, asc-baseline, retrieval-llm, tuned, tuned-mbr):
the review runner (agents/review/simulate.py) into OUT/sim/KIND (resumable), then the shared evaluator (eval.review, offline
unless --backend official, with the fidelity report) into OUT/eval/KIND. The model-free baselines (each
user's previous review; the user's mean stars; the item's review nearest the centroid of the user's
reviews, eval.review.baselines) are scored too. Writes OUT/compare.md and compare.png (eval.review.score.compare:
the metric and the fidelity columns), OUT/agents.md (time per task, parse failures, retries, fallbacks,
the star models used, where the chosen reviews came from) and OUT/claims.md (paired differences over
the same tasks with 95% BCa bootstrap intervals, the CLAIMS below), and prints them.

The LLM agents share one answer cache, OUT/answers.sqlite (agents.llm, ``answer_cache``): a greedy
answer one agent asked (``tuned``'s answers and blend stars) is taken from it by the next agent that
asks the same backend the same thing (``tuned-mbr``, on the same tasks) instead of being generated
again; agents.md says how many answers came from it. A rerun takes them from it too (its seconds per
task are then the cache's): delete OUT/answers.sqlite to have them generated again.

``--wandb offline|online`` logs every evaluation (eval.tracking) and one suite run with the comparison
and the claims as tables, into the tuned adapter's W&B project and group.

``--set KEY=VALUE ...`` passes the review runner's settings to the LLM agents, e.g. the prompt shape an
adapter was trained with (its pairs' card.json): ``--set k_user=4 k_item=2 prompt_tokens=512``.

``--agent path/to/my_agent.py:MyAgent`` (repeatable) adds an AgentSociety agent run unchanged
(agents.review.official) as a row named after its class, with claims against stats, nearest-centroid
and the user mean on overall.

``--validation VAL`` (a folder of data_prep.split --validation-for TASKS) chooses how each MBR agent
(stats-mbr, tuned-mbr) picks its review on data like the tasks: the agent runs on VAL first
(OUT/validation/sim/KIND), eval.review.selection chooses a pool and weight per group (new item / item with
history; the nearest-centroid review unless an option beats it by a paired margin) into
OUT/validation/KIND/rule.json, and the agent runs on the tasks with that rule. Without it each agent
picks by its config's fixed pool. Nothing is chosen on the tasks that are scored.

``--visibility official`` runs every agent and baseline with the AgentSociety leaderboard's
visibility (everything but the task pairs) instead of the default time-aware one; every table says
which was used.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from agents.config import ConfigError, flat_fields, split_setting
from agents.review import simulate
from agents.review.select import option_name
from data_prep.paths import REPO_ROOT
from eval import tracking
from eval.metrics import claims_lines, paired_bootstrap
from eval.review import baselines, selection
from eval.review.score import compare, narrow, per_task_terms
from eval.review.score import main as evaluate_predictions

KINDS = ("stats", "stats-mbr", "asc-baseline", "retrieval-llm", "tuned", "tuned-mbr", "tuned-write")
DEFAULT_KINDS = KINDS
CONFIGS = REPO_ROOT / "configs" / "review"
ANSWER_CACHE = "answers.sqlite"  # in OUT: the LLM agents' greedy answers (agents.llm, answer_cache)
# (a, b, metric): the claims the suite checks, each as a paired difference over the same tasks
CLAIMS = (
    ("tuned", "stats", "review_generation"),
    ("tuned", "stats", "overall"),
    ("tuned", "nearest-centroid", "review_generation"),
    ("tuned", "nearest-centroid", "overall"),
    ("tuned-mbr", "stats", "review_generation"),
    ("tuned-mbr", "stats", "overall"),
    ("tuned-mbr", "nearest-centroid", "review_generation"),
    ("tuned-mbr", "nearest-centroid", "overall"),
    ("tuned-mbr", "tuned", "review_generation"),
    ("tuned-mbr", "stats-mbr", "review_generation"),
    ("tuned-mbr", "stats-mbr", "overall"),
    ("tuned-mbr", "user-mean", "overall"),
    ("tuned-write", "nearest-centroid", "review_generation"),
    ("tuned-write", "nearest-centroid", "overall"),
    ("tuned-write", "stats-mbr", "overall"),
    ("tuned-write", "stats", "overall"),
    ("tuned-write", "user-mean", "overall"),
    ("tuned-write", "tuned", "review_generation"),
    ("stats-mbr", "stats", "review_generation"),
    ("stats-mbr", "nearest-centroid", "overall"),
    ("tuned", "user-mean", "overall"),
    ("tuned", "asc-baseline", "overall"),
    ("tuned", "retrieval-llm", "overall"),
    ("stats", "user-mean", "preference_estimation"),
    ("stats", "nearest-centroid", "preference_estimation"),  # nearest-centroid's stars: the user's median
    ("stats", "user-mean", "overall"),
)


def generation_args(batch_size: int = 16, max_new_tokens: int = 96) -> list[str]:
    """The review runner's flags for the LLM agents; the defaults are CPU-friendly (what `make demo` uses)."""
    return f"--batch_size {batch_size} --generation_batch_size {batch_size} --max_new_tokens {max_new_tokens}".split()


def agents_table(runs: dict[str, Path]) -> str:
    rows = [
        "| agent | tasks | s/task | LLM answers | parse failures | retries (fixed) | fallbacks | cut at max tokens | user's reviews shown 0/1/2+ | stars from | reviews chosen from | visibility |",
        "|" + "---|" * 12,
    ]
    notes = []
    for name, run in runs.items():
        s = json.loads((run / "summary.json").read_text())
        c = s["counts"]
        used = sorted(s["star_models_used"].items(), key=lambda kv: -kv[1])
        stars = ", ".join(f"{model} ({n})" for model, n in used[:2]) + (" ..." if len(used) > 2 else "")
        chosen = ", ".join(f"{k} ({n})" for k, n in sorted(s.get("reviews_chosen_from", {}).items())) or "–"
        rows.append(
            f"| {name} | {s['predicted']}/{s['tasks']} | {s['seconds_per_task'] or 0:.2f} | {answers(c)} | "
            f"{c['parse_failures']} | {c['retries']} ({c['retry_successes']}) | {c['fallbacks']} | "
            f"{c['cut_short']} | {shown(s.get('prompts'))} | {stars} | {chosen} | {s['visibility']} |"
        )
        if s.get("prompts"):
            tokens = ", ".join(f"{k} {v:g}" for k, v in s["prompts"]["mean_tokens"].items() if k != "total")
            notes.append(
                f"{name}: prompts of {s['prompts']['mean_tokens'].get('total', 0):g} tokens on average ({tokens}); "
                f"{s['prompts']['hiding_the_users_reviews']} of the {s['prompts']['of_users_with_reviews']} "
                "whose user has older reviews show none of them"
            )
        rule = s.get("selection_rule")
        if rule and "utility" in rule:
            notes.append(
                f"{name}: written reviews chosen by the utility weights chosen on validation: {rule['utility']}"
            )
        elif rule:
            chosen = "; ".join(
                f"{group}: {option_name(r['pool'], r.get('sentiment_weight'))}"
                f" ({rule['validation'][group]['tasks']} validation tasks)"
                for group, r in rule["groups"].items()
            )
            notes.append(f"{name}: reviews chosen by the rule chosen on the validation tasks: {chosen}")
        trained = s.get("adapter_training_data")
        if trained and trained["latest_training_review"] is None:
            notes.append(f"{name}: the adapter trained on none of this store's reviews")
        elif trained:
            notes.append(
                f"{name}: the adapter's training reviews from this store reach {trained['latest_training_review']}; "
                f"{trained['tasks_at_or_before_it']} of {trained['tasks']} tasks are at or before that moment"
            )
    return "\n".join(rows + ([""] + notes if notes else []))


def shown(prompts: dict | None) -> str:
    """How many prompts showed 0, 1 and 2+ of the user's reviews ("–" for an agent without prompts)."""
    if not prompts:
        return "–"
    return "/".join(str(prompts["user_reviews_shown"][k]) for k in ("0", "1", "2+"))


def answers(counts: dict) -> str:
    """The LLM answers cell: how many first answers, and how many of them came from the answer cache
    (retries are counted apart, as cached_retries)."""
    kept = counts.get("cached_answers", 0)
    return f"{counts['llm_answers']}" + (f" ({kept} cached)" if kept else "")


def plugin_name(target: str) -> str:
    """A plug-in agent's row name: its class name."""
    return target.rsplit(":", 1)[1]


def claims_table(eval_root: Path, names: list[str], plugins: tuple[str, ...] = ()) -> str:
    """Each claim as a paired difference with its 95% BCa interval, and a one-sided bootstrap p-value
    ((1 + resamples <= 0) / (B + 1)) Holm-corrected over the table's claims (statsmodels), since a
    table of many claims at 95% each would find some by chance."""
    from agents.stats import holm

    terms = {name: per_task_terms(eval_root / name) for name in names}  # each samples.jsonl once
    plugged = [(p, b, "overall") for p in plugins for b in ("stats", "nearest-centroid", "user-mean")]
    claims = []
    for a, b, metric in (*CLAIMS, *plugged):
        if a in names and b in names:
            d = paired_bootstrap(terms[a], terms[b], metric)
            below = round(d["resamples"] * (1 - d["share_of_resamples_above_zero"]))
            claims.append(
                {
                    "claim": f"{a} > {b}",
                    "metric": metric,
                    "difference": d["difference"],
                    "ci": d["ci95"],
                    "confidence": 0.95,
                    "resamples_above_zero": d["share_of_resamples_above_zero"],
                    "n": d["n"],
                    "p": (1 + below) / (d["resamples"] + 1),
                }
            )
    for claim, p in zip(claims, holm([c["p"] for c in claims]), strict=True):
        claim["holm_p"] = p
    lines = claims_lines(
        claims,
        {"metric": lambda c: c["metric"]},
        after={"Holm p (one-sided)": lambda c: f"{c['holm_p']:.3f}", "n": lambda c: str(c["n"])},
        digits=4,
        interval="95% CI (paired BCa bootstrap)",
    )
    return "\n".join(lines[1:]) if lines else "No claim applies to these runs."


def score(
    tasks: Path,
    predictions: Path,
    out: Path,
    backend: str,
    data: Path,
    wandb: str = "off",
    where: dict | None = None,
) -> Path:
    """eval.review on one prediction file (with the store, for the fidelity report's copy share);
    ``where``: the W&B project and group to log into."""
    argv = ["--tasks", tasks, "--predictions", predictions, "--out", out, "--backend", backend]
    argv += ["--data", data, "--wandb", wandb, "--name", out.name]
    for flag, key in (("--wandb-project", "project"), ("--wandb-group", "group")):
        if (where or {}).get(key):
            argv += [flag, where[key]]
    evaluate_predictions([str(a) for a in argv])
    return out / "results.json"


def run_suite(
    data: Path,
    tasks: Path,
    out: Path,
    adapter: Path | None,
    kinds: tuple[str, ...] = DEFAULT_KINDS,
    extra: list[str] | None = None,
    backend: str = "offline",
    visibility: str = "time-aware",
    overwrite: bool = False,
    wandb: str = "off",
    plugins: tuple[str, ...] = (),
    validation: Path | None = None,
) -> tuple[str, str, str]:
    if {"tuned", "tuned-mbr", "tuned-write"} & set(kinds) and adapter is None:
        raise SystemExit("error: the tuned agent needs --adapter (a train.sft output folder)")
    if validation is not None:
        check_validation(validation, tasks)
    scored: dict[str, Path] = {}
    where = tracking.target(adapter)  # every evaluation in the tuned adapter's W&B project and group
    for kind in baselines.KINDS:
        predictions = out / "baselines" / f"{kind}.jsonl"
        print(f"\n--- baseline {kind}")
        baselines.main(
            [
                kind,
                "--data",
                str(data),
                "--tasks",
                str(tasks),
                "--out",
                str(predictions),
                "--visibility",
                visibility,
            ]
        )
        scored[kind] = score(tasks, predictions, out / "eval" / kind, backend, data, wandb, where)
    runs = {}
    for kind in kinds:
        print(f"\n--- agent {kind} (configs/review/{kind}.yaml)")
        run = out / "sim" / kind
        agent = ["--config", str(CONFIGS / f"{kind}.yaml"), "--data", str(data), "--visibility", visibility]
        agent += ["--overwrite", "true"] if overwrite else []
        if not kind.startswith("stats"):  # the LLM agents: greedy answers asked once for all of them
            agent += generation_args() if extra is None else extra
            agent += ["--answer_cache", str(out / ANSWER_CACHE)]
        if kind.startswith("tuned"):
            agent += ["--adapter", str(adapter)]
        if validation is not None and uses_selection(kind):
            print(f"\n--- {kind} on the validation tasks {validation}: choosing its selection rule")
            on_validation = out / "validation" / "sim" / kind
            simulate.main([*agent, "--tasks", str(validation), "--out", str(on_validation)])
            if kind == "tuned-write":
                report = selection.choose_utility(on_validation, validation, backend)
            else:
                report = selection.choose_rule(on_validation, data, validation, backend)
            rule = selection.write(report, out / "validation" / kind, on_validation, validation)
            agent += ["--selection_rule", str(rule)]
        simulate.main([*agent, "--tasks", str(tasks), "--out", str(run)])
        scored[kind] = score(
            tasks, run / "predictions.jsonl", out / "eval" / kind, backend, data, wandb, where
        )
        runs[kind] = run
    for target in plugins:
        name = plugin_name(target)
        if name in scored:
            raise SystemExit(f"error: the plug-in agent {target} is named like a shipped row ({name})")
        print(f"\n--- plug-in agent {name} ({target})")
        run = out / "sim" / name
        argv = ["--agent", target, "--data", data, "--tasks", tasks, "--out", run]
        args = [*map(str, argv), "--visibility", visibility, *(["--overwrite", "true"] if overwrite else [])]
        simulate.main(args + (generation_args() if extra is None else extra))
        scored[name] = score(
            tasks, run / "predictions.jsonl", out / "eval" / name, backend, data, wandb, where
        )
        runs[name] = run
    print("\n--- comparison (shared evaluator)")
    heading = tasks_line(tasks)
    table = compare(list(scored.values()), list(scored), out, paired=False, heading=heading)
    print(f"{heading}\n\n{narrow(list(scored.values()), list(scored))}")
    agents = agents_table(runs)
    (out / "agents.md").write_text(f"{heading}\n\n{agents}\n")
    claims = claims_table(out / "eval", list(scored), tuple(plugin_name(t) for t in plugins))
    (out / "claims.md").write_text(f"{heading}\n\n{claims}\n")
    print(
        f"\nthe wide tables: {out}/compare.md (every metric part and fidelity column), agents.md (speed, "
        "failures, where answers came from), claims.md (paired differences), compare.png"
    )
    tracking.log_run(
        wandb,
        where,
        f"suite-{out.name}",
        out,
        {},
        {
            "tasks": str(tasks),
            "data": str(data),
            "kinds": list(kinds),
            "plugins": list(plugins),
            "visibility": visibility,
            "validation": str(validation) if validation else None,
        },
        {"compare": out / "compare.png"},
        {"compare": table_rows(table), "claims": table_rows(claims)},
    )
    return table, agents, claims


def tasks_line(tasks: Path) -> str:
    """What the tables were scored on, from the task folder's manifest: split, cutoff, new-item share."""
    m = json.loads((tasks / "manifest.json").read_text())
    counts = m.get("counts") or {}
    split = m.get("strategy", "?")
    if m.get("cutoff"):
        asked = f" (asked: {m['cutoff_requested']})" if m.get("cutoff_requested") else ""
        split += f", test period from {m['cutoff']}{asked}"
    share = counts.get("new_item_share")
    new = f", {share:.0%} about a new item (no older review of it)" if share is not None else ""
    return f"Tasks: {counts.get('tasks', '?')} ({tasks.name}; {split}){new}."


def uses_selection(kind: str) -> bool:
    """Whether the kind's config chooses its review by MBR (so a selection rule applies)."""
    config = yaml.safe_load((CONFIGS / f"{kind}.yaml").read_text())
    return config.get("selection") == "mbr" or config.get("kind") == "tuned-write"


def check_validation(validation: Path, tasks: Path) -> None:
    """Refuse a validation folder that was not drawn for these tasks (by their digest, not their path)."""
    from data_prep.fingerprint import task_folder_digest

    manifest_path = validation / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    drawn_for = (manifest.get("validation_for") or {}).get("tasks_digest")
    if manifest.get("strategy") != "validation" or drawn_for != task_folder_digest(tasks):
        raise SystemExit(
            f"error: {validation} is not a validation folder drawn for {tasks} "
            f"(make one with python -m data_prep.split --validation-for {tasks})"
        )


def table_rows(text: str) -> list[dict]:
    """A markdown table as one dict per row, keyed by the header's cells."""
    lines = [line for line in text.splitlines() if line.strip()]
    return [dict(zip(cells(lines[0]), cells(line), strict=True)) for line in lines[2:]]


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True, help="build folder (data_prep.build)")
    parser.add_argument("--tasks", type=Path, required=True, help="task folder (data_prep.split)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--adapter", type=Path, help="LoRA adapter for the tuned agent (train.sft output)")
    parser.add_argument("--kinds", nargs="+", default=list(DEFAULT_KINDS), choices=KINDS)
    parser.add_argument(
        "--agent",
        action="append",
        default=[],
        metavar="FILE.py:CLASS",
        help="an AgentSociety agent to score beside the shipped ones (repeatable)",
    )
    parser.add_argument(
        "--validation",
        type=Path,
        help="validation tasks drawn for --tasks (data_prep.split --validation-for): the MBR agents' "
        "selection is chosen on them",
    )
    parser.add_argument("--backend", choices=["offline", "official"], default="offline", help="evaluator")
    parser.add_argument(
        "--visibility",
        choices=["time-aware", "official"],
        default="time-aware",
        help="time-aware: only reviews older than each target; official: everything but the task pairs",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="redo an agent's run whose inputs changed (else refused)"
    )
    parser.add_argument("--wandb", choices=tracking.MODES, default="off", help="log to W&B (eval.tracking)")
    parser.add_argument("--batch-size", type=int, default=16, help="LLM agents: tasks per batch")
    parser.add_argument("--max-new-tokens", type=int, default=96, help="LLM agents: answer length cap")
    parser.add_argument(
        "--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
        help="LLM agents: the review runner's settings (over the suite's own, such as --max-new-tokens)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    extra = generation_args(args.batch_size, args.max_new_tokens)
    known = flat_fields(simulate.CONFIG_CLASSES)
    for item in args.set:  # checked before any agent runs
        try:
            key, _ = split_setting(item)
        except ConfigError as err:
            parser.error(f"--set {err}")
        if key not in known:
            parser.error(f"--set {item}: {key} is no setting of the review runner")
    extra += ["--set", *args.set] if args.set else []  # after the suite's own flags: the user's win
    run_suite(
        args.data,
        args.tasks,
        args.out,
        args.adapter,
        tuple(args.kinds),
        extra,
        args.backend,
        args.visibility,
        args.overwrite,
        args.wandb,
        tuple(args.agent),
        args.validation,
    )


if __name__ == "__main__":
    main()
