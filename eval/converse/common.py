"""What the conversational evaluations share: the three ratings and a dialogue-level interval."""

from __future__ import annotations

from eval.metrics import bca_interval


def interval(values: list[float]) -> list[float]:
    if len(values) < 2:
        return None  # no interval from one dialogue
    low, high, _ = bca_interval(values)
    return [round(low, 3), round(high, 3)]


KEYS = ("language_quality", "action_quality", "recommendation_quality")
