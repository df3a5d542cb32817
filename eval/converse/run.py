"""A run of agents.converse evaluated: ratings, catalogue goals, how dialogues ended, realism,
controllability and profile identification (``evaluate``)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np

from agents.converse.simulator import ACTION_INTENT
from data_prep import recllmsim
from data_prep.io import read_jsonl
from eval.converse.common import KEYS, interval


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
