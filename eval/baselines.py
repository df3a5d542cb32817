"""Moved to eval.review.baselines; this name forwards for one release."""

import sys

from eval.review.baselines import main

if __name__ == "__main__":
    print("note: python -m eval.baselines is now python -m eval.review.baselines", file=sys.stderr)
    main()
