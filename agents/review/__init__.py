"""The review simulator: agent.py (the agent kinds), stars.py (time-aware calibrated stars),
simulate.py (the batched, resumable runner: python -m agents.simulate), suite.py (every agent and
baseline scored side by side: python -m agents.suite)."""
