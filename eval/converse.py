"""Evaluate a conversational simulator run (agents.converse): the recommenders' ratings, and how the
simulated users compare with RecLLMSim's LLM users and real people.

    python -m eval.converse --run runs/converse/demo --out runs/converse/demo/eval

- **Ratings per recommender**: the mean of each rating (language, action, recommendation quality) with
  a 95% bootstrap interval over dialogues (each dialogue's mean first), and the paired difference
  between two recommenders that talked to the same personas (dialogue ids pair them).
- **Realism**: user turns per dialogue, words per user turn and the intent mix (the common vocabulary
  of data_prep.recllmsim) of the simulated users against RecLLMSim's LLM users (English) and real
  people (Chinese); each turn counts each of its intents once (the people's turns may carry several,
  the simulator's up to two actions; ask_plan maps to "plan"). Lengths are compared within a language only: the simulated users' English words
  against the LLM users' English; the people's Chinese characters are reported beside their LLM users'
  Chinese translations (``content_zh``), never against English. Kolmogorov-Smirnov statistics for the
  distributions, total variation distance for the intent mix.
- **Controllability**: words per user turn as sent (after the refinement tools) by the persona's
  message-length setting (short personas should write the shortest turns: the means are reported in
  order, with a chart), and each tool's judged level against the persona's level (the tools run in
  order, so a later tool judges the message as the earlier ones left it).

- **Profile identification transfer**: a gender classifier (TF-IDF + logistic regression) trained on
  the simulated users' turns and scored on RecLLMSim's LLM users (English), beside the reference
  figure (trained on the LLM users' Chinese translations, scored on the real people), each with the
  majority-class accuracy.

Writes OUT/results.json, OUT/table.md, OUT/lengths.png and OUT/traits.png (per refinement tool, the
judged levels by the persona's level).

    python -m eval.converse --replay llm --limit 60 --out runs/converse/replay-base
    python -m eval.converse --replay llm --limit 60 --set llm.adapter=runs/converse/sft/smollm2_json \
        --out runs/converse/replay-tuned
    python -m eval.converse --consistency runs/converse/replay-base/replay_llm.json runs/converse/replay-tuned/replay_llm.json
    python -m eval.converse --replay human --questionnaire-only --out runs/converse/agreement-base

- **The people's questionnaire** (``--replay human --questionnaire-only``): the simulator fills it for
  each real-person conversation; kept batch by batch in OUT/questionnaire_answers.jsonl, so a stopped
  run resumes (and refuses to resume under other settings).
- **Replay** (``--replay llm|human``): the simulator rates the assistant turns of recorded
  conversations; its conversation-level ratings against RecLLMSim's 7 ratings (LLM users) or the
  people's questionnaires (ordinal), Spearman and Pearson with p-values and person-clustered
  intervals (``replay_check``).
- **Agreement per backbone** (``--agreement DIR [DIR...]``): the questionnaire-only folders' answers
  against the people's, per item, and each later backbone against the first as paired differences in
  Spearman (``agreement``); ``--out`` keeps agreement.json and agreement.md.
- **Ladders of two backbones** (``--ladders A B``): two bench/converse_ladder.sh runs of the same
  goals; per rating, each goal's oracle − random gap on each backbone and B's gap minus A's, paired
  over goals (``ladders``): whether a backbone tells good from bad better. ``--low oracle-ignores
  --high oracle-explains`` compares the rungs that differ only in words (language and action).
- **Consistency across backbones** (``--consistency A B``): two replays of the same conversations,
  their conversation-level ratings correlated per rating.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agents.converse.simulator import ACTION_INTENT
from agents.stats import holm_rows
from data_prep import recllmsim
from data_prep.io import read_jsonl
from eval.metrics import bca_interval


def interval(values: list[float]) -> list[float]:
    if len(values) < 2:
        return None  # no interval from one dialogue
    low, high, _ = bca_interval(values)
    return [round(low, 3), round(high, 3)]


KEYS = ("language_quality", "action_quality", "recommendation_quality")


def ratings(turns: list[dict], crs_names: list[str]) -> dict:
    """Per recommender and rating: mean over dialogues of the dialogue's mean, with its interval; and
    paired differences between recommenders over the dialogues both rated."""
    per: dict[str, dict[str, dict[int, float]]] = {}
    for name in crs_names:
        per[name] = {}
        for key in KEYS:
            by_dialogue: dict[int, list[float]] = {}
            for t in turns:
                if t["crs"] == name and t.get("rating") and t["rating"].get(key) is not None:
                    by_dialogue.setdefault(t["dialogue"], []).append(t["rating"][key])
            per[name][key] = {d: float(np.mean(v)) for d, v in by_dialogue.items()}
    out = {"per_crs": {}, "paired": {}}
    for name in crs_names:
        out["per_crs"][name] = {
            key: {
                "mean": round(float(np.mean(list(v.values()))), 3) if v else None,
                "ci95": interval(list(v.values())) if v else None,
                "dialogues": len(v),
            }
            for key, v in per[name].items()
        }
    for i, a in enumerate(crs_names):
        for b in crs_names[i + 1 :]:
            for key in KEYS:
                both = sorted(set(per[a][key]) & set(per[b][key]))
                if both:
                    diff = [per[a][key][d] - per[b][key][d] for d in both]
                    out["paired"][f"{a} - {b}: {key}"] = {
                        "mean": round(float(np.mean(diff)), 3),
                        "ci95": interval(diff),
                        "dialogues": len(both),
                    }
    return out


def goal_metrics(dialogues: list[dict], turns: list[dict], crs_names: list[str], ks=(1, 3, 5)) -> dict | None:
    """Catalogue goals (iEvaLM-style), per recommender: success (a target recommended in the dialogue),
    hit@k (a target among its first k recommendations; the user accepts the first target, so a recall
    over all targets would be capped by design), the user turn of the first success, and the objective
    fit of what it recommended (goals.objective_fit, logged on each turn apart from the LLM's own
    recommendation score, which is reported beside it); each with a BCa interval over dialogues; paired
    differences of success and fit between recommenders over the same personas. Dialogues a CRS failed,
    or whose recommendations it did not name, are not scored (counted per recommender as ``unscored``).
    None when the run has no goals."""
    if not any(d.get("targets") for d in dialogues):
        return None
    per: dict[str, dict[str, dict[int, float]]] = {}
    for name in crs_names:
        mine = [
            d for d in dialogues if d["crs"] == name and d.get("targets") and d.get("success") is not None
        ]
        scored = {d["persona"] for d in mine}
        values = {"success": {d["persona"]: float(d["success"]) for d in mine}}
        for k in ks:
            values[f"hit@{k}"] = {
                d["persona"]: float(bool(set(d["recommended"][:k]) & set(d["targets"]))) for d in mine
            }
        fits: dict[int, list[float]] = {}
        llm: dict[int, list[float]] = {}
        for t in turns:
            if t["crs"] != name or t["persona"] not in scored:
                continue
            if t.get("fit") is not None:
                fits.setdefault(t["persona"], []).append(t["fit"])
            if (t.get("rating") or {}).get("llm_objective") is not None:
                llm.setdefault(t["persona"], []).append(t["rating"]["llm_objective"])
        values["objective_fit"] = {p: float(np.mean(v)) for p, v in fits.items()}
        values["llm_recommendation_score"] = {p: float(np.mean(v)) for p, v in llm.items()}
        per[name] = values
    out: dict = {"per_crs": {}, "paired": {}}
    for name, values in per.items():
        row = {
            key: {"mean": round(float(np.mean(list(v.values()))), 3) if v else None,
                  "ci95": interval(list(v.values())) if v else None, "dialogues": len(v)}
            for key, v in values.items()
        }  # fmt: skip
        turns_to = [d["success_turn"] for d in dialogues if d["crs"] == name and d.get("success_turn")]
        row["turns_to_success"] = {
            "mean": round(float(np.mean(turns_to)), 2) if turns_to else None,
            "ci95": interval(turns_to) if turns_to else None,
            "dialogues": len(turns_to),
        }
        row["unscored"] = dict(
            Counter(d["unscored"] for d in dialogues if d["crs"] == name and d.get("unscored"))
        )
        out["per_crs"][name] = row
    for i, a in enumerate(crs_names):
        for b in crs_names[i + 1 :]:
            for key in ("success", "objective_fit"):
                both = sorted(set(per[a][key]) & set(per[b][key]))
                if both:
                    diff = [per[a][key][p] - per[b][key][p] for p in both]
                    out["paired"][f"{a} - {b}: {key}"] = {
                        "mean": round(float(np.mean(diff)), 3), "ci95": interval(diff), "dialogues": len(both)
                    }  # fmt: skip
    return out


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


GOAL_KEYS = ("success", "hit@1", "hit@5", "turns_to_success", "objective_fit", "llm_recommendation_score")


ENDINGS = ("accepted", "chosen", "impatient", "max_turns", "crs_error")


def count_of(counts: dict, key: str) -> int:
    """A run's count under ``key``, with its kinds summed (crs_errors:NAME:KIND under crs_errors:NAME)."""
    return sum(v for k, v in counts.items() if k == key or k.startswith(key + ":"))


def outcomes(dialogues: list[dict], counts: dict, crs_names: list[str]) -> dict:
    """Per recommender: how its dialogues ended (the user accepted a target, chose to end, lost patience,
    reached the turn limit, or the CRS failed) and what failed on the way: the CRS's errors and fallback
    replies, unusable ratings, and, for a CRS read by name, the replies whose places were matched,
    unmatched or ambiguous."""
    out = {}
    for name in crs_names:
        mine = [d for d in dialogues if d["crs"] == name]
        ended = Counter(d["ended"] for d in mine)

        out[name] = {
            "dialogues": len(mine),
            "ended": {key: ended.get(key, 0) for key in (*ENDINGS, *sorted(set(ended) - set(ENDINGS)))},
            "crs_errors": count_of(counts, "crs_errors:" + name),
            "crs_fallbacks": count_of(counts, "crs_fallbacks:" + name),
            "names": {
                kind: count_of(counts, f"crs_names_{kind}:{name}")
                for kind in ("matched", "unmatched", "ambiguous")
            },
        }
    return out


def outcome_lines(result: dict, lost: dict | None) -> list[str]:
    """One table: a row per recommender, its end reasons and failure counts in their own columns."""
    lines = [
        "| recommender (how dialogues ended) | dialogues | " + " | ".join(ENDINGS)
        + " | CRS errors | CRS fallbacks | names matched / unmatched / ambiguous |",
        "|---|---|" + "---|" * len(ENDINGS) + "---|---|---|",
    ]  # fmt: skip
    for name, row in result.items():
        names = row["names"]
        by_name = (
            f"{names['matched']} / {names['unmatched']} / {names['ambiguous']}" if any(names.values()) else ""
        )
        lines.append(
            f"| {name} | {row['dialogues']} | " + " | ".join(str(row["ended"][k]) for k in ENDINGS)
            + f" | {row['crs_errors']} | {row['crs_fallbacks']} | {by_name} |"
        )  # fmt: skip
    if lost is not None:
        lines.append(f"\nUnusable ratings: {lost['unusable']} of {lost['asked']} asked.")
    return lines + [""]


def per_crs_lines(section: dict, keys, title: str) -> list[str]:
    """One markdown table: a row per recommender (mean [interval] (n) per key), then the paired rows."""
    lines = [f"| {title} | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, row in section["per_crs"].items():
        cells = []
        for key in keys:
            r = row[key]
            ci = f" [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]" if r["ci95"] else ""
            cells.append(f"{r['mean']:.2f}{ci} (n={r['dialogues']})" if r["mean"] is not None else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    pairs: dict[str, dict[str, str]] = {}  # "a - b" -> key -> cell: each value under its own column
    for name, r in section["paired"].items():
        pair, _, key = name.rpartition(": ")
        ci = f" [{r['ci95'][0]:+.2f}, {r['ci95'][1]:+.2f}]" if r["ci95"] else ""
        pairs.setdefault(pair, {})[key] = f"{r['mean']:+.2f}{ci} (n={r['dialogues']})"
    for pair, cells in pairs.items():
        lines.append(f"| paired {pair} | " + " | ".join(cells.get(key, "") for key in keys) + " |")
    return lines + [""]


def table(results: dict) -> str:
    if results["ratings_asked"]:
        lines = per_crs_lines(results["ratings"], KEYS, "recommender")
    else:
        lines = ["Ratings: off in this run (rating.enabled: false); the objective figures only.", ""]
    if results.get("goals"):
        lines += per_crs_lines(results["goals"], GOAL_KEYS, "recommender (catalogue goals)")
    lines += outcome_lines(results["outcomes"], results["lost_ratings"] if results["ratings_asked"] else None)
    if "note" in results["realism"]:
        lines += [f"Realism and identification: {results['realism']['note']}.", ""]
    else:
        lines += realism_lines(results)
    lines.append(
        "Words per user turn by the persona's message-length setting: "
        + ", ".join(
            f"{k}: {v.get('mean')} (n={v.get('n')})"
            for k, v in results["controllability"]["words_by_message_length_setting"].items()
        )
    )
    return "\n".join(lines) + "\n"


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


# the people's questionnaire answers on ordinal scales (higher is better); Memorization asks whether
# the assistant forgot something, so "yes" is the worse answer
QUESTIONNAIRE = {
    "Detail": {"简略": 0, "一般": 1, "详细": 2},
    "Availability": {"不可用": 0, "有一定参考": 1, "很有用": 2},
    "Diversity": {"结果单一": 0, "一般": 1, "结果多样": 2},
    "Memorization": {"是": 0, "否": 1},
}


def clustered_correlation(x, y, clusters, rng: np.random.Generator, resamples: int = 2000) -> dict:
    """Spearman and Pearson correlations of x and y with p-values, and 95% percentile intervals from a
    bootstrap that resamples whole clusters (persons), since one person's conversations are not
    independent; ``spearman_p_clustered`` is the two-sided p from the same resamples (what ``holm``
    corrects; ``spearman_p`` is scipy's, which takes every pair as independent)."""
    from scipy.stats import pearsonr, spearmanr

    x, y, clusters = np.asarray(x, float), np.asarray(y, float), np.asarray(clusters)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"n": len(x), "note": "too few conversations or a constant variable"}
    names = np.unique(clusters)
    members = [np.flatnonzero(clusters == c) for c in names]
    draws = {"spearman": [], "pearson": []}
    skipped = 0
    for _ in range(resamples):
        index = np.concatenate([members[i] for i in rng.integers(len(names), size=len(names))])
        if np.ptp(x[index]) == 0 or np.ptp(y[index]) == 0:
            skipped += 1  # a resample with a constant variable has no correlation
            continue
        draws["spearman"].append(spearmanr(x[index], y[index]).statistic)
        draws["pearson"].append(pearsonr(x[index], y[index]).statistic)
    s, p = spearmanr(x, y), pearsonr(x, y)
    if skipped > 0.05 * resamples:  # a nearly constant rating: the surviving resamples are a biased few
        return {
            "n": len(x),
            "clusters": len(names),
            "spearman": round(float(s.statistic), 3),
            "spearman_p": float(s.pvalue),
            "pearson": round(float(p.statistic), 3),
            "pearson_p": float(p.pvalue),
            "spearman_ci95": None,
            "pearson_ci95": None,
            "note": f"{skipped} of {resamples} resamples had a constant variable: no interval",
        }
    return {
        "n": len(x),
        "clusters": len(names),
        "spearman": round(float(s.statistic), 3),
        "spearman_p": float(s.pvalue),
        "spearman_ci95": [round(float(v), 3) for v in np.percentile(draws["spearman"], [2.5, 97.5])],
        "spearman_p_clustered": bootstrap_p(np.asarray(draws["spearman"])),
        "pearson": round(float(p.statistic), 3),
        "pearson_p": float(p.pvalue),
        "pearson_ci95": [round(float(v), 3) for v in np.percentile(draws["pearson"], [2.5, 97.5])],
    }


def bootstrap_p(draws: np.ndarray) -> float:
    """Two-sided p of "the statistic is zero" from its bootstrap draws: twice the smaller tail share,
    each counted with one more draw ((1 + k) / (B + 1)), so never 0."""
    below, above = (1 + np.sum(draws <= 0)) / (len(draws) + 1), (1 + np.sum(draws >= 0)) / (len(draws) + 1)
    return float(min(1.0, 2 * min(below, above)))


def item_agreement(simulated, real, people, rng: np.random.Generator, resamples: int = 2000) -> dict:
    """One questionnaire item: the simulator's answers against the people's (``clustered_correlation``
    by person) with both means (None without answers)."""
    row = clustered_correlation(simulated, real, people, rng, resamples)
    row["simulated_mean"] = round(float(np.mean(simulated)), 3) if len(simulated) else None
    row["real_mean"] = round(float(np.mean(real)), 3) if len(real) else None
    return row


def holm(correlations: dict) -> dict:
    """Adds ``spearman_p_holm`` to every correlation of one table that has a p-value (Holm's step-down
    correction over the table's tests, statsmodels' multipletests) and returns the table: the
    person-clustered bootstrap p where there is one, else scipy's."""
    holm_rows(
        correlations.values(),
        lambda v: v.get("spearman_p_clustered", v["spearman_p"]) if "spearman_p" in v else None,
        "spearman_p_holm",
    )
    return correlations


def questionnaire_answers(
    simulator, convs, recorded: list[dict], out: Path, config, limit
) -> list[dict | None]:
    """The simulator's questionnaire for each conversation, appended to OUT/questionnaire_answers.jsonl
    batch by batch (32 conversations), so a stopped replay resumes where it stopped (a line cut by a
    kill is redone); a rerun with another backbone, adapter, transcript budget, seed or sample refuses
    to resume (OUT/fingerprint.json names what changed). With temperature 0 a resumed replay answers as
    an uninterrupted one."""
    from dataclasses import asdict

    from agents.llm import EXECUTION_FIELDS
    from agents.runs import drop_cut_line, valid_lines
    from data_prep import fingerprint

    out.mkdir(parents=True, exist_ok=True)
    path = out / "questionnaire_answers.jsonl"
    llm = {k: v for k, v in asdict(config.llm).items() if k not in (*EXECUTION_FIELDS, "adapter")}
    inputs = {
        "llm": llm,
        "adapter": fingerprint.adapter_digest(config.llm.adapter) if config.llm.adapter else None,
        "transcript_turns": config.transcript_turns,
        "transcript_tokens": config.transcript_tokens,
        "temperature": config.temperature,
        "seed": config.seed,
        "limit": limit,
        "conversations": [c.file for c in convs],
    }
    if not fingerprint.verdict(out, inputs, overwrite=False, has_work=path.exists()):
        path.unlink(missing_ok=True)
    fingerprint.record(out, inputs)
    drop_cut_line(path)  # a line cut off by a kill: redone
    done = {row["file"]: row["answer"] for _, row in valid_lines(path)}
    todo = [k for k, c in enumerate(convs) if c.file not in done]
    if done:
        print(f"resuming: {len(done)} questionnaires answered, {len(todo)} to go")
    with open(path, "a") as sink:
        for start in tqdm(range(0, len(todo), 32), desc="questionnaires", unit=" x32"):
            chunk = todo[start : start + 32]
            for k, answer in zip(chunk, simulator.questionnaire([recorded[k] for k in chunk]), strict=True):
                sink.write(json.dumps({"file": convs[k].file, "answer": answer}, ensure_ascii=False) + "\n")
                done[convs[k].file] = answer
            sink.flush()
    return [done[c.file] for c in convs]


def replay_check(
    data: Path,
    config,
    out: Path,
    source: str,
    limit: int | None,
    backend=None,
    turn_ratings: bool = True,
) -> dict:
    """Replay recorded conversations (``source`` llm: RecLLMSim's LLM users against their 7 ratings;
    human: the real people against their questionnaires) with the simulator, and correlate its
    conversation-level ratings (the mean over the assistant turns of each rating) with the recorded
    ones, clustered by persona. ``limit``: the first N conversations of a seeded shuffle. For the real
    people the simulator also fills their questionnaire; ``turn_ratings=False`` does only that (one
    prompt per conversation instead of one per assistant turn as well)."""
    from agents.converse.simulator import UserSimulator
    from data_prep.converse_pairs import profile_text

    loaded = recllmsim.load(data)
    convs = [c for c in loaded.conversations if c.source == source]
    rng = np.random.default_rng(config.seed)
    order = rng.permutation(len(convs))
    convs = [convs[i] for i in order[: limit or len(convs)]]
    if backend is None:
        from agents.llm import load_llm

        backend = load_llm(config.llm)
    simulator = UserSimulator(config, backend, rng)
    recorded = [
        {"about": profile_text(c), "task": c.task_context, "turns": [(t.role, t.content) for t in c.turns]}
        for c in convs
    ]
    if source == "llm" and not turn_ratings:
        raise ValueError(
            "the LLM users' replay is their turn ratings; questionnaire-only is for --replay human"
        )
    rated = simulator.replay(recorded) if turn_ratings else [[] for _ in recorded]
    mean = {
        key: [
            float(np.mean([r[key] for r in rs if r and r.get(key) is not None] or [np.nan])) for rs in rated
        ]
        for key in KEYS
    }
    truth = (
        {name: [c.ratings[name] for c in convs] for name in recllmsim.RATING_SCALES}
        if source == "llm"
        else {
            name: [QUESTIONNAIRE[name].get(c.questionnaire.get(name), np.nan) for c in convs]
            for name in QUESTIONNAIRE
        }
    )
    results = {
        "source": source,
        "conversations": len(convs),
        "model": config.llm.model,
        "adapter": config.llm.adapter,
        "turn_ratings": turn_ratings,
        "unusable_ratings": simulator.counts["fallback:rating"],
        "correlations": {},
        # per conversation, the simulator's mean ratings: what --consistency compares across backbones
        "ratings": {
            c.file: {key: None if np.isnan(mean[key][i]) else mean[key][i] for key in KEYS}
            for i, c in enumerate(convs)
        },
        "persona": {c.file: c.persona for c in convs},
    }
    for key, xs in mean.items() if turn_ratings else ():
        for name, ys in truth.items():
            keep = [i for i in range(len(convs)) if not np.isnan(xs[i]) and not np.isnan(ys[i])]
            results["correlations"][f"{key} ~ {name}"] = clustered_correlation(
                [xs[i] for i in keep], [ys[i] for i in keep], [convs[i].persona for i in keep], rng
            )
    holm(results["correlations"])
    if source == "human":  # the same questionnaire the people filled, answered by the simulator
        answers = questionnaire_answers(simulator, convs, recorded, out, config, limit)
        results["unusable_questionnaires"] = sum(a is None for a in answers)
        results["questionnaire"] = {}
        for name in QUESTIONNAIRE:
            keep = [i for i, a in enumerate(answers) if a is not None and not np.isnan(truth[name][i])]
            results["questionnaire"][name] = item_agreement(
                [answers[i][name] for i in keep],
                [truth[name][i] for i in keep],
                [convs[i].persona for i in keep],
                rng,
            )
        holm(results["questionnaire"])
        # the ranking of the assistant models by questionnaire means is not possible: the data does not
        # say which model answered each conversation
    out.mkdir(parents=True, exist_ok=True)
    (out / f"replay_{source}.json").write_text(json.dumps(results, indent=1, ensure_ascii=False))
    shown = {**results["correlations"], **results.get("questionnaire", {})}
    print(
        json.dumps(
            {
                k: {m: v.get(m) for m in ("n", "spearman", "spearman_ci95", "spearman_p_holm")}
                for k, v in shown.items()
            },
            indent=1,
        )
    )
    return results


def consistency(first: Path, second: Path) -> dict:
    """Two replays of the same conversations by different backbones: per rating, the correlation of
    their conversation-level ratings (clustered by persona)."""
    a, b = json.loads(first.read_text()), json.loads(second.read_text())
    shared = sorted(set(a["ratings"]) & set(b["ratings"]))
    out = {"first": {"model": a["model"], "adapter": a["adapter"]}, "second": {"model": b["model"], "adapter": b["adapter"]},
           "conversations": len(shared), "correlations": {}}  # fmt: skip
    rng = np.random.default_rng(0)
    for key in KEYS:
        keep = [f for f in shared if a["ratings"][f][key] is not None and b["ratings"][f][key] is not None]
        out["correlations"][key] = clustered_correlation(
            [a["ratings"][f][key] for f in keep],
            [b["ratings"][f][key] for f in keep],
            [a["persona"][f] for f in keep],
            rng,
        )
    holm(out["correlations"])
    print(json.dumps(out, indent=1))
    return out


def agreement(runs: list[Path], data: Path, resamples: int = 2000) -> dict:
    """The people's questionnaire as answered by one or more backbones (the folders of ``--replay human
    --questionnaire-only`` runs): per backbone and item, Spearman with the person's own answer
    (person-clustered interval, Holm over the items), and for each later backbone against the first,
    the paired difference in Spearman on the conversations both answered: the same resampled people
    for both, a percentile interval and a two-sided bootstrap p-value, Holm over the items."""
    from scipy.stats import spearmanr

    from agents.runs import valid_lines

    truth = {
        c.file: (c.persona, c.questionnaire or {})
        for c in recllmsim.load(data).conversations
        if c.source == "human"
    }
    answered = []
    for run in runs:
        if not (run / "questionnaire_answers.jsonl").exists():
            raise SystemExit(
                f"error: {run} holds no questionnaire_answers.jsonl (eval.converse --replay human)"
            )
        rows = {row["file"]: row["answer"] for _, row in valid_lines(run / "questionnaire_answers.jsonl")}
        unknown = sorted(set(rows) - set(truth))
        if unknown:
            raise ValueError(
                f"{run}: {len(unknown)} answers name no real-person conversation, e.g. {unknown[0]}"
            )
        answered.append(rows)
    rng = np.random.default_rng(0)
    out = {
        "runs": [str(r) for r in runs],
        "answered": [len(a) for a in answered],
        "items": {},
        "differences": {},
    }
    for name, scale in QUESTIONNAIRE.items():
        real = {f: scale.get(truth[f][1].get(name)) for f in truth}
        per_run = []
        for rows in answered:
            keep = [f for f, a in rows.items() if a is not None and real[f] is not None]
            per_run.append(
                item_agreement(
                    [rows[f][name] for f in keep],
                    [real[f] for f in keep],
                    [truth[f][0] for f in keep],
                    rng,
                    resamples,
                )
            )
        out["items"][name] = per_run
        first = answered[0]
        for k, rows in enumerate(answered[1:], start=1):
            keep = sorted(f for f in first if first[f] and rows.get(f) and real[f] is not None)
            a = np.array([first[f][name] for f in keep], float)
            b = np.array([rows[f][name] for f in keep], float)
            y = np.array([real[f] for f in keep], float)
            people = np.array([truth[f][0] for f in keep])
            if len(keep) < 3 or min(np.ptp(a), np.ptp(b), np.ptp(y)) == 0:
                out["differences"][f"{name}: {runs[k]} - {runs[0]}"] = {
                    "n": len(keep),
                    "note": "a constant variable",
                }
                continue
            members = [np.flatnonzero(people == c) for c in np.unique(people)]
            draws = []
            for _ in range(resamples):
                index = np.concatenate([members[i] for i in rng.integers(len(members), size=len(members))])
                if min(np.ptp(a[index]), np.ptp(b[index]), np.ptp(y[index])) > 0:
                    draws.append(
                        spearmanr(b[index], y[index]).statistic - spearmanr(a[index], y[index]).statistic
                    )
            draws = np.asarray(draws)
            key = f"{name}: {runs[k]} - {runs[0]}"
            difference = round(float(spearmanr(b, y).statistic - spearmanr(a, y).statistic), 3)
            if len(draws) < 0.95 * resamples:  # as clustered_correlation: a biased few survive
                out["differences"][key] = {"n": len(keep), "difference": difference, "pair": k,
                                           "note": f"{resamples - len(draws)} of {resamples} resamples had a constant variable"}  # fmt: skip
                continue
            out["differences"][key] = {
                "n": len(keep),
                "difference": difference,
                "ci95": [round(float(v), 3) for v in np.percentile(draws, [2.5, 97.5])],
                "p": bootstrap_p(draws),
                "resamples": len(draws),
                "pair": k,
            }
    for k in range(len(runs)):
        holm({name: out["items"][name][k] for name in QUESTIONNAIRE})
    for k in range(1, len(runs)):  # Holm over the items, per pair of backbones
        holm_rows(
            [v for v in out["differences"].values() if v.get("pair") == k], lambda v: v.get("p"), "p_holm"
        )
    return out


def agreement_table(result: dict) -> str:
    """Markdown for ``agreement``: one row per backbone and item, then the paired differences."""
    lines = [
        "| backbone | item | n | Spearman [95% CI] | Holm p | simulated mean | real mean |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, run in enumerate(result["runs"]):
        for name, rows in result["items"].items():
            r = rows[k]
            if "spearman" not in r:
                lines.append(
                    f"| {run} | {name} | {r['n']} | {r['note']} | | {r['simulated_mean'] if r['simulated_mean'] is not None else ''} | {r['real_mean'] if r['real_mean'] is not None else ''} |"
                )
                continue
            ci = r["spearman_ci95"] and f" [{r['spearman_ci95'][0]:+.3f}, {r['spearman_ci95'][1]:+.3f}]"
            lines.append(
                f"| {run} | {name} | {r['n']} | {r['spearman']:+.3f}{ci or ' (no interval)'} | "
                f"{r['spearman_p_holm']:.3g} | {r['simulated_mean']} | {r['real_mean']} |"
            )
    if result["differences"]:
        lines += [
            "",
            "| paired difference in Spearman | n | difference [95% CI] | Holm p |",
            "|---|---|---|---|",
        ]
        for key, d in result["differences"].items():
            if "ci95" in d:
                lines.append(
                    f"| {key} | {d['n']} | {d['difference']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] | {d['p_holm']:.3g} |"
                )
            else:
                lines.append(f"| {key} | {d['n']} | {d['note']} | |")
    return "\n".join(lines)


LADDER_KEYS = (*KEYS, "llm_objective")


def ladders(first: Path, second: Path, low: str = "random", high: str = "oracle") -> dict:
    """Two ladder runs of the same goals with different backbones (bench/converse_ladder.sh): which one
    tells the ladder's ends apart better. Per backbone and rating (the three ratings and the LLM's own
    recommendation score, ``llm_objective``), each goal's gap: its mean rating against ``high`` minus
    against ``low``; then the second backbone's gap minus the first's over the goals both rated (BCa
    interval, Wilcoxon signed-rank p, Holm over the ratings), and each run's unusable ratings."""
    from scipy.stats import wilcoxon

    def gaps(run: Path) -> dict[str, dict[int, float]]:
        per: dict[tuple[str, str, int], list[float]] = {}
        for t in read_jsonl(run / "turns.jsonl"):
            for key in LADDER_KEYS:
                value = (t.get("rating") or {}).get(key)
                if t["crs"] in (low, high) and value is not None:
                    per.setdefault((key, t["crs"], t["persona"]), []).append(value)
        out = {}
        for key in LADDER_KEYS:
            both = {p for k, c, p in per if k == key and c == low} & {
                p for k, c, p in per if k == key and c == high
            }
            out[key] = {
                p: float(np.mean(per[key, high, p]) - np.mean(per[key, low, p])) for p in sorted(both)
            }
        return out

    def targets(run: Path) -> dict:
        return {(d["crs"], d["persona"]): d.get("targets") for d in read_jsonl(run / "dialogues.jsonl")}

    ta, tb = targets(first), targets(second)
    differ = sorted(k for k in set(ta) & set(tb) if ta[k] != tb[k])
    if differ:
        raise SystemExit(
            f"error: {first} and {second} gave other goals to the same persona ids, e.g. {differ[0]}"
        )
    a, b = gaps(first), gaps(second)
    out = {"first": str(first), "second": str(second), "low": low, "high": high, "unusable_ratings": {},
           "gap": {}, "difference": {}}  # fmt: skip
    for run in (first, second):
        counts = json.loads((run / "summary.json").read_text())["counts"]
        out["unusable_ratings"][str(run)] = {
            "unusable": sum(v for k, v in counts.items() if k.startswith("fallback:rating")),
            "rating_calls": counts.get("llm_calls:rating", 0),
        }
    for key in LADDER_KEYS:
        out["gap"][key] = {
            str(run): {"mean": round(float(np.mean(list(g[key].values()))), 3) if g[key] else None,
                       "ci95": interval(list(g[key].values())), "goals": len(g[key])}
            for run, g in ((first, a), (second, b))
        }  # fmt: skip
        shared = sorted(set(a[key]) & set(b[key]))
        diff = [b[key][p] - a[key][p] for p in shared]
        row = {
            "goals": len(shared),
            "mean": round(float(np.mean(diff)), 3) if diff else None,
            "ci95": interval(diff),
        }
        if len(diff) >= 2 and any(diff):
            row["p"] = float(wilcoxon(diff).pvalue)
        out["difference"][key] = row
    holm_rows(out["difference"].values(), lambda v: v.get("p"), "p_holm")
    return out


def ladders_table(result: dict) -> str:
    first, second = result["first"], result["second"]
    lines = [
        f"| rating | {result['high']} − {result['low']} gap (goals), {first} | gap (goals), {second} | "
        "second − first [95% CI] (goals paired) | Wilcoxon p | Holm p |",
        "|---|---|---|---|---|---|",
    ]

    def cell(v: dict) -> str:
        if v["mean"] is None:
            return "–"
        ci = f" [{v['ci95'][0]:+.2f}, {v['ci95'][1]:+.2f}]" if v.get("ci95") else ""
        return f"{v['mean']:+.2f}{ci} ({v['goals']})"

    for key, d in result["difference"].items():
        gap = result["gap"][key]
        p, raw = (f"{d['p_holm']:.3g}", f"{d['p']:.3g}") if "p_holm" in d else ("–", "–")
        lines.append(f"| {key} | {cell(gap[first])} | {cell(gap[second])} | {cell(d)} | {raw} | {p} |")
    unusable = ", ".join(
        f"{run}: {n['unusable']} of {n['rating_calls']}" for run, n in result["unusable_ratings"].items()
    )
    return "\n".join(lines) + f"\n\nunusable ratings: {unusable}"


def evaluate(run: Path, data: Path, out: Path) -> dict:
    turns = read_jsonl(run / "turns.jsonl")
    dialogues = read_jsonl(run / "dialogues.jsonl")
    summary = json.loads((run / "summary.json").read_text())
    personas = {p["id"]: p for p in json.loads((run / "personas.json").read_text())["personas"]}
    ref = reference(data)
    control = controllability(turns, personas)
    # realism and identification compare the simulated users with RecLLMSim's, whose conversations are
    # travel, gifts, recipes and skills: only the recllmsim setting's users talk about the same things
    other = {
        "note": f"not compared: the {summary['setting']} setting's dialogues are another domain than RecLLMSim's"
    }
    same = summary["setting"] == "recllmsim"
    asked = summary["config"]["rating"].get("enabled", True)
    lost = {
        "unusable": sum(v for k, v in summary["counts"].items() if k == "fallback:rating"),
        "asked": summary["counts"].get("llm_calls:rating", 0),
    }
    results = {
        "run": str(run),
        "ratings_asked": asked,
        "lost_ratings": lost,
        "ratings": ratings(turns, list(summary["crs"])),
        "outcomes": outcomes(dialogues, summary["counts"], list(summary["crs"])),
        "goals": goal_metrics(dialogues, turns, list(summary["crs"])),
        "realism": realism(turns, dialogues, ref) if same else other,
        "controllability": {k: v for k, v in control.items() if k != "raw"},
        "identification": identification(dialogues, personas, data) if same else other,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False))
    (out / "table.md").write_text(table(results))
    plot_lengths(control, ref["llm"]["words_en"], out / "lengths.png")
    plot_traits(control, out / "traits.png")
    print(table(results))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, help="a run folder of agents.converse")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/raw/recllmsim"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--replay", choices=["llm", "human"], help="replay recorded conversations instead")
    parser.add_argument(
        "--config", default="configs/converse/recllmsim.yaml", help="replay: the simulator's config"
    )
    parser.add_argument("--limit", type=int, help="replay: at most this many conversations")
    parser.add_argument("--set", nargs="*", action="extend", default=[], help="replay: config overrides")
    parser.add_argument(
        "--questionnaire-only",
        action="store_true",
        help="replay human: only the people's questionnaire, not the per-turn ratings as well",
    )
    parser.add_argument("--consistency", type=Path, nargs=2, help="two replay JSONs of different backbones")
    parser.add_argument(
        "--agreement",
        type=Path,
        nargs="+",
        help="questionnaire-only replay folders: per item agreement, and each against the first, paired",
    )
    parser.add_argument(
        "--ladders",
        type=Path,
        nargs=2,
        help="two ladder runs of different backbones: which tells the ends apart",
    )
    parser.add_argument("--low", default="random", help="ladders: the known-bad rung (oracle-ignores: words)")
    parser.add_argument("--high", default="oracle", help="ladders: the known-good rung (oracle-explains)")
    args = parser.parse_args(argv)
    if args.ladders:
        result = ladders(*args.ladders, low=args.low, high=args.high)
        print(ladders_table(result))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "ladders.json").write_text(json.dumps(result, indent=1))
            (args.out / "ladders.md").write_text(ladders_table(result) + "\n")
        return
    if not (args.run or args.replay or args.consistency or args.agreement):
        parser.error(
            "give --run RUN_DIR, --replay llm|human, --consistency A.json B.json or --agreement DIR..."
        )
    if args.agreement:
        result = agreement(args.agreement, args.data)
        print(agreement_table(result))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "agreement.json").write_text(json.dumps(result, indent=1))
            (args.out / "agreement.md").write_text(agreement_table(result) + "\n")
    elif args.consistency:
        result = consistency(*args.consistency)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "consistency.json").write_text(json.dumps(result, indent=1))
    elif args.replay:
        from agents.converse.config import load_config

        out = args.out or Path("runs/converse/replay")
        config = load_config(args.config, args.set)
        replay_check(
            args.data, config, out, args.replay, args.limit, turn_ratings=not args.questionnaire_only
        )
    else:
        evaluate(args.run, args.data, args.out or args.run / "eval")


if __name__ == "__main__":
    main()
