"""The recommender sandbox (RecAgent-style agents round by round in a recommender and a social network):
run with ``python -m agents.sandbox`` (agents/sandbox/cli.py); the modules are described in docs/sandbox.md.
"""
