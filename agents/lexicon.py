"""The VADER lexicon that nltk uses, rebuilt offline from the ``vadersentiment`` package.

nltk's ``SentimentIntensityAnalyzer`` reads ``sentiment/vader_lexicon.zip`` from a folder on
``nltk.data.path`` (``nltk.download('vader_lexicon')`` puts it there, which needs the network). The
``vadersentiment`` package ships the same lexicon except for six entries; this module applies those
six edits and writes the result in nltk's layout, so nltk scores exactly as it does with its own
lexicon (checked in tests/test_eval_metrics.py against the reference copy in ../shared).
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from data_prep.paths import cache_dir

# The whole difference, line by line: nltk's file lacks three entries, writes ":P" as a second ":p"
# (which, read last, overrides the first), and scores "badass" negatively.
DROP = {"flawed", "heart", "hearts"}
REPLACE = {
    ":P": ":p\t1.4\t0.8\t[3, 1, 0, 2, 1, 1, 2, 2, 1, 1]",
    "badass": "badass\t-0.6\t1.85472\t[-2, 3, 0, 0, -1, -3, -1, -3, 2, -1]",
}
# sha256 of vader_lexicon/vader_lexicon.txt inside nltk_data's sentiment/vader_lexicon.zip: the rebuilt
# text is byte-identical to it.
NLTK_LEXICON_SHA256 = "0aabac74cd95def2dbedc04ce55e39698d91113ffadb6d86b87dd337c4d2184d"


def nltk_lexicon_text() -> str:
    import vaderSentiment

    source = Path(vaderSentiment.__file__).with_name("vader_lexicon.txt").read_text(encoding="utf-8")
    lines = []
    for line in source.splitlines():
        word = line.split("\t", 1)[0]
        if word in DROP:
            continue
        lines.append(REPLACE.get(word, line))
    text = "\r\n".join(lines)  # nltk's copy has Windows line ends
    if hashlib.sha256(text.encode("utf-8")).hexdigest() != NLTK_LEXICON_SHA256:
        raise RuntimeError("the vadersentiment lexicon changed: the offline VADER would not equal nltk's")
    return text


def offline_nltk_data() -> Path:
    """A folder to put on nltk.data.path that holds sentiment/vader_lexicon.zip; built once."""
    text = nltk_lexicon_text().encode("utf-8")
    digest = hashlib.sha256(text).hexdigest()
    root = cache_dir() / "nltk_data" / digest[:16]
    target = root / "sentiment" / "vader_lexicon.zip"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        with zipfile.ZipFile(tmp, "w") as zf:
            zf.writestr("vader_lexicon/vader_lexicon.txt", text)
        tmp.replace(target)
    return root


def put_on_nltk_path() -> None:
    """Put the rebuilt lexicon's folder first on nltk.data.path, so code that looks for
    ``sentiment/vader_lexicon.zip`` before downloading it (websocietysimulator's import does) finds it
    without the network. Idempotent."""
    import nltk

    folder = str(offline_nltk_data())
    if folder not in nltk.data.path:
        nltk.data.path.insert(0, folder)
