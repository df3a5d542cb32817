"""The review simulator: agent.py (the agent kinds), stars.py (time-aware calibrated stars),
simulate.py (the batched, resumable runner: python -m agents.review run), official.py (AgentSociety
agents run unchanged: --agent file.py:Class). Every agent and baseline scored side by side: eval/review/suite.py."""
