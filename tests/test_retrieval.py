"""BM25 by hand, and the retriever's ranking and encoder cache."""

import math

import numpy as np
import pytest

from agents.retrieval import Retriever, bm25_scores


def test_bm25_matches_a_hand_computed_score():
    documents = ["tacos tacos salsa", "coffee", "tacos coffee shop"]
    scores = bm25_scores("Tacos!", documents, k1=1.5, b=0.75)
    avg = (3 + 1 + 3) / 3
    idf = math.log(1 + (3 - 2 + 0.5) / (2 + 0.5))  # "tacos" is in 2 of 3 documents

    def term(tf, length):
        return idf * tf * 2.5 / (tf + 1.5 * (1 - 0.75 + 0.75 * length / avg))

    assert scores == pytest.approx([term(2, 3), 0.0, term(1, 3)])
    assert bm25_scores("nothing here", documents).tolist() == [0.0, 0.0, 0.0]
    assert bm25_scores("tacos", []).tolist() == []


def test_retriever_ranks_and_encodes_each_text_once():
    calls = []

    def encoder(texts):  # a 2-d "embedding": how much each text is about tacos vs coffee
        calls.append(list(texts))
        return np.array([[t.count("tacos") + 0.1, t.count("coffee") + 0.1] for t in texts])

    retriever = Retriever(encoder)
    reviews = [{"text": "coffee coffee"}, {"text": "tacos tacos"}, {"text": "tacos and coffee"}]
    assert [r["text"] for r in retriever.rank("tacos", reviews, 2)] == ["tacos tacos", "tacos and coffee"]
    retriever.rank_many([("coffee", reviews, 1), ("tacos", reviews, 1)])
    assert retriever.encoded == 5 and sum(map(len, calls)) == 5  # 3 reviews + 2 queries, once each
    assert Retriever(None).rank("tacos", reviews, 1)[0]["text"] == "tacos tacos"  # BM25 without an encoder


def test_a_tie_to_the_centroid_goes_to_the_older_review_whatever_the_float_noise(monkeypatch):
    """A user with two reviews: both are exactly as close to their centroid. Float32 embeddings of a
    text differ in the 7th digit with the batch they were encoded in; that noise must not decide which
    review the nearest-centroid baseline and the MBR pool pick (they once disagreed on two tasks)."""
    import agents.retrieval
    from agents.retrieval import Retriever, top_indices

    base = {"old review": np.array([1.0, 0.0, 0.0]), "new review": np.array([0.6, 0.8, 0.0])}
    history = [{"text": "old review"}, {"text": "new review"}]

    def encoder(noise):
        return lambda texts: np.stack(
            [base[t] + (np.array([noise, 0, 0]) if t == "new review" else 0) for t in texts]
        )

    for noise in (+1e-7, -1e-7):  # the newer review nudged ahead, then behind
        assert Retriever(encoder(noise)).centroid_review(history, [])["text"] == "old review"
    monkeypatch.setattr(agents.retrieval, "TIE", 0.0)  # without the tolerance the noise decides
    assert Retriever(encoder(+1e-7)).centroid_review(history, [])["text"] == "new review"
    assert top_indices(np.array([0.95533562, 0.95533568]), 1).tolist() == [1]  # exact order: noise wins
    assert top_indices(np.array([0.95533562, 0.95533568]), 1, tolerance=1e-5).tolist() == [0]
    assert top_indices(np.array([0.1, 0.5, 0.3]), 2, tolerance=1e-5).tolist() == [1, 2]
