"""The shared evaluator: the AgentSociety review metrics (review.py is the CLI)."""
