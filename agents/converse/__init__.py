"""The conversational user simulator (RecUserSim-style) and the recommenders it talks to: run with
``python -m agents.converse run`` (agents/converse/cli.py)."""
