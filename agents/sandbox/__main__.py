"""python -m agents.sandbox: see agents/sandbox/cli.py."""

from agents.sandbox.cli import main

main()
