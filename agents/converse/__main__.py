"""python -m agents.converse: see agents/converse/run.py."""

from agents.converse.run import main

main()
