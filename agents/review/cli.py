"""The review simulator's command line: ``python -m agents.review run|evaluate|suite|choose|baseline``.

    python -m agents.review run --config configs/review/stats.yaml --data DATA --tasks TASKS --out RUN
    python -m agents.review evaluate --tasks TASKS --predictions RUN/predictions.jsonl --out EVAL
    python -m agents.review suite --data DATA --tasks TASKS --adapter ADAPTER --out OUT

``run`` is agents/review/simulate.py. The other verbs are the review evaluations of eval/review/ (one
module each), run by name.
"""

from __future__ import annotations

from agents.review.simulate import main as simulate
from agents.verbs import Verb, dispatch

VERBS = {
    "run": Verb("simulate one agent over a task folder (resumable, shardable)", call=simulate),
    "evaluate": Verb("score a run's predictions with the challenge metrics and the fidelity report", module="eval.review"),
    "suite": Verb("every agent and the model-free baselines on one task folder, side by side", module="eval.review.suite"),
    "choose": Verb("choose an MBR agent's selection rule on a validation run", module="eval.review.selection"),
    "baseline": Verb("a model-free reference prediction file (previous review, user mean, ...)", module="eval.review.baselines"),
}  # fmt: skip


def main(argv: list[str] | None = None) -> object:
    return dispatch("python -m agents.review", "The review simulator: predict a user's stars and review of an item.", VERBS, argv)  # fmt: skip
