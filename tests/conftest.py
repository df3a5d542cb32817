import gzip
import json
import os
from pathlib import Path

import pytest

RAW = Path(
    os.environ.get("USERSIM_RAW", Path(__file__).resolve().parents[1].parent / "shared" / "data" / "raw")
)


@pytest.fixture(scope="session")
def raw() -> Path:
    if not RAW.is_dir():
        raise RuntimeError(f"the real data samples are missing: expected {RAW} (set USERSIM_RAW)")
    return RAW


def write_lines(path: Path, lines: list) -> Path:
    """Write JSON lines; dicts are serialised, bytes/str are written as they are (for broken lines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"".join(
        (line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line)).encode())
        + b"\n"
        for line in lines
    )
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.fixture(scope="session")
def yelp_store(raw, tmp_path_factory) -> Path:
    """The Yelp sample built once per test session."""
    from data_prep import build

    out = tmp_path_factory.mktemp("yelp_store")
    build.main(
        ["--source", "asc", "--platform", "yelp", "--input", str(raw / "yelp_asc_sample"), "--out", str(out)]
    )
    return out


@pytest.fixture(scope="session")
def offline_scorers():
    """The offline evaluator models, loaded once (the emotion stand-in trains once into the cache)."""
    from eval.backends import build_scorers

    return build_scorers("offline", device="cpu")
