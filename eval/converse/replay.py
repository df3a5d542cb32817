"""Recorded conversations replayed through the simulator: its ratings and questionnaire answers
against RecLLMSim's recorded ones (``replay_check``), and two backbones on the same conversations
(``consistency``)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agents.stats import holm_rows
from data_prep import recllmsim
from data_prep.io import append_to
from eval.converse.common import KEYS

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
) -> tuple[list[dict | None], list[dict | None]]:
    """The simulator's questionnaire for each conversation, appended to OUT/questionnaire_answers.jsonl
    batch by batch (32 conversations), so a stopped replay resumes where it stopped (a line cut by a
    kill is redone); a rerun with another backbone, adapter, transcript budget, reading, seed or sample
    refuses to resume (OUT/fingerprint.json names what changed). Answers read from log-probabilities, or
    written at temperature 0, are the same resumed or not (sampled ones, where a backend gives no
    log-probabilities, are not). Returns the answers and each conversation's row: its answer, what the
    prompts showed of it (``shown``, agents.converse.simulator.Shown as a dict) and where the answer
    came from (``read_from``); a file written before these were recorded lacks both."""
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
        "questionnaire_read": config.questionnaire_read,
        "judgement_temperature": config.rating.temperature,
        "seed": config.seed,
        "limit": limit,
        "conversations": [c.file for c in convs],
    }
    if not fingerprint.verdict(out, inputs, overwrite=False, has_work=path.exists()):
        path.unlink(missing_ok=True)
    fingerprint.record(out, inputs)
    drop_cut_line(path)  # a line cut off by a kill: redone
    done = {row["file"]: row for _, row in valid_lines(path)}
    todo = [k for k, c in enumerate(convs) if c.file not in done]
    if done:
        print(f"resuming: {len(done)} questionnaires answered, {len(todo)} to go")
    with append_to(path) as sink:
        for start in tqdm(range(0, len(todo), 32), desc="questionnaires", unit=" x32"):
            chunk = todo[start : start + 32]
            for k, q in zip(chunk, simulator.questionnaire([recorded[k] for k in chunk]), strict=True):
                row = {
                    "file": convs[k].file,
                    "answer": q.answer,
                    "shown": asdict(q.shown),
                    "read_from": q.read_from,
                }
                sink.write(json.dumps(row, ensure_ascii=False) + "\n")
                done[convs[k].file] = row
            sink.flush()
    return [done[c.file]["answer"] for c in convs], [done[c.file] for c in convs]


def shown_summary(shown: list[dict | None]) -> dict:
    """How much of the conversations the questionnaire's prompts showed: how many whole (every turn, none
    cut), and the quartiles of the share of turns and of tokens shown (tokens: where measured)."""
    from agents.converse.simulator import Shown

    rows = [s for s in shown if s]
    turns = [s["turns"] / s["of_turns"] for s in rows if s["of_turns"]]
    tokens = [s["tokens"] / s["of_tokens"] for s in rows if s.get("tokens") is not None and s["of_tokens"]]

    def quartiles(values):
        return [round(float(v), 3) for v in np.percentile(values, [25, 50, 75])] if values else None

    return {
        "conversations": len(rows),
        "whole": sum(Shown(**s).whole for s in rows),
        "turns_share_quartiles": quartiles(turns),
        "tokens_share_quartiles": quartiles(tokens),
        "unrecorded": len(shown) - len(rows),
    }


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
    from agents.converse.simulator import UserSimulator, decoding
    from agents.llm import continues_answers
    from data_prep.converse_pairs import profile_text

    loaded = recllmsim.load(data)
    convs = [c for c in loaded.conversations if c.source == source]
    rng = np.random.default_rng(config.seed)
    order = rng.permutation(len(convs))
    convs = [convs[i] for i in order[: limit or len(convs)]]
    if backend is None:
        from agents.llm import load_llm

        backend = load_llm(config.llm)
    if source == "human" and config.questionnaire_read != "json" and not continues_answers(backend):
        raise ValueError(  # said before the turn ratings, not after them
            f"questionnaire_read={config.questionnaire_read} reads each item's digit after the answer's "
            "beginning, which this backend cannot continue: set llm.decoding_fields=vllm for a vLLM "
            "server, or questionnaire_read=json"
        )
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
        answers, rows = questionnaire_answers(simulator, convs, recorded, out, config, limit)
        results["unusable_questionnaires"] = sum(a is None for a in answers)
        results["questionnaire_read"] = config.questionnaire_read
        results["questionnaire_read_from"] = dict(Counter(row.get("read_from", "unrecorded") for row in rows))
        results["decoding"] = {k: v for k, v in decoding(config).items() if k.startswith("questionnaire")}
        results["shown"] = shown_summary([row.get("shown") for row in rows])
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
    printed = {**results["correlations"], **results.get("questionnaire", {})}
    print(
        json.dumps(
            {
                k: {m: v.get(m) for m in ("n", "spearman", "spearman_ci95", "spearman_p_holm")}
                for k, v in printed.items()
            },
            indent=1,
        )
    )
    if "shown" in results:
        print(f"what the questionnaire's prompts showed: {json.dumps(results['shown'])}")
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
