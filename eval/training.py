"""Each task's own metric during training: what a recipe names as ``task_metric``.

    task_metric: eval.training:review_task_metric      # review pairs (configs/sft/smollm2_cpu*.yaml)
    task_metric: eval.training:choice_task_metric      # the sandbox's choice pairs
    task_metric: eval.training:converse_task_metric    # the conversational simulator's pairs

train.sft calls it at step 0 (``eval_on_start``) and at every evaluation. It writes the greedy answer for
``task_examples`` validation pairs (users held out from training, spread over the file), scores the
stars and review with the offline evaluator (eval.scoring: PE, RG and overall, the stand-in scorers),
and scores beside them, on the same pairs, the copy baseline: another user's older review of the item
nearest the centroid of the user's older reviews, with the median of the user's older stars
(eval.review.baselines' nearest-centroid, time-aware: only reviews strictly older than the pair's
target, from the stores the pairs were built from, their task pairs blocked). An answer without
readable stars gets the user's median stars and is counted (``unreadable``); its text is scored as
written.

For choice pairs: the top-1 accuracy of the greedy answer (the number of a film on the page) on
``task_examples`` validation pages, beside two references on the same pages: the most-rated film on the
page (the counts the page shows, all older than the page's moment; ties share the credit) and chance
(1 / the page's size). The sandbox's popularity baseline picks the most-rated film before the moment,
so on a page it is the first reference. An answer that names no film of the page is wrong and counted.
Rating pairs among them (data_prep.choice_pairs --ratings): the mean absolute error of the greedy digit
against the real stars, beside the user's mean before the moment; an answer without a digit 1-5 is
counted and scored as 3. The best checkpoint is kept by the choice accuracy.

For the conversational simulator's pairs (data_prep.converse_pairs): on the action examples, the share
of greedy answers whose actions are the real turn's actions (as a set), beside the most common action
set of the training pairs on the same examples; on every example, the share of answers the simulator
can parse (the JSON it asks for: a non-empty ``actions`` list or a non-empty ``message``). An answer it
cannot parse is wrong and counted. The best checkpoint is kept by the action accuracy.

Each evaluation's answers are kept in output_dir/task_eval/step_N.jsonl. A resumed run scores those of
the step it keeps and of step 0 again, so its card compares them as an unbroken run's would.

train never imports eval (tests/test_layout.py): the recipe names this function, and train.sft loads it
by its import path.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np

from agents.encoders import packaged_minilm
from agents.retrieval import Retriever
from data_prep.prompt import parse_completion
from data_prep.schema import parse_iso
from data_prep.store import ReviewStore
from eval.backends import build_scorers
from eval.metrics import paired_bootstrap, paired_claim
from eval.scoring import score_pairs, summarise

TERMS = {
    "star": "star_error",
    "sentiment": "sentiment_error",
    "emotion": "emotion_error",
    "topic": "topic_error",
}


def write_answers(output_dir: Path, step: int, rows: list[dict], texts: list[str], key: str) -> None:
    """output_dir/task_eval/step_N.jsonl: each example's id (``key``), the greedy answer, the truth."""
    folder = output_dir / "task_eval"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({key: r[key], "answer": t, "truth": r["completion"][0]["content"]}) + "\n"
        for r, t in zip(rows, texts, strict=True)
    ]
    (folder / f"step_{step}.jsonl").write_text("".join(lines))


def terms_of(scored: dict) -> dict[str, np.ndarray]:
    return {short: np.asarray(scored[long]) for short, long in TERMS.items()}


def headline(scored: dict) -> dict[str, float]:
    s = summarise(scored)
    return {
        "overall": round(s["overall"], 4),
        "review_generation": round(s["review_generation"], 4),
        "preference_estimation": round(s["preference_estimation"], 4),
    }


# what train.sft's loss.png draws of a metric's curve: each series beside its dotted reference
REVIEW_PLOT = {
    "ylabel": "greedy answer on validation pairs",
    "title": "dotted: the copy baseline (nearest-centroid review)",
    "series": {
        name: [f"task_{name}", f"copy_{name}"]
        for name in ("overall", "review_generation", "preference_estimation")
    },
}
CHOICE_PLOT = {
    "ylabel": "top-1 accuracy on validation pages",
    "title": "dotted: the most-rated film on the page, and chance",
    "series": {"top-1": ["task_accuracy", "most_rated_accuracy"], "chance": [None, "chance_accuracy"]},
}
RATING_SERIES = {"rating MAE (stars)": ["task_rating_mae", "user_mean_rating_mae"]}


NOT_KEPT = (
    "the kept step was evaluated before this process resumed and its answers are not in task_eval/: "
    "no paired comparison"
)


def restore(metric, steps, key: str) -> None:
    """Evaluations made by an earlier process of a resumed run: score again the greedy answers it saved
    in output_dir/task_eval/step_N.jsonl, so the card's paired comparisons survive a restart. A step is
    restored only when its file holds the same examples (``key``) with the same truths, in order; else it
    stays unknown. Scoring is deterministic, so a restored step scores as it did."""
    have = {h["step"] for h in metric.history}
    for step in sorted({s for s in steps if s is not None} - have):
        path = metric.output_dir / "task_eval" / f"step_{step}.jsonl"
        if not path.exists():
            continue
        saved = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        same = [(s[key], s["truth"]) for s in saved] == [
            (r[key], r["completion"][0]["content"]) for r in metric.rows
        ]
        if same:
            metric([s["answer"] for s in saved], step, write=False)
    metric.history.sort(key=lambda h: h["step"])


def kept_and_references(history: list[dict], best_step: int | None, key: str, baseline: tuple[str, object]):
    """The evaluation kept (the best step's; without one, the last) and what the card compares it with,
    by name: the base model (step 0, where the adapter's B matrices start at zero) when the kept step is
    another one, then ``baseline`` (name, per-example values). ``key``: the per-example values of a
    history entry. None and {} when the kept step is in neither the history nor task_eval/ (restore)."""
    by_step = {h["step"]: h for h in history}
    kept = by_step.get(best_step) if best_step is not None else (history[-1] if history else None)
    if kept is None:
        return None, {}
    references = {"adapter_minus_base": by_step[0][key]} if 0 in by_step and kept["step"] != 0 else {}
    return kept, {**references, baseline[0]: baseline[1]}


def paired_share(a: np.ndarray, b: np.ndarray) -> dict:
    """a - b for per-example 0/1 (or shared-credit) scores (eval.metrics.paired_claim), as the card
    writes it: the mean difference, its BCa 95% interval, n."""
    claim = paired_claim(a, b)
    return {"difference": claim["difference"], "ci95": claim["ci"], "n": claim["users"]}


class ReviewTaskMetric:
    """Greedy answers for some validation pairs, scored beside the copy baseline (module docstring)."""

    def __init__(self, pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 128):
        if not rows:
            raise ValueError("the task metric needs validation pairs")
        self.rows, self.output_dir, self.max_new_tokens = rows, Path(output_dir), max_new_tokens
        card = json.loads((Path(pairs) / "card.json").read_text())
        # each store with its task pairs blocked, as data_prep.pairs built the prompts: the copy sees what
        # the model was shown, no more
        stores = [ReviewStore.open(d["dir"], tasks=d.get("tasks")) for d in card["data"]]
        encoder = packaged_minilm("auto", 64)
        self.scorers = build_scorers("offline", device="cpu")
        retriever = Retriever(encoder)
        self.truth = [parse_completion(r["completion"][0]["content"]) for r in rows]
        copies, self.median = [], []
        for row in rows:
            store = next((s for s in stores if s.get_user(row["user_id"]) is not None), stores[0])
            before = parse_iso(row["date"])
            history = store.get_reviews(user_id=row["user_id"], before=before)
            # other users' reviews, as the prompt's item section and the agents' copy baseline
            item = store.get_reviews(item_id=row["item_id"], before=before, not_user=row["user_id"])
            best = retriever.centroid_review(history, item)
            median = float(np.median([r["stars"] for r in history])) if history else 3.0
            self.median.append(median)
            copies.append((median, best["text"] if best else ""))
        self.copies = copies  # the copy baseline's (stars, text) per pair
        self.copy = score_pairs(
            [c[0] for c in copies],
            [c[1] for c in copies],
            [t[0] for t in self.truth],
            [t[1] for t in self.truth],
            self.scorers,
        )
        self.history: list[dict] = []  # per evaluation: step, the headline and the per-pair terms

    @property
    def prompts(self) -> list[str]:
        """The rendered prompts train.sft answers greedily at each evaluation."""
        return [r["rendered"] for r in self.rows]

    def __call__(self, texts: list[str], step: int, write: bool = True) -> dict[str, float]:
        """The metrics of these greedy answers (one per row) at this step, beside the copy baseline's."""
        parsed = [parse_completion(t) for t in texts]
        unreadable = [s is None or not 1 <= s <= 5 for s, _ in parsed]
        stars = [m if bad else s for (s, _), m, bad in zip(parsed, self.median, unreadable, strict=True)]
        reviews = [r if r else t for (_, r), t in zip(parsed, texts, strict=True)]
        scored = score_pairs(
            stars, reviews, [t[0] for t in self.truth], [t[1] for t in self.truth], self.scorers
        )
        metrics = {f"task_{k}": v for k, v in headline(scored).items()}
        metrics |= {f"copy_{k}": v for k, v in headline(self.copy).items()}
        metrics["task_unreadable"] = int(sum(unreadable))
        self.history.append({"step": step, **metrics, "terms": terms_of(scored)})
        if write:
            write_answers(self.output_dir, step, self.rows, texts, "review_id")
        return metrics

    def summary(self, best_step: int | None) -> dict:
        """For the model card: the curve, and at the kept step the paired difference against the base
        model (step 0: the adapter's B matrices start at zero) and against the copy baseline."""
        restore(self, (0, best_step), "review_id")
        curve = [{k: v for k, v in h.items() if k != "terms"} for h in self.history]
        out = {"examples": len(self.rows), "curve": curve, "plot": REVIEW_PLOT}
        kept, comparisons = kept_and_references(
            self.history, best_step, "terms", ("adapter_minus_copy", terms_of(self.copy))
        )
        if kept is None:
            return {**out, "kept_step": best_step, "note": NOT_KEPT}
        out["kept_step"] = kept["step"]
        for name, other in comparisons.items():
            out[name] = {
                metric: {
                    k: (round(v, 4) if isinstance(v, float) else v)
                    for k, v in paired_bootstrap(kept["terms"], other, metric).items()
                    if k in ("difference", "ci95", "n")
                }
                for metric in ("overall", "review_generation", "preference_estimation")
            }
            for value in out[name].values():
                value["ci95"] = [round(x, 4) for x in value["ci95"]]
        return out


def review_task_metric(pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 128):
    """What train.sft's ``task_metric`` loads for review pairs."""
    return ReviewTaskMetric(pairs, rows, output_dir, max_new_tokens)


def first_number(text: str) -> int | None:
    found = re.search(r"\d+", text)
    return int(found.group()) if found else None


class ChoiceTaskMetric:
    """Top-1 accuracy of greedy answers on validation pages, beside the most-rated film on the page
    and chance; rating MAE beside the user's mean where rating pairs are among them (module docstring)."""

    def __init__(self, pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 4):
        if not rows:
            raise ValueError("the task metric needs validation pairs")
        self.choices = [i for i, r in enumerate(rows) if r.get("task", "choice") == "choice"]
        self.ratings = [i for i, r in enumerate(rows) if r.get("task") == "rating"]
        if not self.choices:
            raise SystemExit(f"error: {pairs}/validation.jsonl has no choice pairs to score")
        if any("page_counts" not in rows[i] for i in self.choices):
            raise SystemExit(
                f"error: {pairs}/validation.jsonl has no page_counts: rebuild the pairs (data_prep.choice_pairs)"
            )
        self.rows, self.output_dir, self.max_new_tokens = rows, Path(output_dir), max_new_tokens
        self.truth = np.array([int(rows[i]["completion"][0]["content"]) for i in self.choices])
        counts = [np.asarray(rows[i]["page_counts"]) for i in self.choices]
        # the most-rated film's credit: 1 / (films tied at the top) when the real one is among them
        self.most_rated = np.array(
            [
                float(c[t - 1] == c.max()) / float((c == c.max()).sum())
                for c, t in zip(counts, self.truth, strict=True)
            ]
        )
        self.chance = np.array([1.0 / len(c) for c in counts])
        self.stars = np.array([rows[i]["stars"] for i in self.ratings], dtype=float)
        means = [rows[i]["user_mean_before"] for i in self.ratings]
        self.user_mean_error = np.abs(np.array([3.0 if m is None else m for m in means]) - self.stars)
        self.history: list[dict] = []

    @property
    def prompts(self) -> list[str]:
        return [r["rendered"] for r in self.rows]

    def __call__(self, texts: list[str], step: int, write: bool = True) -> dict[str, float]:
        picks = [first_number(texts[i]) for i in self.choices]
        pages = [len(self.rows[i]["page"]) for i in self.choices]
        unreadable = sum(p is None or not 1 <= p <= n for p, n in zip(picks, pages, strict=True))
        correct = np.array([float(p == t) for p, t in zip(picks, self.truth, strict=True)])
        metrics = {
            "task_accuracy": round(float(correct.mean()), 4),
            "most_rated_accuracy": round(float(self.most_rated.mean()), 4),
            "chance_accuracy": round(float(self.chance.mean()), 4),
        }
        if self.ratings:
            digits = [first_number(texts[i]) for i in self.ratings]
            bad = [d is None or not 1 <= d <= 5 for d in digits]
            given = np.array([3.0 if b else float(d) for d, b in zip(digits, bad, strict=True)])
            metrics["task_rating_mae"] = round(float(np.abs(given - self.stars).mean()), 4)
            metrics["user_mean_rating_mae"] = round(float(self.user_mean_error.mean()), 4)
            unreadable += sum(bad)
        metrics["task_unreadable"] = int(unreadable)
        self.history.append({"step": step, **metrics, "correct": correct})
        if write:
            write_answers(self.output_dir, step, self.rows, texts, "example_id")
        return metrics

    def summary(self, best_step: int | None) -> dict:
        """The curve and, at the kept step, the paired accuracy difference (BCa, over pages) against the
        base model (step 0) and against the most-rated film on the page."""
        restore(self, (0, best_step), "example_id")
        curve = [{k: v for k, v in h.items() if k != "correct"} for h in self.history]
        plot = (
            CHOICE_PLOT
            if not self.ratings
            else {**CHOICE_PLOT, "series": {**CHOICE_PLOT["series"], **RATING_SERIES}}
        )
        out = {"examples": len(self.rows), "curve": curve, "plot": plot}
        kept, others = kept_and_references(
            self.history, best_step, "correct", ("adapter_minus_most_rated", self.most_rated)
        )
        if kept is None:
            return {**out, "kept_step": best_step, "note": NOT_KEPT}
        out["kept_step"] = kept["step"]
        for name, other in others.items():
            out[name] = {"accuracy": paired_share(kept["correct"], other)}
        return out


def choice_task_metric(pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 4):
    """What train.sft's ``task_metric`` loads for the sandbox's choice pairs."""
    return ChoiceTaskMetric(pairs, rows, output_dir, max_new_tokens)


def answer_json(text: str) -> dict | None:
    """The first JSON object of an answer, or None."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def action_set(text: str) -> frozenset | None:
    value = answer_json(text)
    actions = value.get("actions") if value else None
    if not isinstance(actions, list) or not actions or not all(isinstance(a, str) for a in actions):
        return None
    return frozenset(actions)


CONVERSE_PLOT = {
    "ylabel": "greedy answers on validation turns",
    "title": "dotted: the training pairs' most common action set",
    "series": {
        "actions": ["task_action_accuracy", "majority_action_accuracy"],
        "parsed": ["task_parsed", None],
    },
}


class ConverseTaskMetric:
    """Action accuracy of greedy answers on validation turns beside the training pairs' most common
    action set, and the share of answers the simulator can parse (module docstring)."""

    def __init__(self, pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 64):
        self.actions = [i for i, r in enumerate(rows) if r.get("kind") == "action"]
        if not self.actions:
            raise SystemExit(f"error: {pairs}/validation.jsonl has no action examples to score")
        train = Path(pairs) / "train.jsonl"
        if not train.exists():
            raise SystemExit(
                f"error: {train} is missing: the majority baseline is read from the training pairs"
            )
        sets = Counter()
        with train.open() as handle:
            for line in handle:
                row = json.loads(line)
                if row.get("kind") == "action":
                    sets[action_set(row["completion"][0]["content"])] += 1
        self.majority = sets.most_common(1)[0][0] if sets else frozenset()
        self.truth = [action_set(rows[i]["completion"][0]["content"]) for i in self.actions]
        self.majority_correct = np.array([float(t == self.majority) for t in self.truth])
        self.rows, self.output_dir, self.max_new_tokens = rows, Path(output_dir), max_new_tokens
        self.history: list[dict] = []

    @property
    def prompts(self) -> list[str]:
        return [r["rendered"] for r in self.rows]

    def parsed(self, row: dict, text: str) -> bool:
        if row.get("kind") == "action":
            return action_set(text) is not None
        value = answer_json(text)
        return bool(value and isinstance(value.get("message"), str) and value["message"].strip())

    def __call__(self, texts: list[str], step: int, write: bool = True) -> dict[str, float]:
        correct = np.array(
            [float(action_set(texts[i]) == t) for i, t in zip(self.actions, self.truth, strict=True)]
        )
        parsed = [self.parsed(r, x) for r, x in zip(self.rows, texts, strict=True)]
        metrics = {
            "task_action_accuracy": round(float(correct.mean()), 4),
            "majority_action_accuracy": round(float(self.majority_correct.mean()), 4),
            "task_parsed": round(float(np.mean(parsed)), 4),
            "task_unreadable": int(len(parsed) - sum(parsed)),
        }
        self.history.append({"step": step, **metrics, "correct": correct})
        if write:
            write_answers(self.output_dir, step, self.rows, texts, "example_id")
        return metrics

    def summary(self, best_step: int | None) -> dict:
        """The curve and, at the kept step, the paired action-accuracy difference (BCa, over turns)
        against the base model (step 0) and against the majority action set."""
        restore(self, (0, best_step), "example_id")
        curve = [{k: v for k, v in h.items() if k != "correct"} for h in self.history]
        out = {"examples": len(self.rows), "curve": curve, "plot": CONVERSE_PLOT,
               "majority_actions": sorted(self.majority)}  # fmt: skip
        kept, others = kept_and_references(
            self.history, best_step, "correct", ("adapter_minus_majority", self.majority_correct)
        )
        if kept is None:
            return {**out, "kept_step": best_step, "note": NOT_KEPT}
        out["kept_step"] = kept["step"]
        for name, other in others.items():
            out[name] = {"action_accuracy": paired_share(kept["correct"], other)}
        return out


def converse_task_metric(pairs: str, rows: list[dict], output_dir: str, max_new_tokens: int = 64):
    """What train.sft's ``task_metric`` loads for the conversational simulator's pairs."""
    return ConverseTaskMetric(pairs, rows, output_dir, max_new_tokens)
