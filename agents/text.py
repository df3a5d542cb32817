"""Word-level text statistics the sandbox's per-round report and the evaluator's fidelity report share:
words are ``\\w+`` runs, lower-cased."""

from __future__ import annotations

import re

_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def normalise(text: str) -> str:
    return " ".join(text.lower().split())


def distinct(tokenised: list[list[str]], n: int) -> float:
    grams = [tuple(ws[i : i + n]) for ws in tokenised for i in range(len(ws) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def repeats_ngram(tokenised: list[str], n: int = 4) -> bool:
    """Whether some n-gram of these words occurs twice (a message stuck in a loop)."""
    grams = [tuple(tokenised[i : i + n]) for i in range(len(tokenised) - n + 1)]
    return len(set(grams)) < len(grams)


def spans(tokenised: list[str], n: int) -> set[tuple[str, ...]]:
    """Every run of n consecutive words (a copy check compares them with another text's)."""
    return {tuple(tokenised[i : i + n]) for i in range(len(tokenised) - n + 1)}
