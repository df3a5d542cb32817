"""Training pairs for the conversational user simulator, from RecLLMSim conversations.

    python -m data_prep.converse_pairs --data ../shared/data/raw/recllmsim --out runs/pairs/recllmsim \\
        --max-tokens 1024

Every user turn of every conversation becomes one example: the prompt (data_prep.prompt's
build_converse_messages) shows the persona, the task context and the dialogue so far; the completion
is ``intent: I\\nmessage: TEXT`` with I in the common intent vocabulary (data_prep.recllmsim). The
dialogue keeps the most recent turns that fit ``--max-tokens`` (prompt + completion + EOS); how many
turns were cut is counted per example and in the card, and an example that does not fit even without
any earlier turn is left out and counted. Each shown turn is cut at MAX_TURN_CHARS characters (the
assistants write long lists), marked with "…".

Examples are split into train and validation by persona (the LLM users' preference id, the person for
real people): no persona is in both. ``--language en`` (default) uses the LLM users' English
conversations; ``--language zh`` uses their Chinese translations and the real people's conversations.

Writes OUT/train.jsonl, validation.jsonl (prompt/completion messages plus ``example_id``, ``persona``,
``cut_turns``), card.json (counts, token-length percentiles, options; train.sft reads ``max_tokens``
from it) and README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data_prep import recllmsim
from data_prep.offline_models import OFFLINE_SMOLLM2, resolve_model
from data_prep.prompt import count_tokens, fit_converse_messages, format_turn
from data_prep.provenance import provenance


def is_validation(persona: str, fraction: float, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{persona}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def profile_text(conversation: recllmsim.Conversation, language: str = "en") -> str | None:
    """The persona as the simulator is told it: the LLM users' written preference (or its Chinese
    translation), or the real people's structured profile as lines."""
    if isinstance(conversation.profile, str):
        return conversation.profile_zh if language == "zh" else conversation.profile
    return "\n".join(
        f"{key.replace('_', ' ')}: {', '.join(map(str, value)) if isinstance(value, list) else value}"
        for key, value in conversation.profile.items()
    )


def text_of(turn: recllmsim.Turn, conversation: recllmsim.Conversation, language: str) -> str | None:
    if conversation.language == language:
        return turn.content
    return turn.content_zh if language == "zh" else None


def make_examples(loaded, tokenizer, language: str, max_tokens: int) -> tuple[list[dict], Counter]:
    examples, counts = [], Counter()
    for conversation in tqdm(loaded.conversations, desc="conversations", unit=" conv"):
        if language == "en" and conversation.language != "en":
            counts["other_language_conversations"] += 1
            continue
        task = (
            conversation.task_context_zh
            if conversation.source == "llm" and language == "zh"
            else conversation.task_context
        )
        profile = profile_text(conversation, language)
        if not task or not profile:
            counts["conversations_without_translation"] += 1
            continue
        dialogue: list[tuple[str, str]] = []
        for number, turn in enumerate(conversation.turns, start=1):
            text = text_of(turn, conversation, language)
            if text is None:  # the rest of the conversation cannot be shown in this language
                counts["turns_without_translation"] += len(conversation.turns) - number + 1
                break
            if turn.role == "user":
                completion = format_turn(turn.common_intents()[0], text)
                try:
                    messages, cut = fit_converse_messages(
                        tokenizer, profile, task, dialogue, max_tokens, completion
                    )
                except ValueError:
                    counts["too_long"] += 1
                else:
                    counts["turns_cut"] += cut
                    counts["examples_with_turns_cut"] += bool(cut)
                    examples.append(
                        {
                            "prompt": messages,
                            "completion": [{"role": "assistant", "content": completion}],
                            "example_id": f"{conversation.file}#{number}",
                            "persona": f"{conversation.source}:{conversation.persona}",
                            "task": conversation.task,
                            "cut_turns": cut,
                        }
                    )
            dialogue.append((turn.role, text))
    return examples, counts


def percentiles(values: list[int]) -> dict:
    if not values:
        return {}
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return {"p50": int(p50), "p90": int(p90), "p99": int(p99), "max": int(max(values))}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/raw/recllmsim"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--language", choices=["en", "zh"], default="en")
    parser.add_argument("--max-tokens", type=int, default=1024, help="budget for prompt + completion + EOS")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default=OFFLINE_SMOLLM2)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.tokenizer))
    loaded = recllmsim.load(args.data)
    examples, counts = make_examples(loaded, tokenizer, args.language, args.max_tokens)
    splits = {"train": [], "validation": []}
    for example in examples:
        split = "validation" if is_validation(example["persona"], args.val_fraction, args.seed) else "train"
        splits[split].append(example)
    args.out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        with open(args.out / f"{split}.jsonl", "w") as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    prompt_tokens = [count_tokens(tokenizer, e["prompt"]) for e in examples]
    full = [count_tokens(tokenizer, e["prompt"], e["completion"][0]["content"]) for e in examples]
    card = {
        "task": "converse",
        "examples": {split: len(rows) for split, rows in splits.items()},
        "personas": {split: len({r["persona"] for r in rows}) for split, rows in splits.items()},
        "conversations": dict(loaded.counts),
        "rejects": loaded.rejects,
        "left_out_or_cut": dict(counts),
        "token_lengths": {
            "prompt_tokens": percentiles(prompt_tokens),
            "completion_tokens": percentiles([f - p for f, p in zip(full, prompt_tokens, strict=True)]),
        },
        "tokenizer": args.tokenizer,
        "options": {
            "language": args.language,
            "max_tokens": args.max_tokens,
            "val_fraction": args.val_fraction,
            "seed": args.seed,
        },
        "split_rule": "by persona (sha256 of seed:persona): no persona in both splits",
        "data": str(args.data),
        "provenance": provenance(["transformers"]),
    }
    (args.out / "card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False))
    (args.out / "README.md").write_text(
        "# Conversational simulator training pairs\n\n"
        + "\n".join(f"- **{k}**: `{json.dumps(v, ensure_ascii=False)}`" for k, v in card.items())
        + "\n"
    )
    print(f"{card['examples']} examples ({card['personas']} personas) -> {args.out}; {dict(counts)}")
    print(f"token lengths: {card['token_lengths']}")
    return card


if __name__ == "__main__":
    main()
