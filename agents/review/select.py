"""Choose one review from a pool of candidates by minimum Bayes risk (MBR), never with the ground truth.

The pool mixes reviews the tuned LLM wrote (its greedy answer, ``llm``, and sampled ones, ``sample``)
with real ones retrieved for the task (``user``: the user's own past reviews most similar to the item;
``item``: the item's reviews nearest the centroid of the user's reviews). Each candidate's risk is a
cheap stand-in for the official review-generation error, with the other candidates as pseudo-references:

    risk(c) = 0.5 * mean over the other candidates c' of (1 - cos(c, c')) / 2      (topic stand-in)
            + sentiment_weight * 0.25 * |vader(c) - expected vader for the predicted stars| / 2

cos is on unit all-MiniLM-L6-v2 embeddings (the agent's retrieval encoder); the expected VADER compound
for a number of stars is the mean over the store's reviews with those stars strictly older than the
task (time-aware; all of them under official visibility), from ``SentimentByStars``. A pool of one is
that one. Ties (risks within agents.retrieval.TIE) go to the earlier candidate (the pool's order:
llm, samples, user, item), so the agent and eval.review.selection's re-choosing agree whatever the batching
of the embeddings.

A pool names the sources a review may be chosen from and the sources that serve as pseudo-references:
``generated``, ``retrieved`` and ``both`` choose among the references themselves; ``retrieved-vs-all``
chooses a real review judged against every candidate (the LLM's texts only as evidence), and
``generated-vs-all`` a generated one judged against every candidate. ``answer`` is the agent's own
answer (the LLM's greedy one, or the retrieved review that stood in for it): the agent without selection,
so one MBR run also scores the plain tuned agent. ``centroid`` is no MBR at all: the nearest-centroid
baseline's review (eval.review.baselines), which every pool holds and marks (``"centroid": true``), and
``similar`` the user's own past review most similar to the item (the first ``user`` candidate, with
``candidates_user`` >= 1: what the stats agent writes, up to float ties in the ranking), so a rule
chosen on validation can always keep either model-free text (eval.review.selection). Neither has a sentiment
weight; for a user with no history neither has a review, and the LLM's answer stands (``empty_pool``).

A selection rule (eval.review.selection writes it, ``selection_rule:`` in an agent config reads it) gives
each group of tasks, ``new_item`` and ``item_with_history``, its own pool and sentiment weight.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from agents.retrieval import TIE, top_indices
from agents.review.stars import GROUPS

# fallback: a retrieved review standing in for an LLM answer that had no text (a real review)
SOURCES = ("llm", "sample", "user", "item", "fallback")
GENERATED = ("llm", "sample")
RETRIEVED = ("user", "item", "fallback")
# pool -> (the sources a review may be chosen from, the sources that are pseudo-references)
POOLS = {
    "generated": (GENERATED, GENERATED),
    "retrieved": (RETRIEVED, RETRIEVED),
    "both": (SOURCES, SOURCES),
    "retrieved-vs-all": (RETRIEVED, SOURCES),
    "generated-vs-all": (GENERATED, SOURCES),
    "answer": (("llm", "fallback"), ("llm", "fallback")),
}

CENTROID = "centroid"  # the nearest-centroid baseline's review, without MBR
SIMILAR = "similar"  # the user's review most similar to the item (the stats agent's), without MBR
DIRECT = (CENTROID, SIMILAR)  # choices without MBR (and without a sentiment weight)
CHOICES = (*POOLS, *DIRECT)


def uses_samples(pool: str) -> bool:
    """Whether a choice can use sampled answers, as candidates or as pseudo-references (a direct
    choice, ``retrieved`` and ``answer`` cannot: with a selection rule their tasks draw none)."""
    return pool in POOLS and "sample" in {*POOLS[pool][0], *POOLS[pool][1]}


def option_name(pool: str, weight: float | None = None) -> str:
    """How a choice is named in rules, tables and predictions: the pool, with its weight for MBR."""
    return pool if pool in DIRECT else f"{pool} w{weight:g}"


RULE_KEYS = ("agent", "llm", "adapter", "store")  # a run's fingerprint inputs a rule was chosen for


def chosen_for(inputs: dict) -> str:
    """The digest of what a selection rule was chosen with (eval.review.selection records it from the
    validation run's fingerprint; the review runner compares the run that reads it): the agent config
    (visibility included), the LLM settings, the adapter's digest and the store, not the tasks."""
    from data_prep.fingerprint import digest

    return digest({k: inputs.get(k) for k in RULE_KEYS})


def read_rule(path: str | Path) -> dict:
    """A selection rule (eval.review.selection), checked: every group with a known pool, and a weight >= 0 for
    each MBR pool."""
    rule = json.loads(Path(path).read_text())
    groups = rule.get("groups") if isinstance(rule, dict) else None
    if not isinstance(groups, dict) or set(groups) != set(GROUPS):
        raise ValueError(f"{path}: a selection rule needs groups {GROUPS}")
    for name, chosen in groups.items():
        fields = chosen if isinstance(chosen, dict) else {}
        pool, weight = fields.get("pool"), fields.get("sentiment_weight")
        if pool not in CHOICES or (
            pool not in DIRECT and not (isinstance(weight, int | float) and weight >= 0)
        ):
            raise ValueError(
                f"{path}: group {name} needs a pool in {CHOICES} and, for an MBR pool, a sentiment_weight "
                f">= 0; got {chosen}"
            )
    return rule


def mbr_index(
    embeddings: np.ndarray,
    sentiments: np.ndarray,
    target: float,
    sentiment_weight: float,
    choose: list[int] | None = None,
) -> int:
    """The row of least risk (above) among ``choose`` (default: every row), each judged against every
    other row; embeddings unit rows, sentiments VADER compounds."""
    n = len(embeddings)
    rows = list(range(n)) if choose is None else list(choose)
    if not rows:
        raise ValueError("MBR needs at least one candidate")
    if n == 1:
        return rows[0]
    cosine = embeddings[rows] @ embeddings.T
    distance = (1.0 - cosine) / 2
    topic = (distance.sum(axis=1) - distance[np.arange(len(rows)), rows]) / (n - 1)
    risk = 0.5 * topic + sentiment_weight * 0.25 * np.abs(np.asarray(sentiments)[rows] - target) / 2
    return rows[int(top_indices(-risk, 1, tolerance=TIE)[0])]


def choose(
    sources: list[str],
    embeddings: np.ndarray,
    sentiments: np.ndarray,
    target: float,
    weight: float,
    pool: str,
    centroid: int | None = None,
) -> int | None:
    """The index of the chosen candidate under ``pool`` (CHOICES); None when none may be chosen.
    ``centroid``: the position of the nearest-centroid baseline's review (the ``centroid`` pool);
    ``similar`` is the first ``user`` candidate (they come most similar to the item first)."""
    if pool == CENTROID:
        return centroid
    if pool == SIMILAR:
        return next((i for i, s in enumerate(sources) if s == "user"), None)
    allowed, references = POOLS[pool]
    rows = [i for i, s in enumerate(sources) if s in allowed or s in references]
    pick = [k for k, i in enumerate(rows) if sources[i] in allowed]
    if not pick:
        return None
    return rows[mbr_index(embeddings[rows], np.asarray(sentiments)[rows], target, weight, pick)]


class SentimentByStars:
    """The mean VADER compound of the reviews with each whole number of stars, as of a moment: per star
    value, time-sorted cumulative sums, so a lookup is one binary search."""

    def __init__(self, rows: Iterable[tuple[int, float, float]]):
        """rows: (ts, stars, compound) of every review that may inform a prediction."""
        self.times: dict[int, list[int]] = {s: [] for s in range(1, 6)}
        self.sums: dict[int, list[float]] = {s: [0.0] for s in range(1, 6)}
        for ts, stars, compound in sorted(rows):
            s = int(round(stars))
            if s in self.times:
                self.times[s].append(ts)
                self.sums[s].append(self.sums[s][-1] + compound)

    @classmethod
    def from_store(cls, store) -> SentimentByStars:
        """Over every review the store shows (task pairs blocked), scored with the offline VADER."""
        from agents.encoders import VaderSentiment
        from data_prep.store import to_epoch

        reviews = list(store.visible_reviews())
        compounds = VaderSentiment(offline=True)([r["text"] for r in reviews])
        return cls((to_epoch(r["date"]), r["stars"], c) for r, c in zip(reviews, compounds, strict=True))

    def expected(self, stars: float, before: int | None) -> float:
        """The mean compound of the reviews with round(stars) stars older than ``before`` (None: all);
        with none, the nearest star value that has some (ties: the lower), else 0."""
        target = min(5, max(1, int(round(stars))))
        for s in sorted(range(1, 6), key=lambda v: (abs(v - target), v)):
            n = len(self.times[s]) if before is None else bisect.bisect_left(self.times[s], before)
            if n:
                return self.sums[s][n] / n
        return 0.0


def centroid_of(row: dict) -> int | None:
    """The position of the nearest-centroid baseline's review in a prediction's pool (None: no history)."""
    return next((k for k, c in enumerate(row["candidates"]) if c.get("centroid")), None)


def reselect(
    rows: list[dict], vectors: dict[str, np.ndarray], targets: list[float], pool: str, sentiment_weight: float
) -> list[dict]:
    """Rows of an mbr run (each with its ``candidates``) with the review re-chosen from ``pool``'s sources
    with ``sentiment_weight``; ``vectors``: unit embedding per candidate text; ``targets``: each row's
    expected VADER compound. Rows whose pool has none of those sources keep candidate 0 (the LLM's
    answer) and get ``"empty_pool": True``. The LLM is not asked again."""
    out = []
    for row, target in zip(rows, targets, strict=True):
        candidates = row["candidates"]
        new = {k: v for k, v in row.items() if k not in ("candidates", "chosen", "chosen_source")}
        v = np.stack([vectors[c["text"]] for c in candidates])
        s = np.array([c["vader"] for c in candidates])
        chosen = choose(
            [c["source"] for c in candidates], v, s, target, sentiment_weight, pool, centroid_of(row)
        )
        if chosen is None:
            chosen, new["empty_pool"] = 0, True
        new.update(
            review=candidates[chosen]["text"], chosen=chosen, chosen_source=candidates[chosen]["source"]
        )
        out.append(new)
    return out
