"""Moved: ``python -m agents.simulate`` is now ``python -m agents.review run`` (agents/review/cli.py).
This name forwards for one release."""

import sys

from agents.review.simulate import main

if __name__ == "__main__":
    print("note: python -m agents.simulate is now python -m agents.review run", file=sys.stderr)
    main()
