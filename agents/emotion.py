"""An offline stand-in for ``cardiffnlp/twitter-roberta-base-emotion``.

A multinomial logistic regression on frozen all-MiniLM-L6-v2 sentence embeddings, trained on TweetEval
emotion, the official classifier's own training data (``../shared/data/raw/tweeteval_emotion``, or the
hub's ``cardiffnlp/tweet_eval`` when that folder is absent and the network is there). The regularisation
strength is chosen on the validation split by macro-F1; test macro-F1 and accuracy are reported with
every result. The fitted weights are cached on disk, keyed by the data, the encoder and the recipe.

It is a stand-in: its scores approximate the official model's, they are not the official model's. It
lives with the agents' encoders because an agent may use it too (the tuned-write agent's utility judges a
candidate's emotion against the user's and the item's older reviews); the evaluator scores with it offline.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from data_prep.paths import cache_dir, raw_dir

EMOTION_LABELS = ("joy", "optimism", "anger", "sadness")  # the official classifier's config order
EMOTION_CHARS = 300  # the official evaluator cuts texts to this many characters for emotion

RECIPE = {
    "classifier": "sklearn LogisticRegression (multinomial, lbfgs)",
    "C_grid": [0.1, 0.3, 1.0, 3.0, 10.0],
}
SPLITS = ("train", "val", "test")


def load_tweeteval(folder: Path | None = None) -> tuple[dict[str, tuple[list[str], list[str]]], str]:
    """split -> (texts, label names), and a hash of the data. Labels are mapped by name from
    mapping.txt (TweetEval orders them anger, joy, optimism, sadness; the official model does not)."""
    folder = Path(folder) if folder else raw_dir() / "tweeteval_emotion"
    if not folder.is_dir():
        return _tweeteval_from_hub()
    names = dict(line.split("\t") for line in (folder / "mapping.txt").read_text().strip().splitlines())
    digest, data = hashlib.sha256(), {}
    for split in SPLITS:
        texts = (folder / f"{split}_text.txt").read_text(encoding="utf-8").splitlines()
        labels = (folder / f"{split}_labels.txt").read_text().split()
        if len(texts) != len(labels):
            raise ValueError(f"{folder}: {split} has {len(texts)} texts but {len(labels)} labels")
        digest.update(
            (folder / f"{split}_text.txt").read_bytes() + (folder / f"{split}_labels.txt").read_bytes()
        )
        data[split] = (texts, [names[label].strip() for label in labels])
    if {n.strip() for n in names.values()} != set(EMOTION_LABELS):
        raise ValueError(f"{folder}/mapping.txt names {sorted(names.values())}, expected {EMOTION_LABELS}")
    return data, digest.hexdigest()


def _tweeteval_from_hub() -> tuple[dict, str]:
    try:
        from datasets import load_dataset

        ds = load_dataset("cardiffnlp/tweet_eval", "emotion")
    except Exception as err:
        raise SystemExit(
            f"error: TweetEval emotion is needed to train the offline emotion stand-in: not found in "
            f"{raw_dir() / 'tweeteval_emotion'} and not loadable from the hub ({type(err).__name__}: {err})"
        ) from err
    names = ds["train"].features["label"].names
    data = {
        s: (list(ds[k]["text"]), [names[i] for i in ds[k]["label"]])
        for s, k in zip(SPLITS, ("train", "validation", "test"), strict=True)
    }
    return data, hashlib.sha256(json.dumps(data).encode()).hexdigest()


def macro_f1(truth: np.ndarray, predicted: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(truth, predicted, labels=list(range(len(EMOTION_LABELS))), average="macro"))


class StandInEmotion:
    def __init__(self, encoder, tweeteval_dir: Path | None = None):
        self.encoder = encoder
        data, data_hash = load_tweeteval(tweeteval_dir)
        from sklearn import __version__ as sklearn_version

        identity = {"data": data_hash, "encoder": encoder.info, "recipe": RECIPE, "sklearn": sklearn_version}
        key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
        folder = cache_dir() / "emotion_standin" / key
        if not (folder / "card.json").exists():
            self._fit(data, folder, identity)
        weights = np.load(folder / "weights.npz")
        self.coef, self.intercept = weights["coef"], weights["intercept"]
        card = json.loads((folder / "card.json").read_text())
        self.info = {
            "model": f"logistic regression on {encoder.info['model']} embeddings, trained on TweetEval emotion",
            "files_sha256": {
                "weights.npz": hashlib.sha256((folder / "weights.npz").read_bytes()).hexdigest()
            },
            "cache": str(folder),
            **{k: card[k] for k in ("C", "val_macro_f1", "test_macro_f1", "test_accuracy", "train_size")},
            "exact": False,
        }

    def _fit(self, data: dict, folder: Path, identity: dict) -> None:
        from sklearn.linear_model import LogisticRegression

        print("training the offline emotion stand-in on TweetEval (once; cached) ...", flush=True)
        index = {label: i for i, label in enumerate(EMOTION_LABELS)}
        x = {s: self.encoder(texts) for s, (texts, _) in data.items()}
        y = {s: np.array([index[name] for name in names]) for s, (_, names) in data.items()}
        best = None
        for c in RECIPE["C_grid"]:
            clf = LogisticRegression(C=c, max_iter=2000).fit(x["train"], y["train"])
            f1 = macro_f1(y["val"], clf.predict(x["val"]))
            if best is None or f1 > best[0]:
                best = (f1, c, clf)
        val_f1, c, clf = best
        test_pred = clf.predict(x["test"])
        card = {
            "C": c,
            "val_macro_f1": round(val_f1, 4),
            "test_macro_f1": round(macro_f1(y["test"], test_pred), 4),
            "test_accuracy": round(float(np.mean(test_pred == y["test"])), 4),
            "train_size": len(y["train"]),
            "identity": identity,
        }
        folder.mkdir(parents=True, exist_ok=True)
        # classes_ are 0..3 = EMOTION_LABELS order, so the columns of predict_proba are in that order
        np.savez(folder / "weights.npz", coef=clf.coef_, intercept=clf.intercept_)
        (folder / "card.json").write_text(json.dumps(card, indent=2))
        print(
            f"emotion stand-in: C={c}, TweetEval test macro-F1 {card['test_macro_f1']}, accuracy {card['test_accuracy']}"
        )

    def probabilities(self, embeddings: np.ndarray) -> np.ndarray:
        logits = np.asarray(embeddings, np.float64) @ self.coef.T + self.intercept
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        return p / p.sum(axis=1, keepdims=True)

    def __call__(self, texts: list[str]) -> np.ndarray:
        return self.probabilities(self.encoder(texts))
