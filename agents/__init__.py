"""Three user simulators over one shared layer.

Shared: llm.py (the LLM backends and structured outputs), retrieval.py (BM25 and embedding ranking).
Simulators, one subpackage each: review/ (stars and review for a user and an item), sandbox/ (the
RecAgent-style recommender sandbox) and, next, the conversational user simulator.
"""
