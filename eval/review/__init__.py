"""The review simulator's evaluations, one module per analysis:

- ``score``: the challenge metrics (PE, RG, overall) and the fidelity report of one prediction file
  (``python -m eval.review``);
- ``fidelity``: how the simulated population compares with the real one (copies, loops, distinct-2);
- ``predictions``: prediction files read and matched to tasks, every problem named;
- ``baselines``: model-free reference predictions (previous review, user mean, nearest centroid);
- ``selection``: an MBR agent's selection rule chosen on validation tasks;
- ``suite``: every agent and baseline on one task folder, scored side by side;
- ``training_check``: the task metric a review recipe evaluates during training (eval.training).

``python -m agents.review evaluate|suite|choose|baseline`` runs them by name.
"""

import importlib
import warnings

SUBMODULES = {"score", "fidelity", "predictions", "baselines", "selection", "suite", "training_check"}


def __getattr__(name: str):
    """``from eval.review import X`` of the days it was one module still finds X, for one release."""
    if (
        name.startswith("__") or name in SUBMODULES
    ):  # a submodule not imported yet: the import system loads it
        raise AttributeError(f"module 'eval.review' has no attribute {name!r}")
    score = importlib.import_module("eval.review.score")
    if not hasattr(score, name):
        raise AttributeError(f"module 'eval.review' has no attribute {name!r}")
    warnings.warn(f"eval.review.{name} is now eval.review.score.{name}", DeprecationWarning, stacklevel=2)
    return getattr(score, name)
