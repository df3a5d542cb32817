"""The questionnaire-only replays of several backbones against the real people, per item, each paired
against the first (``agreement``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agents.stats import holm_rows
from data_prep import fingerprint, recllmsim
from eval.converse.replay import QUESTIONNAIRE, bootstrap_p, holm, item_agreement, shown_summary


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
    answered, shown, reads = [], [], []
    for run in runs:
        if not (run / "questionnaire_answers.jsonl").exists():
            raise SystemExit(
                f"error: {run} holds no questionnaire_answers.jsonl (eval.converse --replay human)"
            )
        lines = [row for _, row in valid_lines(run / "questionnaire_answers.jsonl")]
        rows = {row["file"]: row["answer"] for row in lines}
        shown.append(shown_summary([row.get("shown") for row in lines]))
        # a run from before the reading was recorded wrote one JSON object at the run's temperature
        reads.append((fingerprint.recorded(run) or {}).get("questionnaire_read", "json, sampled (older run)"))
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
        "shown": shown,
        "read": reads,
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
    lines += [
        "",
        "| backbone | read as | conversations shown whole | share of turns shown (quartiles) | share of tokens shown (quartiles) |",
        "|---|---|---|---|---|",
    ]

    def quartiles(v):
        return "not recorded" if v is None else " / ".join(f"{x:.2f}" for x in v)

    for run, read, s in zip(result["runs"], result["read"], result["shown"], strict=True):
        whole = f"{s['whole']} of {s['conversations']}" if s["conversations"] else "not recorded"
        lines.append(
            f"| {run} | {read} | {whole} | {quartiles(s['turns_share_quartiles'])} | "
            f"{quartiles(s['tokens_share_quartiles'])} |"
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
