"""Entry point of the review simulator's runner, kept here for the Slurm scripts and the README; the
code and its documentation are in agents/review/simulate.py.

    python -m agents.simulate --config configs/agents/stats.yaml --data DATA --tasks TASKS --out RUN_DIR
"""

from agents.review.simulate import main

if __name__ == "__main__":
    main()
