"""Two ladder runs of the same goals with different backbones: which tells the rungs apart better
(``ladders``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from agents.stats import holm_rows
from data_prep.io import read_jsonl
from eval.converse.common import KEYS, interval

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
