"""The recommender sandbox (RecAgent-style agents round by round in a recommender and a social network).

Built so far: config.py (the typed, nested configuration) and memory.py (sensory, short-term and
long-term memory). The profiles, actions, environment, recommenders, runner and evaluation follow.
"""
