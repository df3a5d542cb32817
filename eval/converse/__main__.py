"""python -m eval.converse: see eval/converse/__init__.py."""

from eval.converse.cli import main

main()
