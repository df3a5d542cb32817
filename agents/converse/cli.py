"""The conversational simulator's command line: ``python -m agents.converse run|evaluate``.

    python -m agents.converse run --config configs/converse/yelp.yaml --out runs/converse/demo
    python -m agents.converse evaluate --run runs/converse/demo --out runs/converse/demo/eval

``run`` is agents/converse/run.py; ``evaluate`` is eval/converse/, run by name. The form without a verb
(``python -m agents.converse --config ...``) still runs, with a note, for one release.
"""

from __future__ import annotations

import sys

from agents.converse.run import main as run
from agents.verbs import Verb, dispatch

VERBS = {
    "run": Verb("simulated users talk to every recommender of the config (resumable)", call=run),
    "evaluate": Verb("ratings, goals, end reasons, realism and replays of a run", module="eval.converse"),
}


def main(argv: list[str] | None = None) -> object:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0].startswith("--") and argv[0] != "--help":
        print("note: python -m agents.converse --config ... is now python -m agents.converse run --config ...", file=sys.stderr)  # fmt: skip
        return run(argv)
    return dispatch("python -m agents.converse", "The conversational user simulator against recommenders.", VERBS, argv)  # fmt: skip
