"""Where shared data and caches live. Both can be moved with environment variables."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def raw_dir() -> Path:
    """The real data samples: $USERSIM_RAW, default ../shared/data/raw beside the repository."""
    return Path(os.environ.get("USERSIM_RAW", REPO_ROOT.parent / "shared" / "data" / "raw"))


def cache_dir() -> Path:
    """Derived artefacts worth keeping between runs (offline lexicon, stand-in classifiers, converted
    models): $USERSIM_CACHE, default ~/.cache/usersim."""
    path = Path(os.environ.get("USERSIM_CACHE", Path.home() / ".cache" / "usersim"))
    path.mkdir(parents=True, exist_ok=True)
    return path
