"""python -m eval.review: score predictions (eval/review/score.py)."""

from eval.review.score import main

main()
