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
def make_tasks():
    """make_tasks(store, out, n, seed): leave-last-out tasks for n users with at least 2 older reviews."""
    return _make_tasks


def _make_tasks(store: Path, out: Path, n: int, seed: int) -> Path:
    from data_prep import split

    split.main(
        [
            "--data",
            str(store),
            "--out",
            str(out),
            "--min-history",
            "2",
            "--max-tasks",
            str(n),
            "--seed",
            str(seed),
        ]
    )
    return out


@pytest.fixture(scope="session")
def offline_scorers():
    """The offline evaluator models, loaded once (the emotion stand-in trains once into the cache)."""
    from eval.backends import build_scorers

    return build_scorers("offline", device="cpu")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer Llama with random weights, saved with SmolLM2's tokenizer and chat template."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from data_prep.offline_models import smollm2_offline

    folder = tmp_path_factory.mktemp("tiny_llama")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_offline())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        initializer_range=0.3,  # large enough that a LoRA update can make the logits confident
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run where a CUDA device is present and are skipped, with that reason,
    where none is (`pytest -m gpu` on a GPU machine)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device; none is present here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
