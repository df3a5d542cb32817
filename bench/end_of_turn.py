"""Has an adapter learned where an answer ends? The probability of EOS right after each true completion of
validation pairs, teacher-forced. The Gemma 3 270M adapter ran every answer to the token cap; this measures why.

    python -m bench.end_of_turn --adapter runs/quality/amazon/sft_gemma --model gemma3-270m-offline \\
        --pairs runs/quality/amazon/pairs_gemma --rows 20

Prints, for the first --rows validation pairs (spread over the file), the mean probability of the
tokenizer's EOS (the chat template's end of turn) after the completion, how often EOS is the most likely
next token there, and the base model's original EOS when the tokenizer's differs (Gemma's <eos>).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from data_prep.offline_models import resolve_model
from data_prep.prompt import render_prompt
from train.sft import spread


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--adapter", type=Path, required=True)
    parser.add_argument("--model", required=True, help="the adapter's base model")
    parser.add_argument(
        "--pairs", type=Path, required=True, help="data_prep.pairs folder made with its tokenizer"
    )
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args(argv)

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.adapter)
    base = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, args.adapter).eval()
    lines = (args.pairs / "validation.jsonl").read_text().splitlines()
    rows = [json.loads(lines[i]) for i in spread(len(lines), args.rows)]
    stops = {"eos": tokenizer.eos_token_id}
    original = base.config.eos_token_id
    if isinstance(original, int) and original != tokenizer.eos_token_id:
        stops["base eos"] = original
    probability = {name: [] for name in stops}
    top = []
    for row in rows:
        text = render_prompt(tokenizer, row["prompt"]) + row["completion"][0]["content"]
        ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            p = torch.softmax(model(ids).logits[0, -1].float(), -1)
        for name, token in stops.items():
            probability[name].append(float(p[token]))
        top.append(int(p.argmax()) == tokenizer.eos_token_id)
    report = {
        "adapter": str(args.adapter),
        "rows": len(rows),
        "eos_token": tokenizer.eos_token,
        **{f"mean_p_{name.replace(' ', '_')}": sum(v) / len(v) for name, v in probability.items()},
        "eos_is_top": sum(top) / len(top),
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
