"""Benchmark: the offline base models side by side on the CPU, per LoRA training step and per generated
token, on the same real training pairs: is Gemma 3 270M affordable as the CPU default?

    python -m bench.base_model_bench --pairs runs/quality/amazon/pairs_all --out runs/bench/base_models.json
    python -m bench.base_model_bench ... --models smollm2-135m-instruct-offline gemma3-270m-offline

Each model gets the demo recipe's LoRA (r16 on q/k/v/o) and the same batch of 4 pairs as plain text
(prompt messages and completion joined; the timing does not depend on a chat template, which the Gemma
GGUF lacks), each cut to the same number of tokens. Reported per model: parameters, vocabulary, seconds
per optimizer step (mean of --steps after one warm-up step), and greedy decoding tokens/s for a batch of
8 prompts; and the ratios to the first model. The models run one after the other in one process, so
the ratios are measured side by side on the same machine state.
"""

from __future__ import annotations

import argparse
import json
import time
from itertools import islice
from pathlib import Path

from data_prep.offline_models import OFFLINE_GEMMA3, OFFLINE_SMOLLM2, resolve_model
from data_prep.provenance import provenance


def texts(pairs: Path, n: int) -> list[str]:
    with (pairs / "train.jsonl").open() as f:
        rows = [json.loads(line) for line in islice(f, n)]
    return ["\n".join(m["content"] for m in r["prompt"] + r["completion"]) for r in rows]


def measure(name: str, batch: list[str], tokens: int, steps: int, new_tokens: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    path = resolve_model(name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    lora = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    model = get_peft_model(model, lora)
    enc = tokenizer(batch[:4], return_tensors="pt", truncation=True, max_length=tokens, padding="max_length")
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4)
    model.train()
    times = []
    for step in range(steps + 1):
        start = time.perf_counter()
        loss = model(**enc, labels=enc.input_ids.masked_fill(enc.attention_mask == 0, -100)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step:  # the first step warms up
            times.append(time.perf_counter() - start)
        print(f"{name}: step {step} loss {loss.item():.3f}", flush=True)
    model.eval()
    prompts = tokenizer([t[:400] for t in batch[:8]], return_tensors="pt", padding=True)
    with torch.no_grad():
        start = time.perf_counter()
        out = model.generate(**prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        seconds = time.perf_counter() - start
    generated = (out.shape[1] - prompts.input_ids.shape[1]) * out.shape[0]
    return {
        "parameters": params,
        "vocabulary": len(tokenizer),
        "seconds_per_step": round(sum(times) / len(times), 3),
        "generated_tokens_per_second": round(generated / seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=Path, required=True, help="a data_prep.pairs folder")
    parser.add_argument("--models", nargs="+", default=[OFFLINE_SMOLLM2, OFFLINE_GEMMA3])
    parser.add_argument("--tokens", type=int, default=256, help="tokens per training sequence")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/base_models.json"))
    args = parser.parse_args()
    batch = texts(args.pairs, 8)
    results = {m: measure(m, batch, args.tokens, args.steps, args.new_tokens) for m in args.models}
    first = results[args.models[0]]
    for r in results.values():
        r["step_time_ratio"] = round(r["seconds_per_step"] / first["seconds_per_step"], 2)
        r["decode_speed_ratio"] = round(
            r["generated_tokens_per_second"] / first["generated_tokens_per_second"], 2
        )
    report = {"results": results, "settings": vars(args) | {"pairs": str(args.pairs), "out": str(args.out)},
              "provenance": provenance(["torch", "transformers", "peft"])}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
