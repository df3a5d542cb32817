"""Training pairs for the conversational user simulator, from RecLLMSim conversations, in the format
the simulator uses the model with.

    python -m data_prep.converse_pairs --data ../shared/data/raw/recllmsim --out runs/pairs/recllmsim \\
        --max-tokens 1024

Every user turn of every conversation becomes two examples, each a single user message as the
simulator sends it (data_prep.prompt's converse_* builders, the same functions agents/converse uses)
with the JSON answer the simulator parses:

- an **action** example: the persona, the task, the dialogue so far and the action menu
  (converse_action_prompt) -> ``{"actions": [...]}``, the turn's real intents mapped to the simulator's
  actions (INTENT_ACTION; on a first turn only the first three actions are offered, as in the simulator:
  an intent outside them is mapped to clarify_preference and counted);
- a **response** example: the persona, the task, the dialogue so far and what the user does in this turn
  (converse_response_prompt) -> ``{"message": TEXT}``.

What the data does not record is left empty rather than invented: the persona's tendencies and style
lines, and the satisfaction line after the first turn (the LLM users rated whole conversations, not
turns; no rating examples are made for that reason). The dialogue is converse_transcript's: the last
turns whole while they fit what ``--max-tokens`` leaves after the rest of the prompt and the
completion; the first turn that does not fit (the newest one included: the assistants write long
lists) is cut by tokens, marked "…" and counted, and an example whose prompt does not fit even without
any turn is left out and counted.

Examples are split into train and validation by persona (the LLM users' preference id, the person for
real people): no persona is in both. ``--language en`` (default) uses the LLM users' English
conversations; ``--language zh`` uses their Chinese translations and the real people's conversations.

Writes OUT/train.jsonl, validation.jsonl (prompt/completion messages plus ``example_id``, ``kind``,
``persona``, ``cut_turns``), card.json (counts, token-length percentiles, options; train.sft reads
``max_tokens`` from it) and README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections import Counter
from functools import partial
from pathlib import Path

from tqdm import tqdm

from data_prep import recllmsim
from data_prep.io import write_atomic, write_card
from data_prep.offline_models import OFFLINE_SMOLLM2, resolve_model
from data_prep.pairs import percentiles
from data_prep.prompt import (
    ACTION_TEXT,
    ACTIONS,
    converse_action_prompt,
    converse_response_prompt,
    converse_transcript,
    count_tokens,
    satisfaction_words,
)
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


# the data's intents as the simulator's actions (the inverse of data_prep.prompt.ACTION_INTENT)
INTENT_ACTION = {
    "recommend": "request_recommendation",
    "plan": "ask_plan",
    "search": "ask_attributes",
    "evaluate": "give_feedback",
    "other": "clarify_preference",
}


def fitted(tokenizer, build, dialogue, max_tokens: int, completion: str) -> tuple[list[dict], int] | None:
    """The prompt built with the transcript that fits: converse_transcript under the budget left by the
    rest of the prompt and the completion. None when even the newest turn alone does not fit."""
    empty = [{"role": "user", "content": build("")}]
    budget = max_tokens - count_tokens(tokenizer, empty, completion)
    if budget <= 0:
        return None
    # the newest turn too is cut when it alone is over the budget (the assistants write long lists);
    # in use the simulator shows it whole, within the model's window
    transcript, cut, _ = converse_transcript(dialogue, len(dialogue), budget, tokenizer, keep_newest=False)
    messages = [{"role": "user", "content": build(transcript)}]
    while count_tokens(tokenizer, messages, completion) > max_tokens and budget > 0:  # "…" and joins
        budget -= 8
        transcript, cut, _ = converse_transcript(
            dialogue, len(dialogue), budget, tokenizer, keep_newest=False
        )
        messages = [{"role": "user", "content": build(transcript)}]
    if count_tokens(tokenizer, messages, completion) > max_tokens:
        return None
    return messages, cut


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
                first = not dialogue
                options = ACTIONS[:3] if first else ACTIONS
                actions = []
                for intent in turn.common_intents():
                    action = INTENT_ACTION[intent]
                    if action not in options:
                        counts["first_turn_actions_remapped"] += 1
                        action = "clarify_preference"
                    actions.append(action)
                actions = list(dict.fromkeys(actions))[:2]
                satisfaction = satisfaction_words(None) if first else ""
                wanted = "; ".join(ACTION_TEXT[a] for a in actions)
                builds = {
                    "action": (
                        partial(
                            converse_action_prompt,
                            profile,
                            task,
                            "",
                            satisfaction=satisfaction,
                            options=options,
                        ),
                        json.dumps({"actions": actions}),
                    ),
                    "response": (
                        partial(
                            converse_response_prompt,
                            profile,
                            task,
                            "",
                            satisfaction=satisfaction,
                            wanted=wanted,
                        ),
                        json.dumps({"message": text.strip()}, ensure_ascii=False),
                    ),
                }
                for kind, (build, completion) in builds.items():
                    got = fitted(tokenizer, build, dialogue, max_tokens, completion)
                    if got is None:
                        counts[f"too_long:{kind}"] += 1
                        continue
                    messages, cut = got
                    counts["turns_cut"] += cut
                    examples.append(
                        {
                            "prompt": messages,
                            "completion": [{"role": "assistant", "content": completion}],
                            "example_id": f"{conversation.file}#{number}:{kind}",
                            "kind": kind,
                            "persona": f"{conversation.source}:{conversation.persona}",
                            "task": conversation.task,
                            "cut_turns": cut,
                        }
                    )
            dialogue.append((turn.role, text))
    return examples, counts


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
        write_atomic(
            args.out / f"{split}.jsonl", "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        )
    prompt_tokens = [count_tokens(tokenizer, e["prompt"]) for e in examples]
    full = [count_tokens(tokenizer, e["prompt"], e["completion"][0]["content"]) for e in examples]
    card = {
        "task": "converse",
        "examples": {split: len(rows) for split, rows in splits.items()},
        "kinds": dict(Counter(e["kind"] for e in examples)),
        "format": "the simulator's own prompts and JSON answers (data_prep.prompt converse_*)",
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
    write_card(args.out, "Conversational simulator training pairs", card)
    print(f"{card['examples']} examples ({card['personas']} personas) -> {args.out}; {dict(counts)}")
    print(f"token lengths: {card['token_lengths']}")
    return card


if __name__ == "__main__":
    main()
