"""Benchmark: the evaluator against a faithful re-creation of the official procedure, same models,
same 1,000 real review pairs, one process, one run.

    python -m bench.eval_bench --pairs 1000 --out runs/bench/eval_bench.json

Pairs are disjoint consecutive reviews of one business in the Yelp sample (prediction = the earlier
review, truth = the later one), so both sides are real texts of real lengths and no text is on both. The official call pattern
(websocietysimulator/tools/evaluation_tool.py): VADER per text; ``encode([pred, truth])`` per pair and
``scipy.spatial.distance.cosine``; the emotion model called once over the list of 300-character cuts
with a pipeline's default batching (one text per forward pass). Our evaluator: eval.scoring.score_pairs,
cold (nothing cached), and with the ground truth's model outputs already cached (a second run scored
against the same tasks).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from data_prep import build
from data_prep.paths import raw_dir
from data_prep.store import ReviewStore
from eval.backends import build_scorers
from eval.metrics import EMOTION_LABELS, aggregate
from eval.scoring import ScoreCache, score_pairs


def real_pairs(n: int, work: Path) -> tuple[list[float], list[str], list[float], list[str]]:
    data = work / "yelp_store"
    if not (data / "report.json").exists():
        build.main(
            [
                "--source",
                "asc",
                "--platform",
                "yelp",
                "--input",
                str(raw_dir() / "yelp_asc_sample"),
                "--out",
                str(data),
            ]
        )
    store = ReviewStore(data)
    items = [i for (i,) in store.conn.execute("SELECT item_id FROM items ORDER BY item_id")]
    pred_stars, pred_texts, true_stars, true_texts = [], [], [], []
    for item in items:
        reviews = store.get_reviews(item_id=item)
        # disjoint pairs (r0, r1), (r2, r3), ...: no text is both a prediction and a truth
        for earlier, later in zip(reviews[0::2], reviews[1::2], strict=False):
            pred_stars.append(earlier["stars"])
            pred_texts.append(earlier["text"])
            true_stars.append(later["stars"])
            true_texts.append(later["text"])
            if len(pred_stars) == n:
                return pred_stars, pred_texts, true_stars, true_texts
    raise SystemExit(f"the sample has fewer than {n} pairs")


def official_procedure(pred_stars, pred_texts, true_stars, true_texts, scorers) -> dict[str, np.ndarray]:
    """The official evaluator's loop, with our scorers' models in place of the hub ids."""
    from scipy.spatial import distance

    sia, topic_model, standin = scorers.sentiment.analyzer, scorers.topic.model, scorers.emotion
    star, sentiment, topic = [], [], []
    for sim_star, real_star in zip(pred_stars, true_stars, strict=True):
        sim_star = min(max(sim_star, 0), 5)
        star.append(abs(sim_star - real_star) / 5)
    for sim, real in zip(pred_texts, true_texts, strict=True):
        s1, s2 = sia.polarity_scores(sim)["compound"], sia.polarity_scores(real)["compound"]
        sentiment.append(abs(s1 - s2) / 2)
        embeddings = topic_model.encode([sim, real])
        topic.append(distance.cosine(embeddings[0], embeddings[1]) / 2)

    def classify(texts):  # a pipeline over a list, default batch size 1: one forward pass per text
        return [
            dict(zip(EMOTION_LABELS, standin.probabilities(topic_model.encode([t]))[0], strict=True))
            for t in texts
        ]

    sim_emotions = classify([t[:300] for t in pred_texts])
    real_emotions = classify([t[:300] for t in true_texts])
    emotion = []
    for e1, e2 in zip(sim_emotions, real_emotions, strict=True):
        labels = set(e1) | set(e2)
        emotion.append(
            float(np.mean(np.abs(np.array([e1[k] for k in labels]) - np.array([e2[k] for k in labels]))))
        )
    return {
        "star_error": np.array(star),
        "sentiment_error": np.array(sentiment),
        "emotion_error": np.array(emotion),
        "topic_error": np.array(topic, dtype=np.float64),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/eval_bench.json"))
    args = parser.parse_args()
    pairs = real_pairs(args.pairs, args.out.parent)
    build_scorers("offline")  # warm the file cache and the stand-in's disk cache for both sides

    results = {}
    cache_path = args.out.parent / "eval_bench_cache.sqlite"
    for old in (cache_path, *(cache_path.with_name(cache_path.name + end) for end in ("-wal", "-shm"))):
        old.unlink(missing_ok=True)  # an earlier run's cache holds the predictions' outputs too
    warm_cache = ScoreCache(cache_path)
    for name in ("ours", "official", "ours_truth_cached"):
        if name == "ours_truth_cached":  # as when an earlier run was scored against the same ground truth
            score_pairs(pairs[2], pairs[3], pairs[2], pairs[3], build_scorers("offline"), warm_cache)
        t0 = time.perf_counter()
        scorers = build_scorers("offline")
        t1 = time.perf_counter()
        if name == "official":
            terms = official_procedure(*pairs, scorers)
        else:
            terms = score_pairs(*pairs, scorers, warm_cache if name == "ours_truth_cached" else None)
        t2 = time.perf_counter()
        results[name] = {
            "terms": terms,
            "load_seconds": round(t1 - t0, 2),
            "score_seconds": round(t2 - t1, 2),
            "pairs_per_second_including_load": round(args.pairs / (t2 - t0), 2),
            "pairs_per_second_excluding_load": round(args.pairs / (t2 - t1), 2),
            "aggregate": aggregate(
                *(terms[k] for k in ("star_error", "sentiment_error", "emotion_error", "topic_error"))
            ),
        }
        print(name, {k: v for k, v in results[name].items() if k not in ("terms",)}, flush=True)

    ours, official = results["ours"], results["official"]
    report = {
        "pairs": args.pairs,
        **{name: {k: v for k, v in r.items() if k != "terms"} for name, r in results.items()},
        "speedup_truth_cached_excluding_load": round(
            official["score_seconds"] / results["ours_truth_cached"]["score_seconds"], 2
        ),
        "speedup_excluding_load": round(official["score_seconds"] / ours["score_seconds"], 2),
        "speedup_including_load": round(
            (official["score_seconds"] + official["load_seconds"])
            / (ours["score_seconds"] + ours["load_seconds"]),
            2,
        ),
        "max_abs_difference": {
            k: float(np.max(np.abs(ours["terms"][k] - official["terms"][k])))
            for k in ("star_error", "sentiment_error", "emotion_error", "topic_error")
        },
        "max_abs_difference_truth_cached": {
            k: float(np.max(np.abs(results["ours_truth_cached"]["terms"][k] - official["terms"][k])))
            for k in ("star_error", "sentiment_error", "emotion_error", "topic_error")
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
