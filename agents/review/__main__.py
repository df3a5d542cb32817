"""python -m agents.review: see agents/review/cli.py."""

from agents.review.cli import main

main()
