"""The recommender sandbox's tests, run through the simulator itself, one module per analysis:

- ``discrimination``: RecAgent's discrimination test (pick the held-out films among distractors);
- ``generation``: RecAgent's generation test (the films an agent reaches by browsing), with memory ablations;
- ``alignment``: Agent4Rec's rating alignment (the agent's stars against the users' real ones);
- ``cases``: the users, cutoffs and pages the tests share (everything strictly before each user's cutoff);
- ``training_check``: the task metric a choice recipe evaluates during training (eval.training).

    python -m eval.sandbox.discrimination --config configs/sandbox/movielens.yaml --out runs/sandbox/discrimination
"""
