"""Entry point of the review suite, kept here for the demo and the README; the code and its
documentation are in agents/review/suite.py.

    python -m agents.suite --data DATA --tasks TASKS --adapter ADAPTER --out OUT
"""

from agents.review.suite import main

if __name__ == "__main__":
    main()
