"""Branches of a sandbox run: two interventions continued from the same past, and their comparison.

    python -m agents.sandbox fork RUN --round 3 --out RUN_B                          # the same past
    python -m agents.sandbox fork RUN --round 3 --out RUN_C --set recommender.kind=popularity
    python -m agents.sandbox edit RUN_C --agent "User 414" --field traits --value "impatient"  # and/or
    python -m agents.sandbox run --config RUN_B/config.json --out RUN_B --rounds 10
    python -m agents.sandbox run --config RUN_C/config.json --out RUN_C --rounds 10
    python -m agents.sandbox compare RUN_B RUN_C --out runs/sandbox/b_vs_c

``fork`` copies the state after round K (RUN/checkpoints/round_K.json.gz: agents, memories, graph, the
recommender's clicks and seed, the run's random generator), the interactions, statistics and
interventions up to it, and the config (with ``--set`` changes) into a new run folder whose fingerprint
is that of its config, so ``run`` continues it from round K with the same seeds. NEW/fork.json says
where it came from and what the branch changed. The state is the one written at the end of round K:
interventions made on the parent after that (edits, broadcasts between rounds K and K+1) are not in the
branch, and fork.json lists them (``left_out_interventions``); apply them to the branch as its
intervention. Two forks with no change are identical round by round (tested).

``compare`` pairs two runs' per-round statistics (stats.jsonl) over the rounds after their shared past
(the later fork round of the two, else every round): per statistic the two means, the mean paired
difference (B - A) with a 95% bootstrap interval over rounds (scipy.stats.bootstrap), and a Wilcoxon
signed-rank p-value, Holm-corrected over the statistics compared (statsmodels). With few rounds the
intervals are wide: the table says how many rounds it pairs. Rounds of one run are not independent (each
starts from the last), so the intervals and p-values treat them as more independent than they are: read
them as optimistic.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from agents.runs import read_jsonl, write_json
from agents.sandbox.config import as_dict, load_config
from agents.stats import holm_rows
from data_prep import fingerprint

COPIED = ("rejects.jsonl", "profiles.yaml", "profiles_written.json")


def fork(run: Path, round_: int, out: Path, overrides: list[str] = ()) -> dict:
    from agents.sandbox.run import CHECKPOINTS, checkpoint_round, keep_rounds, round_checkpoint, run_inputs

    source = round_checkpoint(run, round_)
    if not source.exists():
        kept = sorted(checkpoint_round(p) for p in (run / CHECKPOINTS).glob("round_*.json.gz"))
        raise SystemExit(f"error: {run} has no checkpoint of round {round_} (it has rounds {kept})")
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"error: {out} is not empty: a fork starts a new run folder")
    config = load_config(run / "config.json", list(overrides))
    if config.rounds <= round_:
        config = load_config(run / "config.json", [*overrides, f"rounds={round_ + 1}"])
    out.mkdir(parents=True, exist_ok=True)
    data = source.read_bytes()
    state = json.loads(gzip.decompress(data))
    write_json(out / "checkpoint.json", state)
    (out / CHECKPOINTS).mkdir()
    for k in range(round_ + 1):
        if round_checkpoint(run, k).exists():
            shutil.copy2(round_checkpoint(run, k), round_checkpoint(out, k))
    for name in COPIED:
        if (run / name).exists():
            shutil.copy2(run / name, out / name)
    for name in ("interactions.jsonl", "stats.jsonl"):
        if (run / name).exists():
            shutil.copy2(run / name, out / name)
            keep_rounds(out / name, round_)
    interventions = read_jsonl(run / "interventions.jsonl")
    earlier = [r for r in interventions if r["round"] < round_]
    (out / "interventions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in earlier))
    write_json(out / "config.json", as_dict(config))
    inputs = run_inputs(config)
    fingerprint.record(out, inputs)
    parent = json.loads((run / fingerprint.FILE).read_text())["inputs"]
    record = {
        "from": str(run),
        "round": round_,
        "checkpoint_sha256": hashlib.sha256(data).hexdigest(),
        "overrides": list(overrides),
        "changed": fingerprint.differences(parent, fingerprint.normalise(inputs)),
        # made on the parent after round K's state was written: not in this branch
        "left_out_interventions": [
            r for r in interventions if r["round"] >= round_ and r["command"] != "interview"
        ],
    }
    write_json(out / "fork.json", record)
    print(
        f"forked {run} after round {round_} into {out} (changed: {', '.join(record['changed']) or 'nothing'}); "
        f"continue it: python -m agents.sandbox run --config {out}/config.json --out {out} --rounds N"
    )
    return record


def shared_past(a: Path, b: Path) -> int:
    """The last round two runs share: the later fork round of the two (a fork's own, or its parent's
    when one is the other's parent), else 0."""
    rounds = [
        json.loads((r / "fork.json").read_text())["round"] for r in (a, b) if (r / "fork.json").exists()
    ]
    return max(rounds, default=0)


def compare(a: Path, b: Path, out: Path | None = None, after: int | None = None) -> dict:
    from scipy.stats import bootstrap, wilcoxon

    after = shared_past(a, b) if after is None else after
    rows = {
        name: {r["round"]: r for r in read_jsonl(run / "stats.jsonl")} for name, run in (("a", a), ("b", b))
    }
    rounds = sorted(k for k in set(rows["a"]) & set(rows["b"]) if k > after)
    if not rounds:
        raise SystemExit(f"error: {a} and {b} share no round after round {after}: run them on first")
    keys = [
        k
        for k, v in rows["a"][rounds[0]].items()
        if k != "round" and isinstance(v, int | float) and not isinstance(v, bool)
    ]
    table = {}
    for key in keys:
        pairs = [(rows["a"][k].get(key), rows["b"][k].get(key)) for k in rounds]
        pairs = [(x, y) for x, y in pairs if isinstance(x, int | float) and isinstance(y, int | float)]
        if not pairs:
            continue
        x, y = np.array(pairs, dtype=float).T
        diff = y - x
        entry = {
            "rounds": len(diff),
            "a": float(x.mean()),
            "b": float(y.mean()),
            "difference": float(diff.mean()),
        }
        if len(diff) >= 2 and np.ptp(diff) > 0:
            ci = bootstrap(
                (diff,), np.mean, confidence_level=0.95, n_resamples=2000, method="percentile", rng=0
            )
            entry["ci95"] = [float(ci.confidence_interval.low), float(ci.confidence_interval.high)]
            entry["p"] = float(wilcoxon(y, x).pvalue)
        else:  # one round, or the same difference every round: no spread to resample
            entry["ci95"] = [entry["difference"], entry["difference"]] if len(diff) >= 2 else None
            entry["p"] = None if np.any(diff) else 1.0
        table[key] = entry
    holm_rows(table.values(), lambda v: v["p"], "p_holm")
    result = {"a": str(a), "b": str(b), "after_round": after, "rounds": rounds, "statistics": table}
    lines = [
        f"Rounds {rounds[0]}-{rounds[-1]} ({len(rounds)}, after the shared past of round {after}); "
        "difference = B - A, paired by round.",
        "",
        "| statistic | A | B | difference | 95% CI (optimistic: rounds are not independent) | p (Holm) |",
        "|---|---|---|---|---|---|",
    ]
    for key, v in table.items():
        ci = f"[{v['ci95'][0]:+.3f}, {v['ci95'][1]:+.3f}]" if v["ci95"] else "–"
        p = f"{v['p_holm']:.3f}" if "p_holm" in v else "–"
        lines.append(f"| {key} | {v['a']:.3f} | {v['b']:.3f} | {v['difference']:+.3f} | {ci} | {p} |")
    text = "\n".join(lines)
    print(text)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "compare.json", result)
        (out / "compare.md").write_text(text + "\n")
    return result
