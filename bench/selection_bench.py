"""What each candidate pool adds: re-choose the reviews of a ``tuned-mbr`` run (every prediction keeps
its pool) under each pool of agents.review.select.POOLS (generated only, retrieved only, both, real
or generated reviews judged against every candidate, and the agent's own answer without selection), with
each sentiment weight, and score every
variant with the shared evaluator. The weight of each pool is cross-fitted:
the tasks are split in two folds by a hash of their id, and each fold gets the weight that scored best
on the *other* fold's ground truth, so no task's own truth chooses anything for it.

    python -m bench.selection_bench --run runs/quality/amazon/suite_all/sim/tuned-mbr \\
        --data runs/quality/amazon/data --tasks runs/quality/amazon/tasks_all --out runs/quality/amazon/selection

Writes OUT/<pool>.jsonl (cross-fitted predictions, with the weight each fold got), OUT/eval/<pool>/
(eval.review), OUT/selection.json and OUT/selection.md: per pool the metric, the fidelity figures, the
share of chosen reviews that are real (retrieved) ones, and paired differences (95% BCa) of the pools
against each other and against the reference runs given with --against NAME=RESULTS_DIR.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from agents.retrieval import Retriever
from agents.review.select import POOLS, RETRIEVED, SentimentByStars, reselect
from data_prep.provenance import provenance
from data_prep.store import ReviewStore
from data_prep.tasks import read_targets
from eval import review
from eval.metrics import paired_bootstrap, per_task_scores
from eval.review import per_task_terms

WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0)


def fold(task_id) -> int:
    return hashlib.sha256(str(task_id).encode()).digest()[0] % 2


def write(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def score(tasks: Path, predictions: Path, out: Path, data: Path) -> Path:
    review.main(
        ["--tasks", str(tasks), "--predictions", str(predictions), "--out", str(out), "--data", str(data)]
    )
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=Path, required=True, help="an agents.simulate run with selection: mbr")
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--against", nargs="*", default=[], help="NAME=EVAL_DIR of reference runs (eval.review)"
    )
    args = parser.parse_args(argv)

    rows = sorted(
        map(json.loads, (args.run / "predictions.jsonl").read_text().splitlines()), key=lambda r: r["task_id"]
    )
    if not rows or "candidates" not in rows[0]:
        raise SystemExit(
            f"error: {args.run}/predictions.jsonl has no candidate pools (run with selection: mbr)"
        )
    summary = json.loads((args.run / "summary.json").read_text())
    official = summary["visibility"] == "official"
    from eval.backends import packaged_minilm

    by_stars = SentimentByStars.from_store(ReviewStore.open(args.data, tasks=args.tasks))
    moments = read_targets(args.tasks)
    targets = [by_stars.expected(r["stars"], None if official else moments[r["task_id"]]["ts"]) for r in rows]
    texts = sorted({c["text"] for r in rows for c in r["candidates"]})
    print(f"embedding {len(texts)} candidate texts ...", flush=True)
    vectors = dict(zip(texts, Retriever(packaged_minilm("cpu", 64)).embed(texts), strict=True))

    grid: dict[tuple[str, float], dict[str, np.ndarray]] = {}  # per-task terms of each variant
    chosen: dict[tuple[str, float], list[dict]] = {}  # each variant's predictions, in the order of rows
    for pool in POOLS:
        for weight in WEIGHTS:
            name = f"{pool}_w{weight:g}"
            chosen[pool, weight] = reselect(rows, vectors, targets, pool, weight)
            predictions = write(args.out / "grid" / f"{name}.jsonl", chosen[pool, weight])
            (args.out / "grid" / f"{name}.summary.json").write_text(
                json.dumps({"visibility": summary["visibility"]})
            )
            grid[pool, weight] = per_task_terms(
                score(args.tasks, predictions, args.out / "grid" / "eval" / name, args.data)
            )
            if grid[pool, weight]["task_id"].tolist() != [r["task_id"] for r in rows]:
                raise SystemExit(f"error: {name} was scored on other tasks than the run's")
    folds = np.array([fold(r["task_id"]) for r in rows])
    results, chosen_weights = {}, {}
    for pool in POOLS:
        weight_for = {}
        for k in (0, 1):  # the weight with the best review generation on the other fold
            other = folds != k
            weight_for[k] = max(
                WEIGHTS, key=lambda w: per_task_scores(grid[pool, w], "review_generation")[other].mean()
            )
        chosen_weights[pool] = {f"fold {k}": w for k, w in weight_for.items()}
        merged = [
            dict(chosen[pool, weight_for[f]][i], sentiment_weight=weight_for[f]) for i, f in enumerate(folds)
        ]
        predictions = write(args.out / f"{pool}.jsonl", merged)
        (args.out / f"{pool}.summary.json").write_text(json.dumps({"visibility": summary["visibility"]}))
        results[pool] = score(args.tasks, predictions, args.out / "eval" / pool, args.data)
        real = sum(r["chosen_source"] in RETRIEVED for r in merged)
        chosen_weights[pool]["real_reviews_chosen"] = real / len(merged)
    references = dict(item.split("=", 1) for item in args.against)
    table = [
        "| run | n | PE | RG | overall | stars W1 | length KS | distinct-2 | repeated | copied | real reviews chosen | weight (fold 0 / 1) |",
        "|" + "---|" * 12,
    ]
    for name, folder in [*results.items(), *((k, Path(v)) for k, v in references.items())]:
        r = json.loads((Path(folder) / "results.json").read_text())
        f = r.get("fidelity") or {}  # a reference scored without the store (--data) has no copy share
        w = chosen_weights.get(name)
        real = f"{w['real_reviews_chosen']:.1%}" if w else "–"
        weights = f"{w['fold 0']:g} / {w['fold 1']:g}" if w else "–"
        figures = [
            f"{f[k]:{spec}}" if f.get(k) is not None else "–"
            for k, spec in [("star_wasserstein", ".3f"), ("length_ks", ".3f"), ("distinct_2", ".3f"),
                            ("repeated_share", ".1%"), ("copied_share", ".1%")]
        ]  # fmt: skip
        table.append(
            f"| {name} | {r['n']} | {r['preference_estimation']:.4f} | {r['review_generation']:.4f} | "
            f"{r['overall']:.4f} | {' | '.join(figures)} | {real} | {weights} |"
        )
    # does the LLM add anything over the real reviews: as choices (both), as evidence (retrieved-vs-all)
    pairs = [("both", "retrieved"), ("retrieved-vs-all", "retrieved"), ("both", "generated")]
    pairs += [("generated-vs-all", "generated"), ("generated", "retrieved"), ("both", "answer")]
    pairs += [(p, ref) for p in POOLS for ref in references]
    claims = ["| claim | metric | difference | 95% CI (paired BCa) | n |", "|---|---|---|---|---|"]
    paired = {}
    every = {**results, **{k: Path(v) for k, v in references.items()}}
    terms = {name: per_task_terms(folder) for name, folder in every.items()}  # each samples.jsonl once
    for a, b in pairs:
        ta, tb = terms[a], terms[b]
        if ta["task"].tolist() != tb["task"].tolist():
            raise SystemExit(f"error: {a} and {b} were scored on different tasks")
        for metric in ("review_generation", "overall"):
            d = paired_bootstrap(ta, tb, metric)
            paired[f"{a} > {b} ({metric})"] = d
            claims.append(
                f"| {a} > {b} | {metric} | {d['difference']:+.4f} | [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}] | {d['n']} |"
            )
    text = "\n".join(table) + "\n\n" + "\n".join(claims) + "\n"
    (args.out / "selection.md").write_text(text)
    report = {"weights": chosen_weights, "paired": paired, "run": str(args.run), "provenance": provenance()}
    (args.out / "selection.json").write_text(json.dumps(report, indent=2))
    print(text)
    return report


if __name__ == "__main__":
    main()
