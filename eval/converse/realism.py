"""How the simulated users compare with RecLLMSim's LLM users and real people: realism (turns, words and
intents against theirs), controllability (words per turn by the persona's setting, the refinement
tools' judged levels) and profile identification (a gender classifier trained on one source, scored on
another). Part of ``python -m eval.converse --run`` (eval.converse.run.evaluate)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

from agents.converse.simulator import ACTION_INTENT
from data_prep import recllmsim


def reference(root: Path) -> dict:
    """RecLLMSim's figures: user turns per conversation, words (English) and characters (Chinese) per
    user turn, and the intent mix, for the LLM users and the real people."""
    loaded = recllmsim.load(root)
    out = {}
    for source in ("llm", "human"):
        convs = [c for c in loaded.conversations if c.source == source]
        users = [t for c in convs for t in c.turns if t.role == "user"]
        row = {
            "conversations": len(convs),
            "user_turns": [sum(t.role == "user" for t in c.turns) for c in convs],
            "intents": Counter(i for t in users for i in t.common_intents()),
        }
        if source == "llm":
            row["words_en"] = [len(t.content.split()) for t in users]
            row["chars_zh"] = [len(t.content_zh or "") for t in users if t.content_zh]
        else:
            row["chars_zh"] = [len(t.content) for t in users]
        out[source] = row
    return out


def tv_distance(a: Counter, b: Counter) -> float:
    keys = set(a) | set(b)
    ta, tb = sum(a.values()) or 1, sum(b.values()) or 1
    return 0.5 * sum(abs(a[k] / ta - b[k] / tb) for k in keys)


def describe(values: list[float]) -> dict:
    if not values:
        return {}
    return {"n": len(values), "mean": round(float(np.mean(values)), 2), "median": float(np.median(values))}


def realism(turns: list[dict], dialogues: list[dict], ref: dict) -> dict:
    from scipy.stats import ks_2samp

    users = [t for t in turns if t.get("message")]
    sim = {
        "user_turns": [d["turns"] for d in dialogues],
        "words_en": [len(t["message"].split()) for t in users],
        # every intent of a turn once (its actions mapped), as the people's multi-label turns are counted
        "intents": Counter(i for t in users for i in dict.fromkeys(ACTION_INTENT[a] for a in t["actions"])),
    }
    out = {
        "simulated": {
            "user_turns": describe(sim["user_turns"]),
            "words_per_user_turn_en": describe(sim["words_en"]),
            "intents": dict(sim["intents"]),
            "language": "en (the offline SmolLM2 writes English)",
        },
        "against": {},
    }
    for source, label in (("llm", "RecLLMSim LLM users"), ("human", "real people")):
        r = ref[source]
        row = {
            "user_turns": describe(r["user_turns"]),
            "ks_user_turns": round(float(ks_2samp(sim["user_turns"], r["user_turns"]).statistic), 3),
            "intents": dict(r["intents"]),
            "tv_intents": round(tv_distance(sim["intents"], r["intents"]), 3),
            "chars_per_user_turn_zh": describe(r["chars_zh"]),
        }
        if "words_en" in r:
            row["words_per_user_turn_en"] = describe(r["words_en"])
            row["ks_words_en"] = round(float(ks_2samp(sim["words_en"], r["words_en"]).statistic), 3)
        else:
            row["words_per_user_turn_en"] = "not comparable: the people wrote Chinese"
        out["against"][label] = row
    return out


def controllability(turns: list[dict], personas: dict[int, dict]) -> dict:
    by_level: dict[str, list[int]] = {}
    judged: dict[str, Counter] = {}
    for t in turns:
        if not t.get("message"):
            continue
        persona = personas[t["persona"]]
        level = persona["language"].get("message_length")
        if level:
            by_level.setdefault(level, []).append(len(t["message"].split()))
        for entry in t.get("refinements") or []:
            level = entry.get("final", entry.get("judged"))  # the level of the message as sent
            if level is not None:
                judged.setdefault(entry["tool"], Counter())[f"{entry['target']}->{level}"] += 1
    return {
        "words_by_message_length_setting": {k: describe(v) for k, v in sorted(by_level.items())},
        "judged_levels_persona_to_judged": {tool: dict(c) for tool, c in judged.items()},
        "raw": by_level,
    }


def plot_traits(control: dict, path: Path) -> None:
    """Per refinement tool: the levels the judger gave, grouped by the persona's level (how far the
    population's language differs by persona setting, as the judgers see it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tools = control["judged_levels_persona_to_judged"]
    if not tools:
        return
    fig, axes = plt.subplots(1, len(tools), figsize=(4.2 * len(tools), 3.4), squeeze=False)
    for ax, (tool, pairs) in zip(axes[0], tools.items(), strict=True):
        targets = sorted({k.split("->")[0] for k in pairs})
        judged = sorted({k.split("->")[1] for k in pairs})
        bottom = np.zeros(len(targets))
        for level in judged:
            heights = np.array([pairs.get(f"{t}->{level}", 0) for t in targets], dtype=float)
            totals = np.array([sum(v for k, v in pairs.items() if k.startswith(f"{t}->")) for t in targets])
            share = heights / np.maximum(totals, 1)
            ax.bar(targets, share, bottom=bottom, label=f"judged {level}")
            bottom += share
        ax.set_title(tool, fontsize=10)
        ax.set_xlabel("persona's level")
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("share of user turns")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lengths(control: dict, real_words: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = [k for k in ("short", "medium", "long") if k in control["raw"]]
    data = [control["raw"][k] for k in order] + [real_words]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(
        range(1, len(data) + 1), labels=[f"simulated: {k}" for k in order] + ["RecLLMSim LLM users"]
    )
    ax.set_ylabel("words per user turn (English)")
    ax.set_title("User-turn length by the persona's message-length setting")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def realism_lines(results: dict) -> list[str]:
    lines = []
    sim = results["realism"]["simulated"]
    lines += [
        "| users | user turns per dialogue (mean) | words per user turn, English (mean) | chars per user turn, Chinese (mean) | KS turns | KS words | TV intents |",
        "|---|---|---|---|---|---|---|",
    ]
    lines.append(
        f"| simulated | {sim['user_turns'].get('mean')} | {sim['words_per_user_turn_en'].get('mean')} | not written | | | |"
    )
    for label, r in results["realism"]["against"].items():
        words = r["words_per_user_turn_en"]
        words = words.get("mean") if isinstance(words, dict) else "not comparable (Chinese)"
        lines.append(
            f"| {label} | {r['user_turns'].get('mean')} | {words} | {r['chars_per_user_turn_zh'].get('mean')} | "
            f"{r['ks_user_turns']} | {r.get('ks_words_en', '')} | {r['tv_intents']} |"
        )
    lines.append("")
    for name, r in results["identification"].items():
        if isinstance(r, dict) and "accuracy" in r:
            lines.append(
                f"Gender identification, {name}: accuracy {r['accuracy']} (majority {r['majority_accuracy']}), "
                f"macro-F1 {r['macro_f1']}, {r['train']} train / {r['test']} test dialogues"
            )
    return lines


def gender_of(conversation) -> str | None:
    """The gender of a RecLLMSim persona: the people's profile field, or the LLM users' written
    preference ("1. Gender: Male ...")."""
    if isinstance(conversation.profile, dict):
        return str(conversation.profile.get("gender") or "").capitalize() or None
    match = re.search(r"Gender:\s*(\w+)", conversation.profile)
    return match.group(1).capitalize() if match else None


def transfer(train_texts, train_labels, test_texts, test_labels, analyzer: str) -> dict:
    """TF-IDF + logistic regression trained on one source's user turns, scored on another's, against
    the majority class of the training labels."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    if len(set(train_labels)) < 2 or not test_texts:
        return {"train": len(train_texts), "test": len(test_texts), "note": "needs two classes to train on"}
    ngrams = (1, 2) if analyzer == "word" else (1, 3)
    vectoriser = TfidfVectorizer(analyzer=analyzer, ngram_range=ngrams, min_df=1, sublinear_tf=True)
    model = LogisticRegression(max_iter=2000, class_weight="balanced").fit(
        vectoriser.fit_transform(train_texts), train_labels
    )
    predicted = model.predict(vectoriser.transform(test_texts))
    majority = Counter(train_labels).most_common(1)[0][0]
    return {
        "train": len(train_texts),
        "test": len(test_texts),
        "accuracy": round(float(accuracy_score(test_labels, predicted)), 3),
        "macro_f1": round(float(f1_score(test_labels, predicted, average="macro")), 3),
        "majority_accuracy": round(float(np.mean([label == majority for label in test_labels])), 3),
    }


def identification(dialogues: list[dict], personas: dict[int, dict], data: Path) -> dict:
    """Profile-identification transfer (the RecLLMSim follow-up's test) on gender, the attribute every
    source has: trained on the simulated users' turns, scored on RecLLMSim's LLM users (English, the
    language the offline backbone writes); the reference figure trains on the LLM users' Chinese
    translations and scores on the real people (character n-grams)."""
    loaded = recllmsim.load(data)
    llm = [c for c in loaded.conversations if c.source == "llm" and gender_of(c)]
    people = [c for c in loaded.conversations if c.source == "human" and gender_of(c)]

    def user_text(conversation, zh: bool) -> str:
        return " ".join(
            (t.content_zh or "") if zh else t.content for t in conversation.turns if t.role == "user"
        )

    sim_texts = [" ".join(t for r, t in d["transcript"] if r == "user") for d in dialogues]
    sim_labels = [personas[d["persona"]]["gender"].capitalize() for d in dialogues]
    return {
        "attribute": "gender",
        "simulated -> RecLLMSim LLM users (English)": transfer(
            sim_texts, sim_labels, [user_text(c, False) for c in llm], [gender_of(c) for c in llm], "word"
        ),
        "reference: RecLLMSim LLM users (Chinese) -> real people": transfer(
            [user_text(c, True) for c in llm],
            [gender_of(c) for c in llm],
            [user_text(c, False) for c in people],
            [gender_of(c) for c in people],
            "char",
        ),  # fmt: skip
    }
