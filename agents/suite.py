"""The review suite moved to eval/review/suite.py (it scores agents with the evaluator, so it lives above
both): ``python -m eval.review.suite``. This entry point forwards to it for existing scripts.

    python -m eval.review.suite --data DATA --tasks TASKS --adapter ADAPTER --out OUT
"""

import runpy
import sys

if __name__ == "__main__":
    print(
        "note: agents.suite is now eval.review.suite (python -m eval.review.suite); forwarding",
        file=sys.stderr,
    )
    runpy.run_module("eval.review.suite", run_name="__main__", alter_sys=True)
