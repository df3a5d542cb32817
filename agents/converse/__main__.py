"""python -m agents.converse: see agents/converse/cli.py."""

from agents.converse.cli import main

main()
