"""Moved to eval.sandbox.generation; this name forwards for one release."""

import sys

from eval.sandbox.generation import main

if __name__ == "__main__":
    print("note: python -m eval.generation is now python -m eval.sandbox.generation", file=sys.stderr)
    main()
