"""The main job end to end on the embedded default samples (what `make demo` runs).

    python demo.py --shared ../shared/data/raw --out runs/demo

Today: build the Amazon 2018 and Yelp samples into review stores, print their reports, write
leave-last-out evaluation tasks for each, score a model-free baseline (each user's previous review)
with the offline evaluator, print the comparison table, then build training pairs from the Amazon
sample and fine-tune a LoRA adapter on SmolLM2-135M-Instruct on the CPU (configs/sft/smollm2_cpu.yaml,
about 5 minutes), writing its loss curve. Rerunning resumes or skips what is done. Where ../shared/data/raw is absent it fetches a small public
Amazon Reviews 2023 sample instead (needs the Hugging Face Hub) and says so.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_prep import build, pairs, split
from data_prep.store import ReviewStore
from eval import baselines, review
from train import sft


def samples(shared: Path, out: Path) -> dict[str, list[str]]:
    """name -> build arguments, from the shared samples when present, else a fetched public sample."""
    amazon, yelp = shared / "amazon2018_5core_small", shared / "yelp_asc_sample"
    if amazon.is_dir() and yelp.is_dir():
        print(f"samples: {amazon} and {yelp}")
        return {
            "amazon": ["--source", "amazon2018", "--input", str(amazon)],
            "yelp": ["--source", "asc", "--platform", "yelp", "--input", str(yelp)],
        }
    from data_prep.fetch_sample import fetch

    print(
        f"{shared} not found: fetching a public Amazon Reviews 2023 sample (Magazine_Subscriptions) instead"
    )
    files = fetch("Magazine_Subscriptions", 20_000, out / "raw")
    return {"amazon": ["--source", "amazon2023", "--input", *map(str, files)]}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shared", type=Path, default=Path("../shared/data/raw"))
    parser.add_argument("--out", type=Path, default=Path("runs/demo"))
    args = parser.parse_args()

    out = args.out
    results = []
    for name, build_args in samples(args.shared, out).items():
        data, tasks = out / "data" / name, out / "tasks" / name
        predictions, scored = (
            out / "predictions" / name / "previous_review.jsonl",
            out / "eval" / name / "previous_review",
        )

        print(f"\n=== {name}: build")
        report = build.main([*build_args, "--out", str(data), "--overwrite"])
        keys = (
            "reviews_read",
            "reviews_kept",
            "reviews_rejected",
            "reviews_filtered",
            "users",
            "items",
            "reasons",
        )
        print(json.dumps({k: report[k] for k in keys}, indent=2))

        print(f"=== {name}: split (leave-last-out, min history 2, 50 tasks)")
        split.main(f"--data {data} --out {tasks} --min-history 2 --max-tasks 50 --seed 0 --overwrite".split())
        store = ReviewStore.open(data, tasks=tasks)
        task = json.loads((tasks / "tasks" / "task_0.json").read_text())
        visible = store.get_reviews(user_id=task["user_id"])
        hidden = store.get_reviews(user_id=task["user_id"], item_id=task["item_id"])
        print(
            f"task_0: {len(visible)} reviews of its user are visible; {len(hidden)} for the target pair (blocked)"
        )

        print(f"=== {name}: score a model-free baseline, each user's previous review (offline evaluator)")
        baselines.main(f"previous-review --data {data} --tasks {tasks} --out {predictions}".split())
        review.main(f"--tasks {tasks} --predictions {predictions} --out {scored}".split())
        results.append((f"{name}/previous-review", scored / "results.json"))

    print("\n=== comparison")
    names = [n for n, _ in results]
    review.main(["--compare", *(str(p) for _, p in results), "--names", *names, "--out", str(out / "eval")])

    print("\n=== amazon: training pairs (task pairs blocked, only strictly older reviews shown)")
    pairs_dir = out / "pairs" / "amazon"
    pairs.main(
        f"--data {out / 'data/amazon'} --tasks {out / 'tasks/amazon'} --out {pairs_dir} --k-user 2 --k-item 1 --max-tokens 256".split()
    )
    print("\n=== amazon: LoRA fine-tuning of SmolLM2-135M-Instruct on the CPU (configs/sft/smollm2_cpu.yaml)")
    adapter = out / "sft" / "smollm2_lora"
    trainer = sft.main(
        ["--config", "configs/sft/smollm2_cpu.yaml", "--pairs", str(pairs_dir), "--output_dir", str(adapter)]
    )
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    evals = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    print(
        f"train loss {losses[0]:.3f} -> {losses[-1]:.3f}; validation loss {' -> '.join(f'{x:.3f}' for x in evals)}"
    )
    print(f"adapter, tokenizer, model card: {adapter}; loss curve: {adapter / 'loss.png'}")


if __name__ == "__main__":
    main()
