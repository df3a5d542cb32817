"""A rating read from probabilities against a greedy one, side by side on the same prompts and model.

    python -m bench.choice_bench --data runs/demo/data/amazon --tasks runs/demo/tasks/amazon --rounds 3

The review agent's prompts (configs/review/tuned.yaml's settings, 256 tokens, its adapter when it
exists) on SmolLM2-135M on the CPU, three ways, in turn each round (the order alternating):

- ``expected``: agents.llm.option_probs over "1".."5" after "stars: " (one forward pass per prompt);
- ``greedy_digit``: the greedy constrained pick of one digit after the same beginning (generate under
  Constraint.choice, two new tokens at most), what a greedy rating call was;
- ``greedy_answer``: the greedy answer in the renderer's format (max_new_tokens as in the config) and
  its parsed stars, where the review agent's greedy stars come from.

Prints the median seconds of each, the ratios to ``expected``, and how often the most likely digit of
``expected`` equals ``greedy_digit``'s pick (they must agree: the same model, the same beginning).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import yaml


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--tasks", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=Path("configs/review/tuned.yaml"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--limit", type=int, default=32)
    args = parser.parse_args(argv)

    from agents.llm import Constraint, LLMConfig, Sampling, load_llm, option_probs
    from agents.review import agent as agent_module
    from agents.review.agent import STAR_DIGITS, STARS_PREFIX, AgentConfig, ReviewAgent
    from data_prep.prompt import parse_completion
    from data_prep.store import ReviewStore
    from data_prep.tasks import read_targets, read_tasks

    config = yaml.safe_load(args.config.read_text())
    adapter = config.get("adapter") if config.get("adapter") and Path(config["adapter"]).exists() else None
    llm = load_llm(
        LLMConfig(model=config.get("model", "smollm2-135m-instruct-offline"), adapter=adapter, device="cpu")
    )
    agent_module.load_llm = lambda _: llm
    fields = set(AgentConfig.__dataclass_fields__)
    settings = {k: v for k, v in config.items() if k in fields} | {"retrieval": "bm25", "blend_fraction": 0.0}
    store = ReviewStore.open(args.data, tasks=args.tasks)
    agent = ReviewAgent(AgentConfig(**settings), None, store)
    targets = read_targets(args.tasks)
    tasks = [{**t, "ts": targets[t["task_id"]]["ts"]} for t in read_tasks(args.tasks)][: args.limit]
    conversations = [agent.messages(c) for c in agent.contexts(tasks)]
    with_prefix = [[*c, {"role": "assistant", "content": STARS_PREFIX}] for c in conversations]

    def expected():
        return option_probs(llm, conversations, STAR_DIGITS, prefix=STARS_PREFIX)

    def greedy_digit():  # the beginning as a continued answer: the hf backend renders it after the prompt
        encode = llm.encode
        llm.encode = lambda convs, prefix="": encode([c[:-1] for c in convs], STARS_PREFIX)
        try:
            return llm.generate(with_prefix, Sampling(max_new_tokens=2), Constraint.choice(STAR_DIGITS))
        finally:
            llm.encode = encode

    def greedy_answer():
        return llm.generate(conversations, Sampling(max_new_tokens=settings.get("max_new_tokens", 160)))

    ways = {"expected": expected, "greedy_digit": greedy_digit, "greedy_answer": greedy_answer}
    expected()  # warm-up
    seconds = {name: [] for name in ways}
    outputs = {}
    for r in range(args.rounds):
        for name in list(ways) if r % 2 == 0 else list(ways)[::-1]:
            started = time.perf_counter()
            outputs[name] = ways[name]()
            seconds[name].append(round(time.perf_counter() - started, 3))
    base = statistics.median(seconds["expected"])
    agree = sum(a.text == b.text for a, b in zip(outputs["expected"], outputs["greedy_digit"], strict=True))
    parsed = [parse_completion(a.text)[0] for a in outputs["greedy_answer"]]
    result = {
        "model": config.get("model"),
        "adapter": adapter,
        "prompts": len(conversations),
        "prompt_tokens_mean": round(statistics.mean(a.prompt_tokens for a in outputs["expected"]), 1),
        "seconds": seconds,
        "median_over_expected": {n: round(statistics.median(s) / base, 2) for n, s in seconds.items()},
        "most_likely_digit_equals_greedy_pick": f"{agree}/{len(conversations)}",
        "greedy_answer_stars_parsed": sum(s is not None for s in parsed),
        "expected_stars_mean": round(statistics.mean(a.expected for a in outputs["expected"]), 3),
    }
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
