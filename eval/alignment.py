"""Moved to eval.sandbox.alignment; this name forwards for one release."""

import sys

from eval.sandbox.alignment import main

if __name__ == "__main__":
    print("note: python -m eval.alignment is now python -m eval.sandbox.alignment", file=sys.stderr)
    main()
