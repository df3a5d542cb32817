"""The second file of the submission: the prompt the agent fills."""

REVIEW_FORMAT = """You are user {user} writing about business {item}.
A review you remembered: {recalled}
Answer in this format:
stars: [1.0-5.0]
review: [your review]"""
