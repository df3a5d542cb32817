"""Score review-simulation predictions with the AgentSociety Challenge metrics.

    # offline (no network): exact VADER, stand-in topic and emotion models, each labelled as such
    python -m eval.review --tasks runs/tasks/yelp --predictions runs/sim/predictions.jsonl --out runs/eval/x
    # the official models by hub id, pinned revisions, on a GPU when there is one
    python -m eval.review --tasks TASK_DIR --predictions PRED.jsonl --out OUT_DIR --backend official
    # a local emotion or topic model folder in place of either
    python -m eval.review ... --emotion-model path/to/roberta --topic-model path/to/sbert
    # several results side by side: OUT_DIR/compare.md and compare.png; when they scored the same tasks,
    # compare.md also has each run minus the first with paired 95% intervals
    python -m eval.review --compare runs/eval/a/results.json runs/eval/b/results.json --out runs/eval/cmp
    # with the build folder, the fidelity report also counts verbatim copies of the store's reviews, and
    # the tasks whose item has no review older than the target are counted and scored apart ("new items");
    # --wandb offline|online logs it all to W&B (the adapter's training project and group when known)
    python -m eval.review ... --data runs/data/yelp --wandb offline

Writes OUT_DIR/results.json (PE, RG, overall, the three error terms, n, SIM/REAL and per-source
breakdowns, counts, the visibility the predictions were made under (from their run's summary),
provenance), the fidelity report (eval.review.fidelity: how the simulated reviews and stars compare with the
real ones as populations), OUT_DIR/samples.jsonl (every per-task term) and three PNGs
(star_confusion.png, text_errors.png, fidelity.png). Per-text model outputs are cached in $USERSIM_CACHE/scores.sqlite
(keyed by the exact scorer and the text), so the ground truth is encoded once across runs (--no-cache).

Problems are errors, never silent: predictions missing for some tasks (unless --allow-missing, which
scores them as the official evaluator does: 0 stars and an empty review), duplicate or unknown tasks,
stars that are not numbers. Stars outside [0, 5] are clipped, as the official evaluator does, and
counted and listed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from data_prep.io import read_jsonl
from data_prep.paths import cache_dir
from data_prep.provenance import provenance
from data_prep.tasks import read_groundtruth, read_targets, read_tasks
from eval import plots, tracking
from eval.backends import build_scorers
from eval.metrics import paired_bootstrap
from eval.review.fidelity import fidelity
from eval.review.predictions import PredictionError, align, read_predictions, run_visibility
from eval.scoring import ScoreCache, emotion_dict, score_pairs, summarise

PACKAGES = [
    "torch",
    "transformers",
    "sentence-transformers",
    "nltk",
    "scikit-learn",
    "numpy",
    "vadersentiment",
]


def load_truth(task_dir: Path, tasks: list[dict]) -> tuple[list[float], list[str]]:
    if not any((Path(task_dir) / "groundtruth").glob("groundtruth_*.json")):
        raise SystemExit(
            f"nothing to score: {task_dir} has no groundtruth/ answers (an official task folder: send the "
            "run's output.json to the challenge's evaluator)"
        )
    missing = [
        t["task_id"]
        for t in tasks
        if not (Path(task_dir) / "groundtruth" / f"groundtruth_{t['task_id']}.json").exists()
    ]
    if missing:
        raise PredictionError(
            f"{task_dir}/groundtruth/ has no answer for tasks {missing[:10]} ({len(missing)} missing)"
        )
    stars, texts = [], []
    for task in tasks:
        truth = read_groundtruth(task_dir, task["task_id"])
        if not isinstance(truth.get("stars"), int | float) or not isinstance(truth.get("review"), str):
            raise PredictionError(
                f"{task_dir}/groundtruth/groundtruth_{task['task_id']}.json: needs numeric stars and a review"
            )
        stars.append(float(truth["stars"]))
        texts.append(truth["review"])
    return stars, texts


def evaluate(args: argparse.Namespace) -> dict:
    started = time.perf_counter()
    all_tasks = read_tasks(args.tasks)
    predictions, missing, outside = align(
        all_tasks, read_predictions(args.predictions), allow_missing=args.allow_missing, limit=args.limit
    )
    tasks = all_tasks[: args.limit] if args.limit is not None else all_tasks
    true_stars, true_texts = load_truth(args.tasks, tasks)
    pred_stars = [p["stars"] if p else 0.0 for p in predictions]
    pred_texts = [p["review"] if p else "" for p in predictions]

    print(f"loading the {args.backend} scorers ...", flush=True)
    scorers = build_scorers(
        args.backend,
        emotion_model=args.emotion_model,
        topic_model=args.topic_model,
        device=args.device,
        batch_size=args.batch_size,
    )
    loaded = time.perf_counter()
    cache = None if args.no_cache else ScoreCache(cache_dir() / "scores.sqlite")
    print(f"scoring {len(tasks)} tasks ...", flush=True)
    terms = score_pairs(pred_stars, pred_texts, true_stars, true_texts, scorers, cache)
    scored = time.perf_counter()

    targets = read_targets(args.tasks)
    sources = np.array([targets.get(t["task_id"], {}).get("source") or "unknown" for t in tasks])
    is_sim = np.array([t.get("data type") == "sim" for t in tasks])
    out_of_range = [t["task_id"] for t, bad in zip(tasks, terms["stars_out_of_range"], strict=True) if bad]
    empty = [t["task_id"] for t, text in zip(tasks, pred_texts, strict=True) if not text.strip()]
    store_texts, new_item = None, None
    if args.data:
        from data_prep.store import ReviewStore

        store = ReviewStore.open(args.data, tasks=args.tasks)  # what a prediction could copy: pairs blocked
        store_texts = [r["text"] for r in store.visible_reviews()]
        new_item = new_items(store, tasks, targets)
        store.close()

    results = {
        **summarise(terms),
        "breakdown": {
            "sim": summarise(terms, is_sim) if is_sim.any() else None,
            "real": summarise(terms, ~is_sim) if is_sim.any() else None,
            "by_source": {s: summarise(terms, sources == s) for s in sorted(set(sources))},
            # the item had no review older than the target (what a time-aware prediction can know of it)
            "new_items": summarise(terms, new_item) if new_item is not None and new_item.any() else None,
            "items_with_history": summarise(terms, ~new_item)
            if new_item is not None and (~new_item).any()
            else None,
        },
        "counts": {
            "tasks": len(tasks),
            "tasks_in_folder": len(all_tasks),
            "predictions_scored": len(tasks) - len(missing),
            "predictions_outside_limit": outside,
            "missing_scored_as_empty": len(missing),
            "missing_task_ids": missing,
            "empty_reviews": len(empty),
            "empty_review_task_ids": empty,
            "stars_out_of_range": len(out_of_range),
            "stars_out_of_range_task_ids": out_of_range,
            "new_items": None if new_item is None else int(new_item.sum()),
        },
        "fidelity": fidelity(pred_stars, pred_texts, true_stars, true_texts, store_texts),
        "visibility": run_visibility(args.predictions),
        "backend": args.backend,
        "scorers": scorers.info,
        "timing": {
            "load_seconds": round(loaded - started, 2),
            "score_seconds": round(scored - loaded, 2),
            "pairs_per_second_excluding_load": round(len(tasks) / (scored - loaded), 1),
            "cache": {"texts_reused": cache.hits, "texts_scored": cache.misses} if cache else "off",
        },
        "inputs": {
            "tasks": str(args.tasks),
            "predictions": str(args.predictions),
            "data": str(args.data) if args.data else None,
            "limit": args.limit,
        },
        "provenance": provenance(PACKAGES),
    }
    write_outputs(
        args.out,
        results,
        tasks,
        terms,
        pred_stars,
        pred_texts,
        true_stars,
        true_texts,
        sources,
        is_sim,
        predictions,
    )
    return results


def new_items(store, tasks: list[dict], targets: dict) -> np.ndarray:
    """Per task: whether its item has no visible review strictly older than the task's target (a new
    item as of the task's moment; the task pairs are blocked)."""
    return np.array(
        [
            t["task_id"] in targets
            and not store.has_reviews(item_id=t["item_id"], before=targets[t["task_id"]]["ts"])
            for t in tasks
        ],
        dtype=bool,
    )


def write_outputs(
    out, results, tasks, terms, pred_stars, pred_texts, true_stars, true_texts, sources, is_sim, predictions
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "samples.jsonl", "w") as f:
        for i, task in enumerate(tasks):
            row = {
                "task_id": task["task_id"],
                "user_id": task["user_id"],
                "item_id": task["item_id"],
                "source": str(sources[i]),
                "sim": bool(is_sim[i]),
                "missing": predictions[i] is None,
                "true_stars": true_stars[i],
                "pred_stars": pred_stars[i],
                "pred_stars_clipped": float(terms["stars_clipped"][i]),
                "star_error": float(terms["star_error"][i]),
                "sentiment_pred": float(terms["sentiment_pred"][i]),
                "sentiment_true": float(terms["sentiment_true"][i]),
                "sentiment_error": float(terms["sentiment_error"][i]),
                "emotion_pred": emotion_dict(terms["emotion_pred"][i]),
                "emotion_true": emotion_dict(terms["emotion_true"][i]),
                "emotion_error": float(terms["emotion_error"][i]),
                "topic_error": float(terms["topic_error"][i]),
                "pred_review": pred_texts[i],
                "true_review": true_texts[i],
            }
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    plots.star_confusion(np.array(true_stars), terms["stars_clipped"], out / "star_confusion.png")
    plots.error_histograms(terms, out / "text_errors.png")
    plots.fidelity(np.array(true_stars), terms["stars_clipped"], true_texts, pred_texts, out / "fidelity.png")


def per_task_terms(eval_dir: Path) -> dict[str, np.ndarray]:
    """The per-task error terms of an eval.review folder, by task id, with the ids (``task_id``) and
    the tasks themselves (``task``: id, user and item, so runs on other task folders do not pair)."""
    rows = sorted(read_jsonl(eval_dir / "samples.jsonl", whole=True), key=lambda r: r["task_id"])
    terms = {t: np.array([r[f"{t}_error"] for r in rows]) for t in ("star", "sentiment", "emotion", "topic")}
    tasks = np.array([f"{r['task_id']}:{r.get('user_id')}:{r.get('item_id')}" for r in rows])
    return {**terms, "task_id": np.array([r["task_id"] for r in rows]), "task": tasks}


def paired_table(names: list[str], folders: list[Path]) -> str:
    """Each run minus the first, per metric, on the same tasks (paired BCa bootstrap over tasks); a
    line saying why not when a folder has no per-task samples, a row when a run scored other tasks."""
    if not all((f / "samples.jsonl").exists() for f in folders):
        return "Not paired: a run has no samples.jsonl beside its results.json."
    first = per_task_terms(folders[0])
    rows = [
        f"| run − {names[0]} (paired BCa 95% CI) | n | PE | RG | overall |",
        "|---|---|---|---|---|",
    ]
    for name, folder in zip(names[1:], folders[1:], strict=True):
        terms = per_task_terms(folder)
        if terms["task"].tolist() != first["task"].tolist():
            rows.append(f"| {name} | not paired: other tasks than {names[0]}'s | – | – | – |")
            continue
        cells = []
        for metric in ("preference_estimation", "review_generation", "overall"):
            d = paired_bootstrap(terms, first, metric)
            cells.append(f"{d['difference']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]")
        rows.append(f"| {name} | {len(first['task_id'])} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def narrow(paths: list[Path], names: list[str]) -> str:
    """The comparison in a few columns, for a terminal: the metric's three numbers and the two fidelity
    figures that tell a written review from a copy (compare.md has the rest)."""
    rows = ["| run | PE | RG | overall | copied | distinct-2 (real) |", "|---|---|---|---|---|---|"]
    for name, path in zip(names, paths, strict=True):
        r = json.loads(Path(path).read_text())
        f = r.get("fidelity")
        fid = (
            f"{f['copied_share']:.0%} | {f['distinct_2']:.3f} ({f['real_distinct_2']:.3f})" if f else "– | –"
        )
        rows.append(
            f"| {name} | {r['preference_estimation']:.4f} | {r['review_generation']:.4f} | {r['overall']:.4f} | {fid} |"
        )
    return "\n".join(rows)


def compare(
    paths: list[Path], names: list[str] | None, out: Path, paired: bool = True, heading: str | None = None
) -> str:
    """The runs side by side (out/compare.md, compare.png); with ``paired``, each run minus the first;
    ``heading``: a line above the table in compare.md (what the runs were scored on)."""
    results = [json.loads(Path(p).read_text()) for p in paths]
    names = names or [Path(p).parent.name for p in paths]
    if len(names) != len(results):
        sys.exit("error: --names needs one name per result file")
    head = (
        "| run | n | PE | RG | overall | sentiment err | emotion err | topic err | stars W1 | length KS | "
        "distinct-2 (real) | repeated | looping (real) | copied 8 words | new items | visibility | scorers |"
    )
    rows = [head, "|" + "---|" * 17]
    for name, r in zip(names, results, strict=True):
        exact = "exact" if r["scorers"]["all_exact"] else "stand-in parts"
        f = r.get("fidelity")  # result files written before the fidelity report have none
        share = lambda v: "–" if v is None else f"{v:.1%}"  # noqa: E731
        fid = (
            f"{f['star_wasserstein']:.3f} | {f['length_ks']:.3f} | {f['distinct_2']:.3f} ({f['real_distinct_2']:.3f}) | "
            f"{share(f['repeated_share'])} | {share(f.get('looping_share'))} ({share(f.get('real_looping_share'))}) | "
            f"{share(f['copied_share'])}"
            if f
            else "– | – | – | – | – | –"
        )
        fresh = r["counts"].get("new_items")  # tasks whose item had no older review (needs --data)
        fresh = "–" if fresh is None else f"{fresh / max(r['n'], 1):.0%}"
        rows.append(
            f"| {name} | {r['n']} | {r['preference_estimation']:.4f} | {r['review_generation']:.4f} | "
            f"{r['overall']:.4f} | {r['sentiment_error']:.4f} | {r['emotion_error']:.4f} | {r['topic_error']:.4f} | "
            f"{fid} | {fresh} | {r.get('visibility', 'unknown')} | {exact} |"
        )
    table = "\n".join(rows)
    if paired and len(paths) > 1:
        table += "\n\n" + paired_table(names, [Path(p).parent for p in paths])
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text((f"{heading}\n\n" if heading else "") + table + "\n")
    plots.compare_bars(names, results, out / "compare.png")
    return table


def main(argv: list[str] | None = None) -> dict | str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tasks", type=Path, help="task folder (tasks/, groundtruth/)")
    parser.add_argument("--predictions", type=Path, help="JSONL predictions or the official output JSON")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--backend", choices=["offline", "official"], default="offline")
    parser.add_argument("--limit", type=int, help="score only the first N tasks")
    parser.add_argument(
        "--data", type=Path, help="build folder: the fidelity report counts verbatim copies of its reviews"
    )
    parser.add_argument(
        "--allow-missing", action="store_true", help="score missing predictions as 0 stars, empty review"
    )
    parser.add_argument(
        "--emotion-model", type=Path, help="local text-classification model folder (4 emotion labels)"
    )
    parser.add_argument("--topic-model", type=Path, help="local sentence-transformers model folder")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--no-cache", action="store_true", help="do not reuse per-text model outputs across runs"
    )
    parser.add_argument(
        "--compare", type=Path, nargs="+", metavar="RESULTS_JSON", help="put result files side by side"
    )
    parser.add_argument("--names", nargs="+", help="with --compare: a name per result file")
    parser.add_argument("--wandb", choices=tracking.MODES, default="off", help="log to W&B (eval.tracking)")
    parser.add_argument("--wandb-project", help="default: the adapter's training project, else usersim")
    parser.add_argument("--wandb-group", help="default: the adapter's training group")
    parser.add_argument("--name", help="the W&B run's name (default: the output folder's name)")
    args = parser.parse_args(argv)

    if args.compare:
        table = compare(args.compare, args.names, args.out)
        print(table)
        return table
    if not args.tasks or not args.predictions:
        parser.error("--tasks and --predictions are required (or --compare)")
    try:
        results = evaluate(args)
    except PredictionError as err:
        sys.exit(f"error: {err}")
    print(
        f"n={results['n']}  PE={results['preference_estimation']:.4f}  RG={results['review_generation']:.4f}  "
        f"overall={results['overall']:.4f}  (sentiment {results['sentiment_error']:.4f}, emotion "
        f"{results['emotion_error']:.4f}, topic {results['topic_error']:.4f}; "
        f"{'all exact' if results['scorers']['all_exact'] else 'stand-in parts, see results.json'})"
    )
    c = results["counts"]
    if c["missing_scored_as_empty"] or c["stars_out_of_range"] or c["empty_reviews"]:
        print(
            f"note: {c['missing_scored_as_empty']} missing, {c['stars_out_of_range']} stars clipped, "
            f"{c['empty_reviews']} empty reviews (ids in results.json)"
        )
    print(f"-> {args.out}/results.json, samples.jsonl, star_confusion.png, text_errors.png, fidelity.png")
    log_to_wandb(args, results)
    return results


SAMPLE_ROWS = 50  # predictions shown in the W&B table, in task order


def log_to_wandb(args: argparse.Namespace, results: dict) -> None:
    where = tracking.target(tracking.adapter_of(args.predictions), args.wandb_project, args.wandb_group)
    keep = ("task_id", "true_stars", "pred_stars", "true_review", "pred_review", "topic_error")
    samples = read_jsonl(args.out / "samples.jsonl", whole=True)[:SAMPLE_ROWS]
    rows = [{k: row[k] for k in keep} for row in samples]
    folder = tracking.log_run(
        args.wandb,
        where,
        args.name or args.out.name,
        args.out,
        tracking.flat(results),
        {"inputs": results["inputs"], "visibility": results["visibility"], "scorers": results["scorers"]},
        {name: args.out / f"{name}.png" for name in ("star_confusion", "text_errors", "fidelity")},
        {"sample_predictions": rows},
    )
    if folder:
        print(f"W&B ({args.wandb}): project {where['project']}, group {where['group']} -> {folder}")


if __name__ == "__main__":
    main()
