"""The review-simulation headline of bench/README.md from the suites that bench/quality.sh and
bench/quality_recipe.sh wrote: per sample, split and adapter, the rows that the targets compare, the
share of tasks about a new item, the selection rule chosen on validation, and the targets as paired
differences (95% BCa intervals over tasks).

    python -m bench.quality_tables                       # runs/quality -> stdout
    python -m bench.quality_tables --root runs/quality --out runs/quality/tables.md

The targets (issue 26): ``tuned-mbr`` at least the strongest model-free row (nearest-centroid,
stats-mbr, user-mean; and stats, also model-free) on overall, and ``stats`` at least the user's median on stars (the
nearest-centroid row's stars are that median). A suite that is missing is listed, not skipped.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eval.metrics import paired_bootstrap
from eval.review import per_task_terms

SAMPLES = ("amazon", "yelp")
SPLITS = {"all": "leave-last-out", "temporal": "temporal"}
ADAPTERS = {"suite": "demo recipe (50 steps)", "suite_quality": "CPU quality recipe"}
ROWS = ("user-mean", "nearest-centroid", "stats", "stats-mbr", "tuned-mbr")
MODEL_FREE = ("nearest-centroid", "stats-mbr", "user-mean", "stats")  # the issue names the first three


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
        name = (
            chosen["pool"]
            if chosen["pool"] == "centroid"
            else f"{chosen['pool']} w{chosen['sentiment_weight']:g}"
        )
        parts.append(
            f"{group.replace('_', ' ')}: {name} ({rule['validation'][group]['tasks']} validation tasks)"
        )
    return "; ".join(parts)


def section(root: Path, sample: str, split: str, prefix: str) -> list[str]:
    suite = root / sample / f"{prefix}_{split}"
    title = f"**{sample.capitalize()}, {SPLITS[split]}, {ADAPTERS[prefix]}**"
    if not (suite / "claims.md").exists():
        return [f"{title}: not run ({suite} has no claims.md)", ""]
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
    lines += ["", "| target | difference [95% CI] | holds? |", "|---|---|---|"]
    for other in MODEL_FREE:
        d = paired_bootstrap(terms["tuned-mbr"], terms[other], "overall")
        lines.append(f"| tuned-mbr ≥ {other}, overall | {interval(d)} | {verdict(d)} |")
    d = paired_bootstrap(terms["stats"], terms["nearest-centroid"], "preference_estimation")
    lines.append(f"| stats ≥ the user's median, PE | {interval(d)} | {verdict(d)} |")
    return [*lines, ""]


def verdict(d: dict) -> str:
    low, high = d["ci95"]
    if low > 0:
        return "yes, ahead"
    if low == high == 0:
        return "yes, equal (the same predictions)"
    if high < 0:
        return "**no: behind**"
    return "not separable (interval holds 0)"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=Path("runs/quality"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    lines = []
    for sample in SAMPLES:
        for split in SPLITS:
            for prefix in ADAPTERS:
                lines += section(args.root, sample, split, prefix)
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()
