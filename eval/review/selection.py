"""Choose how an MBR agent picks its review, on validation tasks drawn like the tasks it is scored on.

    python -m eval.review.selection --run runs/x/validation/sim/tuned-mbr --data runs/x/data \\
        --tasks runs/x/tasks_val --out runs/x/validation/tuned-mbr

``--run``: the agent (``selection: mbr``) on a validation folder (data_prep.split --validation-for),
every prediction with its pool. Each candidate of every pool is scored against its task's real review
with the evaluator's own scorers (eval.review's review-generation terms; the offline stand-ins unless
``--backend official``). Each option, every pool of agents.review.select.POOLS with every weight of
WEIGHTS, ``centroid`` (the nearest-centroid baseline's review, which every pool holds) and ``similar``
(the user's review most similar to the item, the stats agent's), then has a review-generation score
per task; and per group of tasks (new item or item with history, as the agent saw them; stars.GROUPS)
the rule is:

1. the real reviews: ``centroid`` unless a model-free option (``similar``, or a pool that chooses
   among and judges by retrieved real reviews only) beats it by a paired margin: its mean gain over
   ``centroid`` has a one-sided lower bound above zero (normal approximation) and an exact sign test
   on the tasks where it chose another review rejects "no better", both at the Bonferroni level over
   those options, on at least MIN_TASKS tasks of the group; then, of those, the option with the
   highest mean. This is the whole rule of an agent without an LLM (stats-mbr), and the same choice
   for one with it;
2. the model's text: stage 1's choice unless an option that uses the LLM's candidates (to choose or
   to judge) beats *it* by the same kind of margin, Bonferroni over those options.

So on its own validation the rule never scores below the nearest-centroid baseline's text, takes the
stats agent's text or a retrieved pool's only where that is ahead of it by the margin, and (with an LLM)
never scores below the model-free rule's; a gain on a handful of tasks is not enough. The two stages are
two questions, each at ALPHA: whether retrieval beats the baseline's review, and whether the model's
text beats what retrieval chooses; in one Bonferroni family over all the options, the many LLM options
would make the model-free choice harder to pass than for the agent without them. Only the pools whose
sources the run has compete (a run without an LLM has no generated candidates), and within a group an
option that chooses the same review as an earlier one on every task of the group is that option
(``answer`` has one candidate: its weights are one option), so the Bonferroni count is the number of
distinct options in the group's stage. Validation tasks whose target review the agent's adapter trained
on are left out and counted (build its pairs with the validation folder as --tasks to have none). The
run must have run on --tasks (by the folder's digest).

Writes OUT/rule.json (what an agent config's ``selection_rule`` reads), OUT/rule.md (per group and
stage: every option's mean, gain over what it competes against and its lower bound, and the choice)
and OUT/provenance.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from scipy.stats import binomtest, norm

from agents.encoders import packaged_minilm
from agents.retrieval import Retriever
from agents.review import write as write_utility
from agents.review.select import (
    CENTROID,
    POOLS,
    RETRIEVED,
    SIMILAR,
    SentimentByStars,
    centroid_of,
    chosen_for,
    option_name,
    reselect,
)
from agents.review.stars import GROUPS
from data_prep.fingerprint import task_folder_digest
from data_prep.io import read_jsonl
from data_prep.paths import cache_dir
from data_prep.provenance import provenance
from data_prep.store import ReviewStore
from data_prep.tasks import read_groundtruth, read_targets, read_tasks
from eval.backends import build_scorers
from eval.metrics import per_task_scores
from eval.scoring import ScoreCache, score_pairs

WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0)  # the sentiment stand-in's weight against the topic one
MIN_TASKS = 10  # a group with fewer validation tasks keeps the baseline
ALPHA = 0.05


def decide(scores: dict[str, np.ndarray], minimum: int = MIN_TASKS, against: str = CENTROID) -> dict:
    """One stage of the rule for one group: ``scores`` maps each option to its per-task review-generation
    scores (one array per option, the same tasks in the same order, ``against`` among them).

    An option passes when, at the Bonferroni level over the other options, both its mean gain's normal
    lower bound is above zero and an exact sign test on the tasks where it chose another review than
    ``against`` (gain not 0) rejects "as likely worse as better": an option that differs on a few
    tasks, all gains, has a tiny spread and would pass the normal bound alone."""
    base = scores[against]
    n, others = len(base), len(scores) - 1
    level = ALPHA / max(others, 1)
    z = float(norm.isf(level))
    table, eligible = {}, []
    for name, values in scores.items():
        gain = values - base
        mean = float(gain.mean()) if n else 0.0
        spread = float(gain.std(ddof=1)) if n > 1 else 0.0
        lower = mean - z * spread / np.sqrt(max(n, 1))
        wins, differ = int((gain > 0).sum()), int((gain != 0).sum())
        sign_p = float(binomtest(wins, differ, 0.5, alternative="greater").pvalue) if differ else 1.0
        table[name] = {
            "mean": float(values.mean()) if n else None,
            "gain": mean,
            "lower": lower,
            "differ": differ,
            "wins": wins,
            "sign_p": sign_p,
        }
        if name != against and n >= minimum and n > 1 and lower > 0 and sign_p < level:
            eligible.append(name)
    chosen = max(eligible, key=lambda k: (table[k]["mean"], k)) if eligible else against
    return {"tasks": n, "z": z, "level": level, "against": against, "chosen": chosen, "options": table}


def ladder(scores: dict[str, np.ndarray], model_free: set[str], minimum: int = MIN_TASKS) -> dict:
    """The rule for one group in its two stages (module docstring): the model-free options (and
    CENTROID) against CENTROID, then the others against that stage's choice. ``chosen`` is the last
    stage's; ``stages`` holds each stage's decide()."""
    first = decide({k: v for k, v in scores.items() if k == CENTROID or k in model_free}, minimum)
    stages = [first]
    rest = {k: v for k, v in scores.items() if k != CENTROID and k not in model_free}
    if rest:
        stages.append(decide({first["chosen"]: scores[first["chosen"]], **rest}, minimum, first["chosen"]))
    return {"tasks": first["tasks"], "chosen": stages[-1]["chosen"], "stages": stages}


def distinct_pools(present: set[str]) -> list[str]:
    """The pools that can choose from the sources present, one per distinct (choices, references)
    among those sources: without generated candidates, retrieved, both and retrieved-vs-all are one."""
    seen, pools = set(), []
    for pool, (allowed, references) in POOLS.items():
        key = (frozenset(present & set(allowed)), frozenset(present & set(references)))
        if key[0] and key not in seen:
            seen.add(key)
            pools.append(pool)
    return pools


def is_model_free(pool: str, present: set[str]) -> bool:
    """Whether ``pool`` chooses among and judges by real (retrieved) reviews only, of the sources present."""
    allowed, references = POOLS[pool]
    return (present & (set(allowed) | set(references))) <= set(RETRIEVED)


def candidate_scores(rows: list[dict], task_dir: Path, backend: str) -> list[np.ndarray]:
    """Each row's candidates scored against its task's real review: their review-generation scores."""
    texts = [c["text"] for r in rows for c in r["candidates"]]
    truths = [read_groundtruth(task_dir, r["task_id"]) for r in rows]
    true_texts = [t["review"] for r, t in zip(rows, truths, strict=True) for _ in r["candidates"]]
    zeros = [0.0] * len(texts)
    cache = ScoreCache(cache_dir() / "scores.sqlite")
    terms = score_pairs(zeros, texts, zeros, true_texts, build_scorers(backend), cache)
    rg = per_task_scores(
        {"star": terms["star_error"], "sentiment": terms["sentiment_error"], "emotion": terms["emotion_error"],
         "topic": terms["topic_error"]},
        "review_generation",
    )  # fmt: skip
    out, at = [], 0
    for r in rows:
        out.append(rg[at : at + len(r["candidates"])])
        at += len(r["candidates"])
    return out


def trained_on(run: Path) -> set[str]:
    """The review ids the run's adapter trained on (none without an adapter); an adapter without its
    training_data.json (train.sft writes it) is refused, as its training reviews cannot be left out."""
    summary = json.loads((run / "summary.json").read_text())
    adapter = (summary.get("llm") or {}).get("adapter")
    if not adapter:
        return set()
    path = Path(adapter) / "training_data.json"
    if not path.exists():
        raise SystemExit(
            f"error: {run}'s adapter {adapter} has no training_data.json here: the validation tasks it "
            "trained on cannot be left out (run from the folder the run was made in, or retrain with train.sft)"
        )
    return set(json.loads(path.read_text()).get("train_review_ids", []))


def predictions_by_task(run: Path) -> list[dict]:
    return sorted(read_jsonl(run / "predictions.jsonl", whole=True), key=lambda r: r["task_id"])


def validation_run(run: Path, task_dir: Path, rows: list[dict]) -> tuple[list[dict], dict, list[int]]:
    """The run's predictions (by task id), checked as a run over a validation folder: made on it (by its
    digest), every task predicted, the folder a validation one. Returns the rows without the tasks whose
    target the run's adapter trained on, the run's fingerprint inputs, and those left-out task ids."""
    inputs = json.loads((run / "fingerprint.json").read_text())["inputs"]
    ran_on = inputs.get("tasks")
    if ran_on != task_folder_digest(task_dir):
        raise SystemExit(f"error: {run} was not run on {task_dir} (another task folder's digest)")
    expected_ids = sorted(t["task_id"] for t in read_tasks(task_dir))
    if [r["task_id"] for r in rows] != expected_ids:  # rows are sorted by task id
        raise SystemExit(
            f"error: {run} predicted {len(rows)} of the {len(expected_ids)} validation tasks: finish the run "
            "(rerun python -m agents.review run: it resumes) before choosing a rule on it"
        )
    manifest = json.loads((task_dir / "manifest.json").read_text())
    if manifest.get("strategy") != "validation":
        raise SystemExit(
            f"error: {task_dir} is not a validation folder (data_prep.split --validation-for): a rule chosen "
            "on the tasks it is scored on would be tuned on them"
        )
    targets = read_targets(task_dir)
    trained = trained_on(run)
    left_out = [r["task_id"] for r in rows if targets[r["task_id"]]["review_id"] in trained]
    rows = [r for r in rows if r["task_id"] not in set(left_out)]
    return rows, inputs, left_out


def choose_rule(run: Path, data: Path, task_dir: Path, backend: str = "offline") -> dict:
    rows = predictions_by_task(run)
    if not rows or any("candidates" not in r for r in rows):
        raise SystemExit(f"error: {run}/predictions.jsonl has no candidate pools (run with selection: mbr)")
    if any("group" not in r for r in rows):
        raise SystemExit(
            f"error: {run} was made before pools carried their group and the nearest-centroid review: "
            "rerun the agent (python -m agents.review run ... --overwrite true)"
        )
    if missing := [r["task_id"] for r in rows if centroid_of(r) is None]:
        raise SystemExit(
            f"error: {len(missing)} tasks of {run} (e.g. {missing[0]}) have no nearest-centroid review: their "
            "user has no visible review; draw the validation folder with --min-history 1 or more"
        )
    rows, inputs, left_out = validation_run(run, task_dir, rows)
    ran_on = inputs.get("tasks")
    targets = read_targets(task_dir)
    summary = json.loads((run / "summary.json").read_text())
    official = summary["visibility"] == "official"

    by_stars = SentimentByStars.from_store(ReviewStore.open(data, tasks=task_dir))
    expected = [
        by_stars.expected(r["stars"], None if official else targets[r["task_id"]]["ts"]) for r in rows
    ]
    texts = sorted({c["text"] for r in rows for c in r["candidates"]})
    print(f"selection: {len(rows)} validation tasks, {len(texts)} candidate texts", flush=True)
    vectors = dict(zip(texts, Retriever(packaged_minilm("cpu", 64)).embed(texts), strict=True))
    scores = candidate_scores(rows, task_dir, backend)

    present = {c["source"] for r in rows for c in r["candidates"]}
    free_pools = {p for p in distinct_pools(present) if is_model_free(p, present)}
    pools = sorted(distinct_pools(present), key=lambda p: p not in free_pools)  # model-free first
    options = {CENTROID: (CENTROID, 0.0)}
    if inputs["agent"].get("candidates_user", 0) >= 1:  # the pools hold the user's most similar review
        options[SIMILAR] = (SIMILAR, 0.0)
    options.update({option_name(p, w): (p, w) for p in pools for w in WEIGHTS})
    model_free = {name for name, (p, _) in options.items() if p in free_pools or p == SIMILAR}
    chosen_by, per_option = {}, {}
    for name, (pool, weight) in options.items():
        chosen_by[name] = np.array([c["chosen"] for c in reselect(rows, vectors, expected, pool, weight)])
        per_option[name] = np.array([s[c] for s, c in zip(scores, chosen_by[name], strict=True)])
    groups = np.array([r["group"] for r in rows])
    validation, rule = {}, {}
    for group in GROUPS:
        mask, seen, distinct = groups == group, set(), {}
        for name in options:  # an option choosing what an earlier one does on every task here is that option
            if (key := tuple(chosen_by[name][mask])) not in seen:
                seen.add(key)
                distinct[name] = per_option[name][mask]
        validation[group] = ladder(distinct, model_free)
        pool, weight = options[validation[group]["chosen"]]
        rule[group] = {"pool": pool, "sentiment_weight": weight}
    return {
        "groups": rule,
        "validation": validation,
        "rule": f"per group, in two stages: {CENTROID} unless a model-free option's paired gain over it "
        f"has a one-sided {1 - ALPHA:.0%} lower bound above zero and an exact sign test on the tasks where "
        f"it differs rejects at that level (Bonferroni over those options), on >= {MIN_TASKS} tasks, then "
        "the highest mean of those; then that choice unless an option using the LLM's candidates beats it "
        "the same way (Bonferroni over those)",
        "chosen_for": chosen_for(inputs),  # the review runner refuses the rule in a run with other settings
        "validation_tasks_digest": ran_on,  # the folder by its contents: paths are in provenance.json
        "validation_tasks": len(rows),
        "left_out_adapter_trained": len(left_out),
        "backend": backend,
        "visibility": summary["visibility"],
    }


# tuned-write (--utility): the weightings of agents.review.write's features that compete, each a named
# option; "greedy" (every weight 0: the first eligible candidate, the greedy answer unless it copies or
# loops) is what the others must beat
UTILITIES = {
    "greedy": {"consensus": 0.0},
    "consensus": {"consensus": 1.0},
    "sentiment": {"sentiment": 1.0},
    "topic": {"user_topic": 1.0, "item_topic": 1.0},
    "emotion": {"user_emotion": 1.0, "item_emotion": 1.0},
    "length": {"user_length": 1.0},
    "all": dict.fromkeys(write_utility.FEATURES, 1.0),
    "all, sentiment x4": {**dict.fromkeys(write_utility.FEATURES, 1.0), "sentiment": 4.0},
}


def choose_utility(run: Path, task_dir: Path, backend: str = "offline") -> dict:
    """tuned-write's utility weights, on its run over a validation folder: each weighting of UTILITIES
    rechooses every pool from the features the agent kept (no model call), its choices are scored
    against the real reviews (review generation), and ``greedy`` stands unless another weighting beats it
    by decide()'s paired margin (Bonferroni over the others). The tasks whose target the adapter trained
    on are left out, as for choose_rule."""
    rows = predictions_by_task(run)
    if not rows or any(
        not r.get("candidates") or set(r["candidates"][0].get("features", {})) != set(write_utility.FEATURES)
        for r in rows
    ):
        raise SystemExit(
            f"error: {run}/predictions.jsonl has no written pools with the features {write_utility.FEATURES} "
            "(kind tuned-write; a run from before a feature was added must be rerun)"
        )
    rows, inputs, left_out = validation_run(run, task_dir, rows)
    scores = candidate_scores(rows, task_dir, backend)
    per_option = {}
    for name, weights in UTILITIES.items():
        picks = []
        for r in rows:
            values = {k: [c["features"][k] for c in r["candidates"]] for k in write_utility.FEATURES}
            eligible = [not (c["copied"] or c["loops"]) for c in r["candidates"]]
            picks.append(write_utility.choose(values, weights, eligible))
        per_option[name] = np.array([s[k] for s, k in zip(scores, picks, strict=True)])
    decision = decide(per_option, against="greedy")
    return {
        "utility": UTILITIES[decision["chosen"]],
        "chosen": decision["chosen"],
        "validation": decision,
        "rule": "greedy (the first eligible written review) unless a weighting's paired gain in review "
        f"generation has a one-sided {1 - ALPHA:.0%} lower bound above zero and an exact sign test rejects "
        f"at that level (Bonferroni over the weightings), on >= {MIN_TASKS} tasks; then the highest mean",
        "chosen_for": chosen_for(inputs),
        "validation_tasks_digest": inputs.get("tasks"),
        "validation_tasks": len(rows),
        "left_out_adapter_trained": len(left_out),
        "backend": backend,
    }


def utility_table(report: dict) -> str:
    v = report["validation"]
    lines = [
        f"tuned-write's utility on {v['tasks']} validation tasks: chosen **{v['chosen']}** "
        f"({json.dumps(report['utility'])})",
        "",
        "| weighting | RG | gain over greedy | one-sided lower bound | tasks differing (gains) | sign-test p |",
        "|---|---|---|---|---|---|",
    ]
    for name, o in sorted(v["options"].items(), key=lambda kv: -(kv[1]["mean"] or 0)):
        lines.append(
            f"| {name} | {o['mean']:.4f} | {o['gain']:+.4f} | {o['lower']:+.4f} | {o['differ']} ({o['wins']}) "
            f"| {o['sign_p']:.3g} |"
        )
    return "\n".join(lines) + "\n"


def table(report: dict) -> str:
    lines = []
    titles = ("the real reviews against centroid", "the model's candidates against stage 1's choice")
    for group, v in report["validation"].items():
        lines += [f"**{group}** ({v['tasks']} validation tasks): chosen **{v['chosen']}**", ""]
        for title, stage in zip(titles, v["stages"], strict=False):
            lines += [
                f"Stage: {title} (z {stage['z']:.3f}): **{stage['chosen']}**",
                "",
                f"| option | RG | gain over {stage['against']} | one-sided lower bound | tasks differing (gains) "
                "| sign-test p |",
                "|---|---|---|---|---|---|",
            ]
            for name, o in sorted(stage["options"].items(), key=lambda kv: -(kv[1]["mean"] or 0)):
                mean = f"{o['mean']:.4f}" if o["mean"] is not None else "–"
                lines.append(
                    f"| {name} | {mean} | {o['gain']:+.4f} | {o['lower']:+.4f} | {o['differ']} ({o['wins']}) "
                    f"| {o['sign_p']:.3g} |"
                )
            lines.append("")
    return "\n".join(lines)


def write(report: dict, out: Path, run: Path, task_dir: Path) -> Path:
    """rule.json holds only what the choice depends on (the same inputs give the same bytes wherever the
    folders are, so a run that reads it resumes); which run and folder, and when, are in provenance.json."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "rule.json").write_text(json.dumps(report, indent=2))
    (out / "rule.md").write_text(utility_table(report) if "utility" in report else table(report))
    where = {"run": str(run), "tasks": str(task_dir), **provenance()}
    (out / "provenance.json").write_text(json.dumps(where, indent=2))
    return out / "rule.json"


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--run", type=Path, required=True, help="a run of python -m agents.review run with selection: mbr"
    )
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--tasks", type=Path, required=True, help="the validation folder it ran on")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backend", choices=["offline", "official"], default="offline")
    parser.add_argument(
        "--utility", action="store_true", help="a tuned-write run: choose its utility's weights (UTILITIES)"
    )
    args = parser.parse_args(argv)
    if args.utility:
        report = choose_utility(args.run, args.tasks, args.backend)
        path = write(report, args.out, args.run, args.tasks)
        print(utility_table(report) + f"-> {path}")
        return path
    report = choose_rule(args.run, args.data, args.tasks, args.backend)
    path = write(report, args.out, args.run, args.tasks)
    print(table(report) + f"-> {path}")
    return path


if __name__ == "__main__":
    main()
