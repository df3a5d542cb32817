"""Training and inference feed the model the same prompt token ids, for each recipe's tokenizer family.

The real Llama-3.1 and Qwen2.5 tokenizers are gated or not cached here, so each family is rebuilt
locally: a small byte-level BPE trained on review text, wrapped in the class the family's
tokenizer_config names, with the family's special tokens, BOS behaviour and (shortened) chat template:

- llama3: PreTrainedTokenizerFast (TokenizersBackend), a post-processor that adds <|begin_of_text|>,
  and a template that writes it too: the case where TRL's text tokenization added a second BOS;
- qwen2: Qwen2Tokenizer, no BOS, the default system prompt;
- gemma3: a tokenizer that adds <bos>, and the turn format data_prep/offline_models.py gives the offline
  Gemma 3 270M (which writes <bos> too), with <end_of_turn> as EOS;
- smollm2: the real SmolLM2 tokenizer from the offline package.

Training ids come from TRL's own dataset preparation (SFTTrainer), inference ids from the hf backend's
encoder; the tool-calling branches of the real templates are left out.
"""

import json

import pytest
import torch

from data_prep.offline_models import GEMMA_CHAT_TEMPLATE

LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{{- system + '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
QWEN2_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
FAMILIES = {
    "llama3": {
        "specials": [
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
        ],
        "tokens": {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "pad_token": "<|end_of_text|>",
        },
        "adds_bos": True,
        "template": LLAMA3_TEMPLATE,
        "class": None,  # Llama 3's tokenizer_config names PreTrainedTokenizerFast
    },
    "qwen2": {
        "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "tokens": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        "adds_bos": False,
        "template": QWEN2_TEMPLATE,
        "class": "Qwen2Tokenizer",
    },
    "gemma3": {
        "specials": ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
        "tokens": {"bos_token": "<bos>", "eos_token": "<end_of_turn>", "pad_token": "<pad>"},
        "adds_bos": True,
        "template": GEMMA_CHAT_TEMPLATE,
        "class": None,
    },
}


def build_family_tokenizer(family: str, texts: list[str], folder):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    spec = FAMILIES[family]
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2000, special_tokens=spec["specials"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    core.train_from_iterator(texts, trainer)
    steps = [processors.ByteLevel(trim_offsets=False)]
    if spec["adds_bos"]:
        bos = spec["tokens"]["bos_token"]
        steps.append(
            processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, core.token_to_id(bos))]
            )
        )
    core.post_processor = processors.Sequence(steps)
    PreTrainedTokenizerFast(
        tokenizer_object=core, chat_template=spec["template"], **spec["tokens"]
    ).save_pretrained(folder)
    if spec["class"]:
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text())
        config["tokenizer_class"] = spec["class"]
        config_path.write_text(json.dumps(config))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert spec["class"] in (None, type(tokenizer).__name__)
    return tokenizer


@pytest.fixture(scope="module")
def pair_rows(raw, tmp_path_factory):
    """A few real training pairs (prompt messages + completion) from the Amazon sample."""
    from data_prep import build, pairs, split

    root = tmp_path_factory.mktemp("tok_pairs")
    build.main(
        ["--source", "amazon2018", "--input", str(raw / "amazon2018_5core_small"), "--out", str(root / "d")]
    )
    split.main(
        ["--data", str(root / "d"), "--out", str(root / "t"), "--min-history", "2", "--max-tasks", "5"]
    )
    pairs.main(
        [
            "--data",
            str(root / "d"),
            "--tasks",
            str(root / "t"),
            "--out",
            str(root / "p"),
            "--max-tokens",
            "256",
        ]
    )
    rows = [json.loads(line) for line in (root / "p" / "train.jsonl").read_text().splitlines()[:6]]
    assert len(rows) == 6
    return rows


@pytest.fixture(scope="module", params=["llama3", "qwen2", "gemma3", "smollm2"])
def family_model(request, pair_rows, tmp_path_factory):
    """A tiny random Llama saved with the family's tokenizer."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from data_prep.offline_models import smollm2_offline

    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "smollm2":
        tokenizer = AutoTokenizer.from_pretrained(smollm2_offline())
        tokenizer.save_pretrained(folder)
    else:
        texts = [m["content"] for r in pair_rows for m in r["prompt"]] + [
            r["completion"][0]["content"] for r in pair_rows
        ]
        tokenizer = build_family_tokenizer(request.param, texts, folder)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    return request.param, folder


@pytest.mark.slow
def test_training_and_inference_prompt_ids_are_identical(family_model, pair_rows, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from agents.llm import HFBackend, LLMConfig
    from train.sft import trl_example

    family, folder = family_model
    backend = HFBackend(LLMConfig(model=str(folder), device="cpu"))
    tokenizer = backend.tokenizer
    data = Dataset.from_list([trl_example(tokenizer, row) for row in pair_rows])
    args = SFTConfig(output_dir=str(tmp_path), max_length=None, report_to=[], use_cpu=True, bf16=False)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(folder),
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
    )
    for row, example in zip(pair_rows, trainer.train_dataset, strict=True):
        ids, labels = example["input_ids"], example["labels"]
        start = next(i for i, label in enumerate(labels) if label != -100)
        served = backend.encode([row["prompt"]])["input_ids"][0].tolist()
        assert ids[:start] == served, family  # the prompt trained on is the prompt served, token for token
        if family in ("llama3", "gemma3"):
            assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1  # one BOS
        if family == "gemma3":  # the system message opens the first user turn; the model's turn follows
            prompt = tokenizer.decode(served)
            assert prompt.startswith("<bos><start_of_turn>user\n" + row["prompt"][0]["content"] + "\n\n")
            assert prompt.endswith("<end_of_turn>\n<start_of_turn>model\n")
        assert ids[-1] == tokenizer.eos_token_id and labels[start:] == ids[start:]
        assert tokenizer.decode(ids[start:]) == row["completion"][0]["content"] + tokenizer.eos_token
