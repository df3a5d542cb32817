"""What the review prompts show at a budget: the training pairs and the tasks, counted alike.

    python -m bench.prompt_counts --data runs/demo/data/amazon --tasks runs/demo/tasks/amazon \
        runs/demo/tasks/amazon_validation --pairs runs/demo/pairs/amazon --config configs/review/tuned.yaml

For each task folder, the prompts the agent of ``--config`` builds (its k_user, k_item, user_reviews and
prompt_tokens; the tokenizer of its model, no model loaded), counted by how many of the user's reviews
they show (0 / 1 / 2+), how many show none of a user who has older ones, the mean tokens per part and
the cuts made to fit; for ``--pairs``, the same counts from the pairs' card. ``--choose-on`` (validation
tasks): which of the user's reviews to show, latest or the most relevant to the item, compared on how
close the shown reviews come to the real review (cosine of the packaged MiniLM embeddings between the
target and the shown reviews' centroid, and the error of their mean stars), paired per task with BCa
intervals. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import yaml


class TokenizerOnly:
    """Stands in for the LLM: the agent needs its tokenizer to fit prompts, nothing else."""

    def __init__(self, model: str):
        from transformers import AutoTokenizer

        from data_prep.offline_models import resolve_model

        self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(model))


def task_counts(data: Path, tasks: Path, config: dict) -> dict:
    from agents.encoders import packaged_minilm
    from agents.review import agent as agent_module
    from agents.review.agent import AgentConfig, ReviewAgent, prompt_counts
    from agents.review.simulate import prompt_summary
    from data_prep.store import ReviewStore
    from data_prep.tasks import read_targets, read_tasks

    fields = set(AgentConfig.__dataclass_fields__)
    settings = {k: v for k, v in config.items() if k in fields} | {
        "blend_fraction": 0.0,
        "llm_stars": "greedy",
    }
    agent_module.load_llm = lambda llm_config: TokenizerOnly(
        config.get("model", "smollm2-135m-instruct-offline")
    )
    store = ReviewStore.open(data, tasks=tasks)
    encoder = packaged_minilm("cpu", 64) if settings.get("retrieval", "embedding") == "embedding" else None
    agent = ReviewAgent(AgentConfig(**settings), None, store, encoder)
    targets = read_targets(tasks)
    rows = [{**t, "ts": targets[t["task_id"]]["ts"]} for t in read_tasks(tasks)]
    counts = Counter()
    for ctx in agent.contexts(rows):
        counts.update(prompt_counts(agent.fit(ctx), bool(ctx.history)))
    return prompt_summary(counts)


def selection_check(data: Path, tasks: Path, config: dict) -> dict:
    """Latest against relevant on validation tasks: the paired differences (relevant minus latest) of
    the target's cosine to the shown reviews' centroid and of the mean stars' absolute error."""
    import numpy as np

    from agents.encoders import packaged_minilm
    from agents.retrieval import Retriever
    from data_prep.prompt import describe_item
    from data_prep.store import ReviewStore
    from data_prep.tasks import read_targets, read_tasks
    from eval.metrics import bca_interval

    store = ReviewStore.open(data, tasks=tasks)
    encoder = packaged_minilm("cpu", 64)
    retriever = Retriever(encoder)
    k = config.get("k_user", 5)
    targets = read_targets(tasks)
    cosine, stars = {"latest": [], "relevant": []}, {"latest": [], "relevant": []}
    for task in read_tasks(tasks):
        truth_file = tasks / "groundtruth" / f"groundtruth_{task['task_id']}.json"
        target = {**targets[task["task_id"]], **json.loads(truth_file.read_text())}
        target["text"] = target["review"]
        history = store.get_reviews(user_id=task["user_id"], before=target["ts"])
        if len(history) <= k:  # both policies show the same reviews: no difference to measure
            continue
        item_text = describe_item(store.get_item(task["item_id"]))
        shown = {"latest": history[-k:], "relevant": retriever.rank(item_text, history, k)}
        truth = np.asarray(retriever.embed([target["text"]]))[0]
        for name, reviews in shown.items():
            centroid = np.asarray(retriever.embed([r["text"] for r in reviews])).mean(axis=0)
            cosine[name].append(float(centroid @ truth / (np.linalg.norm(centroid) * np.linalg.norm(truth))))
            stars[name].append(abs(np.mean([r["stars"] for r in reviews]) - target["stars"]))
    out = {"tasks_that_differ": len(cosine["latest"]), "k_user": k}
    for metric, values in (("cosine_to_target", cosine), ("mean_stars_error", stars)):
        diff = np.array(values["relevant"]) - np.array(values["latest"])
        low, high, _ = bca_interval(diff) if len(diff) > 1 else (float("nan"),) * 3
        out[metric] = {
            "latest": round(float(np.mean(values["latest"])), 4) if diff.size else None,
            "relevant": round(float(np.mean(values["relevant"])), 4) if diff.size else None,
            "relevant_minus_latest": [
                round(float(x), 4) for x in (diff.mean() if diff.size else np.nan, low, high)
            ],
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--tasks", type=Path, nargs="+", required=True)
    parser.add_argument("--pairs", type=Path)
    parser.add_argument("--config", type=Path, default=Path("configs/review/tuned.yaml"))
    parser.add_argument("--choose-on", type=Path, help="validation tasks: latest or relevant user reviews")
    args = parser.parse_args(argv)
    config = yaml.safe_load(args.config.read_text())
    result = {"config": str(args.config), "prompt_tokens": config.get("prompt_tokens")}
    if args.pairs:
        card = json.loads((args.pairs / "card.json").read_text())
        result["pairs"] = {"options": card["options"], **card["prompts"]}
    result["tasks"] = {str(t): task_counts(args.data, t, config) for t in args.tasks}
    if args.choose_on:
        result["user_reviews_choice"] = {
            str(args.choose_on): selection_check(args.data, args.choose_on, config)
        }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
