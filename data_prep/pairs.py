"""Instruction pairs for fine-tuning: (user history, item) -> stars and review, from real reviews.

    python -m data_prep.pairs --data runs/data/amazon --tasks runs/tasks/amazon --out runs/pairs/amazon
    python -m data_prep.pairs ... --k-user 5 --k-item 3 --max-examples 2000 --debug 2
    python -m data_prep.pairs --data runs/data/amazon runs/data/yelp --tasks runs/tasks/amazon runs/tasks/yelp ...

Every review the store shows (evaluation task pairs are blocked) whose user has at least --min-history
strictly older reviews becomes one example: the prompt (data_prep.prompt.build_messages) shows the
user's latest --k-user reviews (what the agents show too: ``user_reviews: latest``) and the latest
--k-item reviews of the item by other users, all strictly older than the target; the completion is ``stars: S\\nreview:
TEXT``. A prompt is fitted to --max-tokens by data_prep.prompt.fit_messages: text is cut by tokens
(the item's description, then the longest review, each cut marked "…") before a review is dropped, and
the user's last review goes only when no item text is left. The card counts the prompts by how many of
the user's reviews they show (0 / 1 / 2+) and the tokens each part took. Examples are split into train and validation by
user (no user is in both). With a temporal task folder, only reviews older than its cutoff become
targets (--before sets another moment), so no adapter learns from the test period. A validation folder
(data_prep.split --validation-for) as --tasks blocks its own pairs and those of the tasks it was drawn
for; drawn for temporal tasks, it keeps training targets before its own cutoff (the start of the
validation period), so an adapter trained so has seen neither period, and the validation runs are
made with an adapter as much in the past as the tasks' runs.

Writes PAIRS_DIR/dataset (a datasets.DatasetDict, conversational prompt/completion plus metadata),
train.jsonl, validation.jsonl, card.json and README.md (counts, token-length percentiles, how it was
made). --debug N prints N tokenised examples with the supervised tokens marked.

Several ``--data`` folders (one ``--tasks`` folder each, in the same order) make one pair set from all
of them: each store blocks its own tasks and keeps its own cutoff; the card lists every source. The
stores must not share a user (else one store's task pairs could train through another): refused.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data_prep.io import write_atomic, write_card
from data_prep.offline_models import OFFLINE_SMOLLM2, resolve_model
from data_prep.prompt import fit_messages, format_completion, render_prompt
from data_prep.provenance import provenance
from data_prep.schema import parse_iso
from data_prep.store import ReviewStore, to_epoch
from data_prep.tasks import read_tasks


def is_validation(user_id: str, fraction: float, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{user_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def make_examples(
    store: ReviewStore,
    tokenizer,
    k_user: int,
    k_item: int,
    min_history: int,
    max_tokens: int,
    before: int | None = None,
) -> tuple[list[dict], dict[str, int]]:
    """All examples, and counts of reviews left out (at or after ``before``; too little history; too
    long even with no past review shown) and of shown reviews dropped to fit the token budget. Each
    example keeps what its prompt shows (``user_reviews_shown``, the tokens per part, the cuts)."""
    examples = []
    counts = {
        "at_or_after_cutoff": 0,
        "too_little_history": 0,
        "too_long": 0,
        "shown_reviews_dropped_to_fit": 0,
    }
    for target in tqdm(store.visible_reviews(), desc="pairs", unit=" reviews", mininterval=2):
        if before is not None and parse_iso(target["date"]) >= before:
            counts["at_or_after_cutoff"] += 1
            continue
        history = store.get_reviews(user_id=target["user_id"], before=target["date"])
        if len(history) < min_history:
            counts["too_little_history"] += 1
            continue
        user_reviews = history[-k_user:] if k_user else []
        # the item's reviews by other users: the user's own earlier review of it is theirs, not another's
        others = store.get_reviews(
            item_id=target["item_id"], before=target["date"], not_user=target["user_id"]
        )
        item_reviews = others[-k_item:] if k_item else []
        completion = format_completion(target["stars"], target["text"])
        user, item = store.get_user(target["user_id"]), store.get_item(target["item_id"])
        try:
            fitted = fit_messages(tokenizer, user, user_reviews, item, item_reviews, max_tokens, completion)
        except ValueError:
            counts["too_long"] += 1
            continue
        counts["shown_reviews_dropped_to_fit"] += (
            len(user_reviews) + len(item_reviews) - len(fitted.user_reviews) - len(fitted.item_reviews)
        )
        shown = fitted.user_reviews + fitted.item_reviews
        examples.append(
            {
                "prompt": fitted.messages,
                "completion": [{"role": "assistant", "content": completion}],
                "user_id": target["user_id"],
                "item_id": target["item_id"],
                "review_id": target["review_id"],
                "date": target["date"],
                "shown_review_ids": [r["review_id"] for r in shown],
                "shown_dates": [r["date"] for r in shown],
                "user_reviews_shown": len(fitted.user_reviews),
                "prompt_part_tokens": fitted.tokens,
                "prompt_cuts": fitted.cuts,
            }
        )
    return examples, counts


def shown_counts(rows: list[dict]) -> dict:
    """The prompts by how many of the user's reviews they show (every example's user has one)."""
    shown = Counter("2+" if r["user_reviews_shown"] >= 2 else str(r["user_reviews_shown"]) for r in rows)
    none = shown["0"]
    return {
        "0": none,
        "1": shown["1"],
        "2+": shown["2+"],
        "share_showing_none": round(none / len(rows), 4) if rows else None,
    }


def prompt_report(splits: dict[str, list[dict]]) -> dict:
    """What the prompts show, for the card: the user's reviews per split, the tokens each part took
    (percentiles over all examples) and how often each kind of cut was made."""
    rows = [r for split in splits.values() for r in split]
    parts = sorted({p for r in rows for p in r["prompt_part_tokens"]})
    return {
        "user_reviews_shown": {name: shown_counts(split) for name, split in splits.items()},
        "part_tokens": {p: percentiles([r["prompt_part_tokens"].get(p, 0) for r in rows]) for p in parts},
        "cuts": dict(Counter(c for r in rows for c in r["prompt_cuts"]).most_common()),
        "rule": "text cut by tokens (item description, then the longest review, each marked) before a review "
        "is dropped; the user's last review dropped only when no item text is left (data_prep.prompt.fit_messages)",
    }


def supervised_tokens(tokenizer, messages: list[dict], completion: str) -> tuple[list[int], int]:
    """Token ids of prompt + completion + EOS as training sees them, and where supervision starts."""
    prompt = render_prompt(tokenizer, messages)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full = tokenizer(prompt + completion + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
    return full, len(prompt_ids)


def show_debug(tokenizer, examples: list[dict], n: int) -> None:
    for example in examples[:n]:
        ids, start = supervised_tokens(tokenizer, example["prompt"], example["completion"][0]["content"])
        prompt, supervised = tokenizer.decode(ids[:start]), tokenizer.decode(ids[start:])
        print(f"--- {example['review_id']}: {len(ids)} tokens, {len(ids) - start} supervised (between ⟦ ⟧)")
        print(f"{prompt}⟦{supervised}⟧")


def percentiles(values: list[int]) -> dict[str, int]:
    if not values:
        return {}
    arr = np.array(values)
    return {f"p{q}": int(np.percentile(arr, q)) for q in (50, 90, 99)} | {"max": int(arr.max())}


def training_cutoff(manifest: dict) -> str | None:
    """Where a task folder's training targets must end: a temporal folder's cutoff; for a validation
    folder drawn for temporal tasks, its own cutoff (the start of the validation period), so the
    adapter has seen no more of the validation period than of the test period; else none."""
    if manifest.get("strategy") == "temporal":
        return manifest.get("cutoff")
    if manifest.get("strategy") == "validation":
        return (manifest.get("validation_for") or {}).get("validation_cutoff") or manifest.get("cutoff")
    return None


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, nargs="+", required=True, help="one or more review stores")
    parser.add_argument(
        "--tasks",
        type=Path,
        nargs="+",
        required=True,
        help="evaluation tasks, one folder per --data: their pairs never appear",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--k-user", type=int, default=5)
    parser.add_argument("--k-item", type=int, default=3)
    parser.add_argument("--min-history", type=int, default=1, help="older reviews an example's user needs")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--max-examples", type=int, help="a seeded sample of at most this many examples")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default=OFFLINE_SMOLLM2, help="the model's: budgets, lengths, --debug")
    parser.add_argument("--max-tokens", type=int, default=1024, help="budget for prompt + completion + EOS")
    parser.add_argument(
        "--before",
        help="only reviews strictly older than this become training targets (default: a temporal task "
        "folder's cutoff, so nothing from the test period is trained on; none for other splits)",
    )
    parser.add_argument("--debug", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    if len(args.data) != len(args.tasks):
        parser.error(
            f"--data has {len(args.data)} folders and --tasks {len(args.tasks)}: give one task folder each"
        )

    from datasets import Dataset, DatasetDict
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.tokenizer))
    examples, counts, sources, users_of = [], {}, [], {}
    for data, tasks in zip(args.data, args.tasks, strict=True):
        manifest_path = tasks / "manifest.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
        before = args.before or training_cutoff(manifest)
        store = ReviewStore.open(data, tasks=tasks)
        if len(args.data) > 1:
            users = {r[1] for r in store.visible_ratings()} | {t["user_id"] for t in read_tasks(tasks)}
            for other, seen in users_of.items():
                if shared := users & seen:
                    raise SystemExit(
                        f"error: {data} and {other} share {len(shared)} users (e.g. {min(shared)}): one store's "
                        "tasks could become another's training pairs; give stores with disjoint users"
                    )
            users_of[data] = users
        found, left_out = make_examples(
            store,
            tokenizer,
            args.k_user,
            args.k_item,
            args.min_history,
            args.max_tokens,
            to_epoch(before) if before else None,
        )
        examples += found
        counts = {k: counts.get(k, 0) + v for k, v in left_out.items()}
        sources.append(
            {
                "dir": str(data),
                "source_sha256": store.meta().get("source_sha256"),
                "tasks": str(tasks),
                "blocked_task_pairs": store.blocked,
                "targets_before": before,
                "examples": len(found),
                "left_out": left_out,
            }
        )
    if not examples:
        raise SystemExit(f"error: no example qualifies ({counts}); lower --min-history or raise --max-tokens")
    sampled = len(examples)
    if args.max_examples and len(examples) > args.max_examples:
        random.Random(args.seed).shuffle(examples)
        examples = sorted(examples[: args.max_examples], key=lambda e: (e["user_id"], e["date"]))
    splits = {"train": [], "validation": []}
    for example in examples:
        splits[
            "validation" if is_validation(example["user_id"], args.val_fraction, args.seed) else "train"
        ].append(example)

    lengths = {"prompt_tokens": [], "completion_tokens": []}
    for example in tqdm(examples, desc="token lengths", unit=" examples", mininterval=2):
        ids, start = supervised_tokens(tokenizer, example["prompt"], example["completion"][0]["content"])
        lengths["prompt_tokens"].append(start)
        lengths["completion_tokens"].append(len(ids) - start)

    args.out.mkdir(parents=True, exist_ok=True)
    DatasetDict({name: Dataset.from_list(rows) for name, rows in splits.items()}).save_to_disk(
        args.out / "dataset"
    )
    for name, rows in splits.items():
        write_atomic(
            args.out / f"{name}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
        )
    card = {
        "examples": {name: len(rows) for name, rows in splits.items()},
        "users": {name: len({r["user_id"] for r in rows}) for name, rows in splits.items()},
        "candidates": sampled,
        "left_out": counts,
        "prompts": prompt_report(splits),
        "token_lengths": {k: percentiles(v) for k, v in lengths.items()},
        "tokenizer": args.tokenizer,
        "options": {
            k: getattr(args, k)
            for k in ("k_user", "k_item", "min_history", "max_tokens", "val_fraction", "max_examples", "seed")
        },
        "data": sources,
        "latest_target": max(e["date"] for e in examples),
        "leakage_rules": "each store's task (user, item) pairs blocked; every shown review strictly older "
        "than the target; with a temporal task folder (or --before), only targets older than its cutoff",
        "provenance": provenance(["datasets", "transformers"]),
    }
    write_card(args.out, "Training pairs", card)
    print(f"{card['examples']} examples -> {args.out}; left out or trimmed: {counts}")
    print(f"token lengths: {card['token_lengths']}")
    print(f"the user's reviews each prompt shows (0 / 1 / 2+): {card['prompts']['user_reviews_shown']}")
    if args.debug:
        show_debug(tokenizer, examples, args.debug)
    return card


if __name__ == "__main__":
    main()
