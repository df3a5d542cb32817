"""A run of agents.converse evaluated (``evaluate``): ratings, catalogue goals and how dialogues ended,
here; realism, controllability and profile identification from eval.converse.realism."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from data_prep.io import read_jsonl
from eval.converse.common import KEYS, interval
from eval.converse.realism import (
    controllability,
    identification,
    plot_lengths,
    plot_traits,
    realism,
    realism_lines,
    reference,
)


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
