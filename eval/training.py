"""Each task's own metric during training: what a recipe names as ``task_metric``.

    task_metric: eval.training:review_task_metric      # review pairs (configs/sft/smollm2_cpu*.yaml)
    task_metric: eval.training:choice_task_metric      # the sandbox's choice pairs
    task_metric: eval.training:converse_task_metric    # the conversational simulator's pairs

train.sft calls it at step 0 (``eval_on_start``, the base model) and at every evaluation, on
``task_examples`` validation pairs, beside a simple baseline on the same pairs; with
``metric_for_best_model`` set to one of its keys, the best checkpoint is kept by it. Each simulator's metric lives with its evaluations (eval.review.training_check,
eval.sandbox.training_check, eval.converse.training_check); what they share is eval.task_check. The
names here stay the recipes' import paths, which run fingerprints record.

train never imports eval (tests/test_layout.py): the recipe names this function, and train.sft loads it
by its import path.
"""


def review_task_metric(pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 128):
    """What train.sft's ``task_metric`` loads for review pairs."""
    from eval.review.training_check import ReviewTaskMetric

    return ReviewTaskMetric(pairs, rows, output_dir, max_new_tokens)


def choice_task_metric(pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 4):
    """What train.sft's ``task_metric`` loads for the sandbox's choice pairs."""
    from eval.sandbox.training_check import ChoiceTaskMetric

    return ChoiceTaskMetric(pairs, rows, output_dir, max_new_tokens)


def converse_task_metric(pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 64):
    """What train.sft's ``task_metric`` loads for the conversational simulator's pairs."""
    from eval.converse.training_check import ConverseTaskMetric

    return ConverseTaskMetric(pairs, rows, output_dir, max_new_tokens)


MOVED = {
    "ReviewTaskMetric": "eval.review.training_check",
    "ChoiceTaskMetric": "eval.sandbox.training_check",
    "ConverseTaskMetric": "eval.converse.training_check",
}


def __getattr__(name: str):
    """``from eval.training import ReviewTaskMetric`` of the days it was one module still works, for one
    release, with a note of the new place."""
    if name not in MOVED:
        raise AttributeError(f"module 'eval.training' has no attribute {name!r}")
    import importlib
    import warnings

    warnings.warn(f"eval.training.{name} is now {MOVED[name]}.{name}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(MOVED[name]), name)
