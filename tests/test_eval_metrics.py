import zipfile

import nltk
import numpy as np
import pytest
from nltk.sentiment import SentimentIntensityAnalyzer

from agents.lexicon import NLTK_LEXICON_SHA256, nltk_lexicon_text, offline_nltk_data
from eval.metrics import (
    aggregate,
    clip_stars,
    emotion_errors,
    paired_bootstrap,
    sentiment_errors,
    star_errors,
    topic_errors,
)
from eval.scoring import score_pairs


def test_star_error_clips_like_the_official_evaluator():
    pred, truth = np.array([7, -1, 3.5, 4]), np.array([5, 1, 4, 4])
    assert star_errors(pred, truth) == pytest.approx([0.0, 0.2, 0.1, 0.0])
    clipped, outside = clip_stars(pred)
    assert clipped.tolist() == [5, 0, 3.5, 4] and outside.tolist() == [True, True, False, False]


def test_text_terms_on_hand_made_vectors():
    assert sentiment_errors([0.5, -0.5], [-0.5, -0.5]) == pytest.approx([0.5, 0.0])
    assert emotion_errors([[1, 0, 0, 0], [0.25] * 4], [[0, 1, 0, 0], [0.25] * 4]) == pytest.approx([0.5, 0.0])
    # orthogonal, opposite, parallel of another length (cosine ignores the norm), identical
    a = np.array([[1.0, 0], [1, 0], [1, 2], [3, 4]])
    b = np.array([[0.0, 1], [-1, 0], [2, 4], [3, 4]])
    assert topic_errors(a, b) == pytest.approx([0.5, 1.0, 0.0, 0.0], abs=1e-12)
    with pytest.raises(ValueError, match="all zeros"):
        topic_errors([[0.0, 0.0]], [[1.0, 0.0]])


def test_aggregate_by_hand():
    result = aggregate(np.array([0, 0.2]), np.array([0.1, 0.3]), np.array([0.2, 0.2]), np.array([0.4, 0.0]))
    # PE = 1 - 0.1; RG = 1 - (0.25*0.2 + 0.25*0.2 + 0.5*0.2) = 0.8; overall = (0.9 + 0.8) / 2
    assert result["preference_estimation"] == pytest.approx(0.9)
    assert result["review_generation"] == pytest.approx(0.8)
    assert result["overall"] == pytest.approx(0.85)
    with pytest.raises(ValueError):
        aggregate(np.array([0.1]), np.array([0.1, 0.2]), np.array([0.1]), np.array([0.1]))


def test_paired_bootstrap_by_hand():
    zeros = np.zeros(40)
    a = {"star": np.full(40, 0.1), "sentiment": zeros, "emotion": zeros, "topic": np.full(40, 0.2)}
    b = {**a, "star": np.full(40, 0.3)}  # b's stars are worse on every task by 0.2 (normalised)
    pe = paired_bootstrap(a, b, "preference_estimation", resamples=200)
    assert pe["difference"] == pytest.approx(0.2) and pe["ci95"] == pytest.approx([0.2, 0.2])
    assert pe["share_of_resamples_above_zero"] == 1.0
    overall = paired_bootstrap(a, b, "overall", resamples=200)
    assert overall["difference"] == pytest.approx(0.1)  # half of the PE gain, RG equal
    mixed = {**a, "star": np.tile([0.0, 0.2], 20)}  # better on half the tasks, worse on the other half
    tie = paired_bootstrap(mixed, a, "preference_estimation", resamples=500)
    assert tie["difference"] == pytest.approx(0.0) and tie["ci95"][0] < 0 < tie["ci95"][1]
    with pytest.raises(ValueError, match="same tasks"):
        paired_bootstrap(a, {k: v[:10] for k, v in b.items()}, "overall")


def test_offline_lexicon_is_nltks_byte_for_byte(raw):
    reference = zipfile.ZipFile(raw / "nltk_data" / "sentiment" / "vader_lexicon.zip")
    assert reference.read("vader_lexicon/vader_lexicon.txt") == nltk_lexicon_text().encode()
    import hashlib

    assert hashlib.sha256(nltk_lexicon_text().encode()).hexdigest() == NLTK_LEXICON_SHA256


@pytest.mark.slow
def test_offline_vader_scores_equal_nltks_on_real_texts(raw, monkeypatch):
    import gzip
    import json

    texts = [json.loads(line)["text"] for line in (raw / "yelp_asc_sample" / "review_subset.json").open()][
        :1500
    ]
    for line in gzip.open(raw / "amazon2018_5core_small" / "All_Beauty_5.json.gz", "rt"):
        texts.append(json.loads(line).get("reviewText", ""))
        if len(texts) == 2000:
            break
    monkeypatch.setattr(nltk.data, "path", [str(raw / "nltk_data")])
    reference = SentimentIntensityAnalyzer()
    monkeypatch.setattr(nltk.data, "path", [str(offline_nltk_data())])
    offline = SentimentIntensityAnalyzer()
    got = [offline.polarity_scores(t)["compound"] for t in texts]
    want = [reference.polarity_scores(t)["compound"] for t in texts]
    assert len(texts) == 2000 and got == want
    assert len(set(want)) > 500  # real, varied texts, not a degenerate sample


def test_known_vader_scores(offline_scorers):
    # the examples of the VADER paper's README, as nltk scores them
    scores = offline_scorers.sentiment(
        ["VADER is smart, handsome, and funny.", "VADER is not smart, handsome, nor funny.", ""]
    )
    assert scores.tolist() == [0.8316, -0.7424, 0.0]


def test_identical_texts_give_zero_text_errors(offline_scorers):
    texts = ["The pizza was cold and the waiter ignored us.", "Lovely staff, would come back!"]
    terms = score_pairs([7, 4], texts, [5, 4], texts, offline_scorers)
    assert terms["sentiment_error"].tolist() == [0, 0]
    assert np.all(terms["emotion_error"] == 0)
    assert np.all(terms["topic_error"] < 1e-7)
    assert terms["star_error"].tolist() == [0, 0]  # 7 is clipped to 5
    assert terms["stars_out_of_range"].tolist() == [True, False]
    probs = terms["emotion_pred"]
    assert probs.shape == (2, 4) and np.allclose(probs.sum(axis=1), 1)


def test_different_texts_give_larger_errors(offline_scorers):
    terms = score_pairs(
        [1],
        ["Terrible, rude staff and filthy tables. Never again."],
        [5],
        ["Wonderful evening, delicious food, we loved every minute!"],
        offline_scorers,
    )
    assert terms["star_error"][0] == pytest.approx(0.8)
    assert (
        terms["sentiment_error"][0] > 0.7
        and terms["emotion_error"][0] > 0.2
        and terms["topic_error"][0] > 0.1
    )


def test_paired_bootstrap_interval_matches_scipy_bca_on_hand_made_differences():
    from scipy.stats import bootstrap

    rng = np.random.default_rng(1)
    zeros = np.zeros(60)
    b = {"star": rng.uniform(0, 0.4, 60), "sentiment": zeros, "emotion": zeros, "topic": zeros}
    a = {**b, "star": b["star"] - rng.normal(0.02, 0.05, 60)}
    result = paired_bootstrap(a, b, "preference_estimation", resamples=999, seed=3)
    diff = b["star"] - a["star"]  # PE difference per task
    reference = bootstrap((diff,), np.mean, n_resamples=999, method="BCa", rng=3).confidence_interval
    assert result["difference"] == pytest.approx(diff.mean())
    assert result["ci95"] == pytest.approx([reference.low, reference.high])


def test_claims_lines_render_each_claim_with_its_bonferroni_level_and_extra_columns():
    from eval.metrics import claims_lines, paired_claim

    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 0.1, 50), rng.normal(0.0, 0.1, 50)
    claims = [
        {"claim": "x > y", "setting": "1,5", **paired_claim(a, b, 1 - 0.05 / 2)},
        {"claim": "y > x", "setting": "3,3", **paired_claim(b, a, 1 - 0.05 / 2)},
    ]
    lines = claims_lines(claims, {"setting": lambda c: f"({c['setting']})"})
    assert (
        lines[1]
        == "| claim | setting | difference | 97.50% CI (paired BCa, Bonferroni over 2) | resamples > 0 |"
    )
    assert lines[2] == "|---|---|---|---|---|"
    first, second = lines[3].split(" | "), lines[4].split(" | ")
    assert first[:3] == ["| x > y", "(1,5)", f"{claims[0]['difference']:+.3f}"] and first[-1] == "100.0% |"
    assert second[2].startswith("-") and second[-1] == "0.0% |"
    assert claims_lines([]) == []
