"""Moved to eval.review.selection; this name forwards for one release."""

import sys

from eval.review.selection import main

if __name__ == "__main__":
    print("note: python -m eval.selection is now python -m eval.review.selection", file=sys.stderr)
    main()
