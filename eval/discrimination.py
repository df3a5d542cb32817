"""Moved to eval.sandbox.discrimination; this name forwards for one release."""

import sys

from eval.sandbox.discrimination import main

if __name__ == "__main__":
    print("note: python -m eval.discrimination is now python -m eval.sandbox.discrimination", file=sys.stderr)
    main()
