"""python -m agents.sandbox: see agents/sandbox/run.py."""

from agents.sandbox.run import main

main()
