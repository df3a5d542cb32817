"""The review-simulation headline of bench/README.md from the suites that bench/quality.sh and
bench/quality_recipe.sh wrote: per sample, split and adapter, the rows that the targets compare, the
share of tasks about a new item, the selection rule chosen on validation, and the targets as paired
differences (95% BCa intervals over tasks) with one-sided bootstrap p-values in both directions,
Holm-corrected over every target printed.

    python -m bench.quality_tables                       # runs/quality -> stdout
    python -m bench.quality_tables --root runs/quality --out runs/quality/tables.md

The targets (issue 26): ``tuned-mbr`` at least the strongest model-free row (nearest-centroid, stats-mbr,
user-mean; and stats and previous-review, also model-free) on overall, and ``stats`` at least the user's
median on stars (the nearest-centroid row's stars are that median). A suite that is missing is listed, not
skipped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from statsmodels.stats.multitest import multipletests

from agents.review.select import option_name
from eval.metrics import paired_bootstrap, per_task_scores
from eval.review import per_task_terms

SAMPLES = ("amazon", "yelp")
SPLITS = {"all": "leave-last-out", "temporal": "temporal"}
ADAPTERS = {"suite": "demo recipe (50 steps)", "suite_quality": "CPU quality recipe"}
ROWS = ("previous-review", "user-mean", "nearest-centroid", "stats", "stats-mbr", "tuned-mbr")
ALPHA = 0.05
RESAMPLES = 10_000  # enough for a Holm p under ALPHA over the ~100 tests of both adapters
# the issue names the first three; stats and previous-review are model-free too
MODEL_FREE = ("nearest-centroid", "stats-mbr", "user-mean", "stats", "previous-review")


def interval(d: dict) -> str:
    return f"{d['difference']:+.4f} [{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}]"


def split_note(root: Path, sample: str, split: str) -> str:
    tasks = json.loads((root / sample / f"tasks_{split}" / "manifest.json").read_text())
    val = json.loads((root / sample / f"val_{split}" / "manifest.json").read_text())
    c, v = tasks["counts"], val["counts"]
    when = f", cutoff {tasks['cutoff'][:10]}" if tasks.get("cutoff") else ""
    since = f" from {v['validation_cutoff'][:10]}" if v.get("validation_cutoff") else ""
    return (
        f"{c['tasks']} tasks{when}, {c['new_item_share']:.0%} about a new item; "
        f"validation {v['tasks']} tasks{since}, {v['new_item_share']:.0%} new items"
    )


def rule_note(suite: Path) -> str:
    path = suite / "validation" / "tuned-mbr" / "rule.json"
    if not path.exists():
        return "no selection rule"
    rule = json.loads(path.read_text())
    parts = []
    for group, chosen in rule["groups"].items():
        name = option_name(chosen["pool"], chosen.get("sentiment_weight"))
        parts.append(
            f"{group.replace('_', ' ')}: {name} ({rule['validation'][group]['tasks']} validation tasks)"
        )
    return "; ".join(parts)


def section(root: Path, sample: str, split: str, prefix: str, tests: list) -> list:
    """One suite's lines; each target line is a callable filled in once every target's Holm-corrected
    p is known (``tests`` collects the one-sided bootstrap p of each target, both directions)."""
    suite = root / sample / f"{prefix}_{split}"
    title = f"**{sample.capitalize()}, {SPLITS[split]}, {ADAPTERS[prefix]}**"
    if not (suite / "claims.md").exists():
        return [f"{title}: not run ({suite} has no claims.md)", ""]
    if missing := [n for n in ROWS if not (suite / "eval" / n / "results.json").exists()]:
        return [f"{title}: incomplete ({suite} has no results for {', '.join(missing)})", ""]
    results = {n: json.loads((suite / "eval" / n / "results.json").read_text()) for n in ROWS}
    terms = {n: per_task_terms(suite / "eval" / n) for n in ROWS}
    lines = [
        f"{title}: {split_note(root, sample, split)}. tuned-mbr's selection: {rule_note(suite)}.",
        "",
        "| run | PE | RG | overall | new items: n, overall |",
        "|---|---|---|---|---|",
    ]
    for name in ROWS:
        r = results[name]
        new = r["breakdown"].get("new_items")
        cold = f"{new['n']}, {new['overall']:.4f}" if new else "0"
        lines.append(
            f"| {name} | {r['preference_estimation']:.4f} | {r['review_generation']:.4f} | "
            f"{r['overall']:.4f} | {cold} |"
        )
    lines += ["", "| target | difference [95% CI] | Holm p: ahead / behind | holds? |", "|---|---|---|---|"]
    wanted = [(f"tuned-mbr ≥ {o}, overall", "tuned-mbr", o, "overall") for o in MODEL_FREE]
    wanted.append(("stats ≥ the user's median, PE", "stats", "nearest-centroid", "preference_estimation"))
    for label, a, b, metric in wanted:
        ahead, behind = (
            paired_bootstrap(terms[a], terms[b], metric, resamples=RESAMPLES),
            paired_bootstrap(terms[b], terms[a], metric, resamples=RESAMPLES),
        )
        same = bool(np.all(per_task_scores(terms[a], metric) == per_task_scores(terms[b], metric)))
        k = len(tests)
        if not same:  # identical predictions are no test
            tests += [one_sided_p(ahead), one_sided_p(behind)]
        lines.append(
            lambda holm, label=label, d=ahead, k=k, same=same: row(
                label, d, None if same else holm[k : k + 2]
            )
        )
    return [*lines, ""]


def one_sided_p(d: dict) -> float:
    """(1 + resamples whose mean is not above zero) / (B + 1): the bootstrap p of "difference > 0"."""
    below = round(d["resamples"] * (1 - d["share_of_resamples_above_zero"]))
    return (1 + below) / (d["resamples"] + 1)


def row(label: str, d: dict, holm) -> str:
    if holm is None:
        return f"| {label} | {interval(d)} | – | yes, equal (the same predictions) |"
    ahead, behind = holm
    if ahead < ALPHA:
        verdict = "yes, ahead"
    elif behind < ALPHA:
        verdict = "**no: behind**"
    else:
        verdict = "not separable"
    return f"| {label} | {interval(d)} | {ahead:.3f} / {behind:.3f} | {verdict} |"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=Path("runs/quality"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    lines, tests = [], []
    for sample in SAMPLES:
        for split in SPLITS:
            for prefix in ADAPTERS:
                lines += section(args.root, sample, split, prefix, tests)
    holm = multipletests(tests, method="holm")[1] if tests else []
    text = "\n".join(line(holm) if callable(line) else line for line in lines)
    text += (
        f"\n\nHolm p: one-sided paired bootstrap p-values ((1 + resamples not past zero) / (B + 1)), "
        f"both directions of every target above, Holm-corrected together ({len(tests)} tests); a target "
        f"is ahead or behind where that p is under {ALPHA}.\n"
    )
    if args.out:
        args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
