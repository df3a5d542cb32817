"""Rank candidate reviews by relevance to a query: sentence-embedding cosine, or BM25 when no encoder
is available. Callers pass only reviews the store lets them see (task pairs blocked, strictly older
than the task), so ranking can never surface a target or a future review."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

_WORD = re.compile(r"\w+")


def bm25_scores(query: str, documents: list[str], k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """Okapi BM25 of every document for the query, with the documents themselves as the corpus."""
    docs = [_WORD.findall(d.lower()) for d in documents]
    terms = set(_WORD.findall(query.lower()))
    n, avg = len(docs), (sum(map(len, docs)) / len(docs)) if docs else 0.0
    df = Counter(t for d in docs for t in set(d) if t in terms)
    scores = np.zeros(n)
    for i, doc in enumerate(docs):
        tf = Counter(doc)
        for t in terms:
            if tf[t]:
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                scores[i] += idf * tf[t] * (k1 + 1) / (tf[t] + k1 * (1 - b + b * len(doc) / (avg or 1)))
    return scores


class Retriever:
    """``encoder``: texts -> embeddings (e.g. eval.backends' packaged MiniLM); None means BM25."""

    def __init__(self, encoder=None):
        self.encoder = encoder
        self._cache: dict[str, np.ndarray] = {}
        self.method = "embedding" if encoder is not None else "bm25"

    def _embed(self, texts: list[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if todo:
            for text, vector in zip(todo, np.asarray(self.encoder(todo), dtype=np.float64), strict=True):
                self._cache[text] = vector / (np.linalg.norm(vector) or 1.0)
        return np.stack([self._cache[t] for t in texts])

    def rank(self, query: str, reviews: list[dict], k: int) -> list[dict]:
        """The k most relevant reviews, returned oldest first (the order the prompt shows)."""
        if k <= 0 or not reviews:
            return []
        texts = [r["text"] for r in reviews]
        if self.encoder is not None:
            vectors = self._embed([query, *texts])
            scores = vectors[1:] @ vectors[0]
        else:
            scores = bm25_scores(query, texts)
        best = np.argsort(-scores, kind="stable")[:k]
        return sorted((reviews[i] for i in best), key=lambda r: (r["date"], r["review_id"]))
