"""LLM backends, retrieval, calibrated stars, the review agent (agent.py) and its runner (simulate.py)."""
