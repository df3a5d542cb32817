"""The main job end to end on the embedded default sample (what `make demo` runs, about 15 minutes on
2 CPU cores).

    python demo.py --shared ../shared/data/raw --out runs/demo

1. build the Amazon 2018 sample into a review store and print its report (data_prep.build);
2. hold out each of 50 users' latest review as an evaluation task (data_prep.split, leave-last-out), and
   draw validation tasks like them from before them (each of those users' previous review);
3. build leakage-proof training pairs from the rest (data_prep.pairs: neither folder's reviews are
   targets) and fine-tune a LoRA adapter on SmolLM2-135M-Instruct on the CPU (train.sft,
   configs/sft/smollm2_cpu.yaml), scoring its greedy answers with the task's metric at step 0 and at every
   evaluation beside the copy baseline, keeping the best checkpoint, writing the curve;
4. simulate the 50 held-out tasks with four agents (stats and stats-mbr, which copy real reviews; tuned
   and tuned-write, whose reviews the model writes; stats-mbr's choice and tuned-write's utility chosen on
   the validation tasks) and three model-free baselines, score everything with the
   offline evaluator and its fidelity report, print the comparison table and write its chart (eval.review.suite).
   The same agents on a temporal split (later reviews) are in bench/README.md, which it points to.

Rerunning resumes or skips what is done; a step whose inputs changed (new code that builds other
pairs, say) is redone instead of mixed with the earlier work. Where ../shared/data/raw is absent it
fetches a small public Amazon Reviews 2023 sample instead (needs the Hugging Face Hub) and says so.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from data_prep import build, pairs, split
from data_prep.store import ReviewStore
from eval.review import suite
from train import sft


def sample(shared: Path, out: Path) -> list[str]:
    """Build arguments for the shared Amazon 2018 sample when present, else for a fetched public one."""
    amazon = shared / "amazon2018_5core_small"
    if amazon.is_dir():
        print(f"sample: {amazon}")
        return ["--source", "amazon2018", "--input", str(amazon)]
    from data_prep.fetch_sample import fetch

    print(
        f"{amazon} not found: fetching a public Amazon Reviews 2023 sample (Magazine_Subscriptions) instead"
    )
    return [
        "--source",
        "amazon2023",
        "--input",
        *map(str, fetch("Magazine_Subscriptions", 20_000, out / "raw")),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shared", type=Path, default=Path("../shared/data/raw"))
    parser.add_argument("--out", type=Path, default=Path("runs/demo"))
    args = parser.parse_args()
    out, started = args.out, time.perf_counter()
    data, tasks = out / "data" / "amazon", out / "tasks" / "amazon"
    validation = out / "tasks" / "amazon_validation"

    print("\n=== 1. build the review store")
    report = build.main([*sample(args.shared, out), "--out", str(data), "--overwrite"])
    print(json.dumps({k: report[k] for k in build.SUMMARY_KEYS}, indent=2))

    print("\n=== 2. split: leave-last-out, min history 2, 50 tasks")
    split.main(f"--data {data} --out {tasks} --min-history 2 --max-tasks 50 --seed 0 --overwrite".split())
    split.main(
        f"--data {data} --out {validation} --validation-for {tasks} --min-history 2 --overwrite".split()
    )
    store = ReviewStore.open(data, tasks=tasks)
    task = json.loads((tasks / "tasks" / "task_0.json").read_text())
    visible = store.get_reviews(user_id=task["user_id"])
    hidden = store.get_reviews(user_id=task["user_id"], item_id=task["item_id"])
    print(
        f"task_0: {len(visible)} reviews of its user are visible; {len(hidden)} for the target pair (blocked)"
    )

    print(
        "\n=== 3. training pairs (task and validation pairs blocked, only older reviews shown) and LoRA SFT"
    )
    pairs_dir, adapter = out / "pairs" / "amazon", out / "sft" / "smollm2_lora"
    pairs.main(
        f"--data {data} --tasks {validation} --out {pairs_dir} --k-user 2 --k-item 1 --max-tokens 256".split()
    )
    recipe = [
        "--config",
        "configs/sft/smollm2_cpu.yaml",
        "--pairs",
        str(pairs_dir),
        "--output_dir",
        str(adapter),
    ]
    trainer = sft.main([*recipe, "--overwrite", "true"])
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    evals = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    print(
        f"train loss {losses[0]:.3f} -> {losses[-1]:.3f}; validation loss {' -> '.join(f'{x:.3f}' for x in evals)}"
    )
    curve = [h for h in trainer.state.log_history if "eval_task_overall" in h]
    if curve:
        print(
            "task metric of the greedy answer on validation pairs (overall / RG), by step: "
            + ", ".join(
                f"{h['step']}: {h['eval_task_overall']:.4f} / {h['eval_task_review_generation']:.4f}"
                for h in curve
            )
            + f"; copy baseline {curve[0]['eval_copy_overall']:.4f} / {curve[0]['eval_copy_review_generation']:.4f}; "
            f"kept {trainer.state.best_model_checkpoint}"
        )
    print(f"adapter, tokenizer, model card: {adapter}; loss and task-metric curves: {adapter / 'loss.png'}")

    print("\n=== 4. simulate the 50 held-out tasks with four agents and score them (offline evaluator)")
    kinds = ("stats", "stats-mbr", "tuned", "tuned-write")
    suite.run_suite(
        data, tasks, out / "suite" / "amazon", adapter, kinds, overwrite=True, validation=validation
    )
    print(
        "\nlater reviews (a temporal split of both samples, 100 tasks each, with the share of new items): "
        "bench/README.md, 'Review simulation on two splits' (bash bench/quality.sh amazon|yelp)"
    )
    print(f"\ndemo finished in {(time.perf_counter() - started) / 60:.1f} min")


if __name__ == "__main__":
    main()
