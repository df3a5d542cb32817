"""Rank candidate reviews by relevance to a query: sentence-embedding cosine, or BM25 when no encoder
is available. Callers pass only reviews the store lets them see (task pairs blocked, strictly older
than the task), so ranking can never surface a target or a future review."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np

_WORD = re.compile(r"\w+")


class BM25:
    """Okapi BM25 over a fixed corpus, tokenised once into postings (a catalogue searched many times)."""

    def __init__(self, documents: list[str], k1: float = 1.5, b: float = 0.75):
        self.k1, self.b, self.n = k1, b, len(documents)
        self.postings: dict[str, list[tuple[int, int]]] = {}  # term -> [(document, term frequency)]
        lengths = []
        for i, document in enumerate(documents):
            words = _WORD.findall(document.lower())
            lengths.append(len(words))
            for term, tf in Counter(words).items():
                self.postings.setdefault(term, []).append((i, tf))
        self.lengths = np.array(lengths, dtype=float)
        self.avg = float(self.lengths.mean()) if documents else 0.0

    def scores(self, query: str) -> np.ndarray:
        k1, b = self.k1, self.b
        scores = np.zeros(self.n)
        for term in set(_WORD.findall(query.lower())):
            postings = self.postings.get(term, [])
            df = len(postings)
            idf = math.log(1 + (self.n - df + 0.5) / (df + 0.5))
            for i, tf in postings:
                scores[i] += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * self.lengths[i] / (self.avg or 1)))
        return scores


def bm25_scores(query: str, documents: list[str], k1: float = 1.5, b: float = 0.75) -> np.ndarray:
    """Okapi BM25 of every document for the query, with the documents themselves as the corpus."""
    return BM25(documents, k1, b).scores(query)


TIE = 1e-5  # cosines closer than this are a tie (broken by position: the older review)


def top_indices(scores: np.ndarray, k: int | None = None, tolerance: float = 0.0) -> np.ndarray:
    """Indices of the k highest scores, best first, ties by index (all of them when k is None). With
    ``tolerance``, scores within it of the best remaining one count as tied: float32 embeddings of one
    text differ in the 7th digit with the batch they were encoded in, which must not decide a tie."""
    scores = np.asarray(scores, dtype=np.float64)
    if tolerance <= 0:
        return np.argsort(-scores, kind="stable")[:k]
    remaining, order = list(range(len(scores))), []
    while remaining and (k is None or len(order) < k):
        best = scores[remaining].max()
        order.append(next(i for i in remaining if scores[i] >= best - tolerance))
        remaining.remove(order[-1])
    return np.array(order, dtype=np.int64)


class Retriever:
    """``encoder``: texts -> embeddings (e.g. agents.encoders' packaged MiniLM); None means BM25.

    Embeddings are cached per text (at most ``cache_size`` texts; the cache is emptied when full), and
    ``rank_many`` encodes every new text of a batch of requests in one encoder call."""

    def __init__(self, encoder=None, cache_size: int = 500_000):
        self.encoder, self.cache_size = encoder, cache_size
        self._cache: dict[str, np.ndarray] = {}
        self.method = "embedding" if encoder is not None else "bm25"
        self.encoded = 0  # texts sent to the encoder

    def embed(self, texts: list[str]) -> np.ndarray:
        """Unit-length embeddings of the texts (cached); needs an encoder."""
        if self.encoder is None:
            raise ValueError("embeddings need an encoder (BM25 ranks, it does not embed)")
        return self._embed(list(texts))

    def _embed(self, texts: list[str]) -> np.ndarray:
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if todo:
            if len(self._cache) + len(todo) > self.cache_size:
                self._cache.clear()
            vectors = np.asarray(self.encoder(todo), dtype=np.float32)
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
            self._cache.update(zip(todo, vectors, strict=True))
            self.encoded += len(todo)
        return np.stack([self._cache[t] for t in texts])

    def rank(self, query: str, reviews: list[dict], k: int) -> list[dict]:
        """The k most relevant reviews, most relevant first."""
        if k <= 0 or not reviews:
            return []
        texts = [r["text"] for r in reviews]
        if self.encoder is not None:
            vectors = self._embed([query, *texts])
            scores = vectors[1:] @ vectors[0]
        else:
            scores = bm25_scores(query, texts)
        return [reviews[i] for i in top_indices(scores, k)]

    def nearest_centroid(self, reviews: list[dict], candidates: list[dict], k: int) -> list[dict]:
        """The k candidates nearest (cosine) the centroid of the reviews' unit embeddings, nearest
        first, ties by position; needs an encoder."""
        if k <= 0 or not reviews or not candidates:
            return []
        centroid = self.embed([r["text"] for r in reviews]).mean(axis=0)
        scores = self.embed([r["text"] for r in candidates]) @ centroid
        return [candidates[i] for i in top_indices(scores, k, tolerance=TIE)]

    def centroid_review(self, history: list[dict], item_reviews: list[dict]) -> dict | None:
        """What the nearest-centroid baseline writes (eval.review.baselines): the item's review nearest the
        centroid of the user's reviews; for an item with no review, the user's own review nearest it
        (ties: the earlier in the list, i.e. the older); None without a user history."""
        best = self.nearest_centroid(history, item_reviews or history, 1)
        return best[0] if best else None

    def rank_many(self, requests: list[tuple[str, list[dict], int]]) -> list[list[dict]]:
        """``rank`` for each (query, reviews, k), with all new texts encoded together first."""
        if self.encoder is not None:
            texts = [
                t
                for q, reviews, k in requests
                if k > 0 and reviews
                for t in (q, *(r["text"] for r in reviews))
            ]
            if texts:
                self._embed(texts)
        return [self.rank(q, reviews, k) for q, reviews, k in requests]


def hashed_bag_of_words(texts: list[str], dims: int = 32) -> np.ndarray:
    """A deterministic, model-free stand-in for a sentence encoder (unit-length hashed word counts):
    for tests and for benchmarks that measure everything but the encoder."""
    import hashlib

    out = np.zeros((len(texts), dims))
    for row, text in enumerate(texts):
        for word in text.lower().split():
            out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % dims] += 1
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)
