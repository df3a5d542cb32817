"""Moved to eval.review.suite; this name forwards for one release."""

import sys

from eval.review.suite import main

if __name__ == "__main__":
    print("note: python -m eval.suite is now python -m eval.review.suite", file=sys.stderr)
    main()
