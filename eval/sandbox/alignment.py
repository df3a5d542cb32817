"""Rating alignment (the test of Agent4Rec, a peer sandbox of MovieLens agents), run through the
simulator: does a tested user's agent rate the films the user really rated next as the user did?

For each tested user (eval.sandbox.cases: the same users as eval.sandbox.discrimination and eval.sandbox.generation):
the user's ratings in time order (ties by movie id); the last ``held`` are held out; everything a method
sees is strictly older than the first of them (the cutoff). Methods predict a rating for each held-out
film:

- ``user_mean``: the user's mean rating before the cutoff (the global mean before it when none);
- ``user_mean_whole``: the same rounded to whole stars, the LLM's answer space (1-5);
- ``mf``: biased matrix factorisation for explicit ratings (``surprise.SVD``, Funk's SVD), trained per
  user on every rating older than that user's cutoff; its estimates are clipped to 0.5-5 by surprise;
- ``llm``: the bare LLM with the user's last rated titles and their stars as its memories, answering
  one of 1-5 (a structured choice; an unusable answer is replaced by the user's whole-star mean and
  counted);
- ``agent-llm``: the LLM's stars through the agent (the user's agent built at the cutoff as the sandbox
  builds it: profile, the memories the film recalls), unusable answers replaced as above;
- ``agent``: the agent's rating path in the sandbox (agents/sandbox/rating.py): the review simulator's
  star model as of the cutoff, blended with the agent's LLM stars only where the blend rule says so on
  the validation users' held-out ratings (asked of the LLM as those users' agents).

Real MovieLens ratings are half stars (0.5-5). Reported per method: MAE and RMSE over all held-out
ratings, the rating distribution with its Wasserstein distance from the real one, and, per user, the
paired difference of mean absolute errors against the agent with a 95% bootstrap interval. Agent4Rec
reports MAE 0.77 on MovieLens-1M with a hosted LLM. With ``--adapter`` (its pairs built with
``data_prep.choice_pairs --ratings``, all older than ``--after``) two more rows read the stars from the
adapter (``decision.adapter_scope: watch-rate``): ``tuned-llm``, the agent's tuned LLM alone, and
``tuned``, the agent's rating path with it (blended only where validation says so). An adapter trained
on choices only serves the watch decision: it has no rating rows (the table says so).

    python -m eval.sandbox.alignment --config configs/sandbox/movielens.yaml --out runs/alignment --users 100 \
        --after 2010-01-01 [--adapter runs/sandbox/sft/choice]

Writes OUT/results.json, OUT/table.md and OUT/distribution.png.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from eval.metrics import bca_interval
from eval.sandbox.cases import arguments

STARS = [str(s) for s in range(1, 6)]
NO_TUNED_ROW = (
    "No tuned row: no --adapter trained on rating pairs (data_prep.choice_pairs --ratings) was given, and an "
    "adapter trained on choices only serves the watch decision (decision.adapter_scope: watch)."
)


def make_cases(data, users: list[int], held: int) -> list[dict]:
    by_user = data.by_user()
    cases = []
    for user in users:
        ratings = by_user[user]  # time order, ties by movie id
        cutoff = ratings[-held].ts
        cases.append(
            {
                "user": user,
                "cutoff": cutoff,
                "history": [(r.movie, r.stars) for r in ratings[:-held] if r.ts < cutoff],  # strictly older
                "held": [(r.movie, r.stars) for r in ratings[-held:]],
                "held_ts": [r.ts for r in ratings[-held:]],  # when each held rating became known
            }
        )
    return cases


def global_mean_before(data, cutoff: int) -> float:
    stars = [r.stars for r in data.ratings if r.ts < cutoff]
    return float(np.mean(stars)) if stars else 3.0


def predict_user_mean(cases, data, counts=None, **_) -> list[list[float]]:
    out = []
    for case in cases:
        history = [s for _, s in case["history"]]
        if not history and counts is not None:
            counts["users_without_history"] += 1  # the global mean before the cutoff stands in
        mean = float(np.mean(history)) if history else global_mean_before(data, case["cutoff"])
        out.append([mean] * len(case["held"]))
    return out


def predict_user_mean_whole(cases, data, counts=None, **_) -> list[list[float]]:
    # half up (not numpy's half to even): 3.5 -> 4; kept inside the agent's 1-5
    means = predict_user_mean(cases, data, counts)
    return [[float(min(5, max(1, np.floor(p + 0.5)))) for p in row] for row in means]


def predict_mf(cases, data, config, counts=None, **_) -> list[list[float]]:
    """surprise's SVD trained per user on every rating older than that user's cutoff, seeded."""
    import pandas as pd
    from surprise import SVD, Dataset, Reader

    out = []
    for case in tqdm(cases, desc="mf per user", leave=False):
        older = [(r.user, r.movie, r.stars) for r in data.ratings if r.ts < case["cutoff"]]
        frame = pd.DataFrame(older, columns=["user", "item", "rating"])
        train = Dataset.load_from_df(frame, Reader(rating_scale=(0.5, 5))).build_full_trainset()
        model = SVD(n_factors=config.recommender.factors, random_state=config.seed)
        model.fit(train)
        predictions = [model.predict(case["user"], movie) for movie, _ in case["held"]]
        if counts is not None:  # an unknown user or movie: surprise gives its global mean, counted
            counts["mf_impossible"] += sum(bool(p.details.get("was_impossible")) for p in predictions)
        out.append([float(p.est) for p in predictions])
    return out


def rating_prompts(cases, data, history_titles: int) -> list[list[dict]]:
    from data_prep.prompt import build_sandbox_messages as frame

    prompts = []
    for case in cases:
        memories = [
            f"I rated {data.movies[m].title} {s:g} out of 5" for m, s in case["history"][-history_titles:]
        ]
        for movie, _ in case["held"]:
            prompts.append(
                frame(
                    f"User {case['user']}, a movie watcher",
                    memories,
                    "You just watched this movie. How many stars do you give it, from 1 (hated it) to 5 "
                    "(loved it)? Answer with one digit.",
                    f"The movie: {data.movies[movie].text()}",
                )
            )
    return prompts


def calibrated(
    values: list[list[float | None]], cases, validation_values, validation, counts
) -> list[list[float | None]]:
    """Expected stars mapped by an isotonic fit on the validation users' held-out ratings that became
    known strictly before each case's cutoff (agents.review.stars.TimedIsotonic); None where fewer than
    MIN_CALIBRATION of them are older or no value was read (counted)."""
    from agents.review.stars import TimedIsotonic

    rows = [
        (t, v, s)
        for case, row in zip(validation, validation_values, strict=True)
        for t, v, (_, s) in zip(case["held_ts"], row, case["held"], strict=True)
        if v is not None
    ]
    times, x, y = (np.array(c) for c in zip(*rows, strict=True)) if rows else ([], [], [])
    fit = TimedIsotonic(times, x, y, (0.5, 5.0), MIN_CALIBRATION)
    out = []
    for case, row in zip(cases, values, strict=True):
        mapped = fit.at([v if v is not None else None for v in row], [case["cutoff"]] * len(row))
        out.append([None if v is None or np.isnan(m) else float(m) for v, m in zip(row, mapped, strict=True)])
    counts["calibrated_on"] = len(rows)
    counts["not_calibrated"] += sum(
        v is not None and m is None
        for r, c in zip(values, out, strict=True)
        for v, m in zip(r, c, strict=True)
    )
    return out


def read_stars(cases, values, config, validation, validation_values, counts) -> list[list[float | None]]:
    """The LLM's stars as ``stars.read`` says: greedy as read; expected calibrated on validation."""
    if config is None or config.stars.read == "greedy":
        return values
    return calibrated(values, cases, validation_values, validation, counts)


def predict_llm(
    cases, data, backend, rng, counts, config=None, validation=(), history_titles: int = 20, **_
) -> list[list[float]]:
    """The bare LLM's stars, read from its probabilities over 1-5 (``stars.read``; expected ones
    calibrated on the validation users' held-out ratings); unreadable ones replaced by the user's
    whole-star mean, counted."""
    from agents.llm import option_probs, read_choice
    from eval.sandbox.cases import adapter_context

    mode = config.stars.read if config is not None else "greedy"
    asked = list(cases) + (list(validation) if mode == "expected" else [])
    prompts = rating_prompts(asked, data, history_titles)
    answers, chunk, seed = [], 64, int(rng.integers(2**31 - 1))  # asked in chunks, for the progress bar
    with adapter_context(backend, False):  # the bare LLM is the base model
        for start in tqdm(range(0, len(prompts), chunk), desc="llm ratings", unit="chunk"):
            answers += option_probs(backend, prompts[start : start + chunk], STARS, seed=seed + start)
    counts.update(f"probs_from:{a.probs_from}" for a in answers)
    values, k = [], 0
    for case in asked:
        values.append([read_choice(a, mode) for a in answers[k : k + len(case["held"])]])
        k += len(case["held"])
    stars = read_stars(cases, values[: len(cases)], config, validation, values[len(cases) :], counts)
    fallback = predict_user_mean_whole(cases, data)  # not counted here: the fallbacks are, below
    out = []
    for row, backup in zip(stars, fallback, strict=True):
        counts["agent_fallbacks"] += sum(v is None for v in row)
        out.append([v if v is not None else b for v, b in zip(row, backup, strict=True)])
    return out


def agents_for(cases, data, config, backend, embed, rng):
    """Each tested user's agent at the cutoff and a Decider for it (temperature 0)."""
    from agents.sandbox.agent import agents_at
    from agents.sandbox.decide import Decider
    from agents.sandbox.memory import LLMMemoryModel

    decider = Decider(config, backend, rng, Counter())
    model = LLMMemoryModel(backend, around=decider.adapter, writer=config.memory.writer)
    agents = agents_at(
        data, [c["user"] for c in cases], [c["cutoff"] for c in cases], config, embed, model, rng
    )
    return agents, decider, model


def predict_agent_llm(
    cases, data, config, backend, embed, rng, counts, validation=(), **_
) -> list[list[float]]:
    """The LLM's stars through each user's agent at the cutoff (rating.py's prompt and choice), each film
    asked of the agent as it stood at the cutoff (recalling refreshes memories: restored between)."""
    from agents.sandbox.agent import rate_messages
    from agents.sandbox.rating import STARS

    asked = list(cases) + (list(validation) if config.stars.read == "expected" else [])
    agents, decider, _ = agents_for(asked, data, config, backend, embed, rng)
    values = []
    for agent, case in tqdm(list(zip(agents, asked, strict=True)), desc="agent-llm", leave=False):
        start, prompts = agent.memory.to_json(), []
        for film, _ in case["held"]:
            agent.memory.load_json(start)
            prompts.append(rate_messages(agent, data.movies[film], case["cutoff"], 0))
        names = [agent.profile.name] * len(prompts)
        values.append(decider.read("rate", names, prompts, STARS, config.stars.read))
    counts.update({k: v for k, v in decider.counts.items() if k.startswith("probs_from:")})
    stars = read_stars(cases, values[: len(cases)], config, validation, values[len(cases) :], counts)
    out = []
    for row, backup in zip(stars, predict_user_mean_whole(cases, data), strict=True):
        counts["agent_fallbacks"] += sum(v is None for v in row)
        out.append([v if v is not None else b for v, b in zip(row, backup, strict=True)])
    return out


def predict_agent(cases, data, config, backend, embed, rng, counts, validation=(), **_) -> list[list[float]]:
    """The agent's rating path: the star model as of each cutoff, the LLM blended in only where the
    validation users' held-out ratings (asked of the LLM as their agents) say it helps."""
    from agents.sandbox.rating import Rater

    agents, decider, model = agents_for(cases, data, config, backend, embed, rng)
    rater = Rater(data.ratings, decider, config, data.movies)
    wanted = {(c["user"], m) for c in validation for m, _ in c["held"]}
    rows = [r for r in rater.model.validation if (int(r[1]), int(r[2])) in wanted]
    if rows:
        rater.validate(rows, data, embed, model, rng)
    counts.update(rater.counts)
    counts["llm_validation_rows"] = len(rows)
    groups = rater.model.report.get("blend_groups") or {}
    counts["blend_chosen_with_all_validation"] = {
        g: r["chosen_with_all_validation"] for g, r in groups.items()
    }
    out = []
    for agent, case in zip(agents, cases, strict=True):
        films = [m for m, _ in case["held"]]
        stars, sources = rater.rate(
            [agent] * len(films), films, [case["cutoff"]] * len(films), [0] * len(films)
        )
        counts.update(f"source:{s}" for s in sources)
        out.append(stars)
    return out


MIN_CALIBRATION = 20  # validation ratings an isotonic calibration of expected stars needs


METHODS = {
    "user_mean": predict_user_mean,
    "user_mean_whole": predict_user_mean_whole,
    "mf": predict_mf,
    "llm": predict_llm,
    "agent-llm": predict_agent_llm,
    "agent": predict_agent,
}
TUNED = {"tuned-llm": "agent-llm", "tuned": "agent"}  # the same paths, the stars read from the adapter
LLM_METHODS = ("llm", "agent-llm", "agent", *TUNED)


def paired_interval(a: np.ndarray, b: np.ndarray) -> list[float]:
    """95% BCa bootstrap interval of mean(a - b) over users."""
    if len(a) < 2:
        return None  # no interval from one user
    low, high, _ = bca_interval(a - b)
    return [round(low, 4), round(high, 4)]


def score(cases, predictions: dict[str, list[list[float]]]) -> dict:
    from scipy.stats import wasserstein_distance

    real = np.array([s for c in cases for _, s in c["held"]])
    per_user_real = [np.array([s for _, s in c["held"]]) for c in cases]
    out = {"real_distribution": dict(sorted(Counter(real.tolist()).items())), "methods": {}}
    user_mae = {}
    for method, rows in predictions.items():
        flat = np.array([p for row in rows for p in row])
        errors = flat - real
        user_mae[method] = np.array(
            [np.abs(np.array(row) - r).mean() for row, r in zip(rows, per_user_real, strict=True)]
        )
        out["methods"][method] = {
            "mae": round(float(np.abs(errors).mean()), 4),
            "rmse": round(float(np.sqrt((errors**2).mean())), 4),
            "mean_prediction": round(float(flat.mean()), 4),
            "wasserstein_to_real": round(float(wasserstein_distance(flat, real)), 4),
            "distribution": dict(sorted(Counter(np.round(flat * 2) / 2).items())),
        }
    if "agent" in user_mae:  # paired over users: the other method's MAE minus the agent's
        for method, mae in user_mae.items():
            if method != "agent":
                out["methods"][method]["mae_minus_agent_ci95"] = paired_interval(mae, user_mae["agent"])
    return out


def rating_adapter(adapter: str, moment: int, config) -> dict:
    """The adapter's card, checked as the sandbox's tests check it, and that its pairs hold ratings."""
    from eval.sandbox.cases import check_adapter

    trained = check_adapter(adapter, moment, config)
    card = json.loads((Path(adapter) / "training_card.json").read_text())
    if not ((card.get("data") or {}).get("options") or {}).get("ratings"):
        raise SystemExit(
            f"error: {adapter} was trained on choices only: its pairs hold no ratings "
            "(build them with python -m data_prep.choice_pairs --ratings N)"
        )
    return trained


def table(results: dict) -> str:
    methods = results["scores"]["methods"]
    lines = [
        f"| method ({results['ratings']} held-out ratings of {len(results['users'])} users) | MAE | RMSE | "
        "mean | Wasserstein to real | MAE minus agent's, 95% CI |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in methods.items():
        ci = m.get("mae_minus_agent_ci95")
        cell = f"[{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
        lines.append(
            f"| {name} | {m['mae']:.3f} | {m['rmse']:.3f} | {m['mean_prediction']:.2f} | "
            f"{m['wasserstein_to_real']:.3f} | {cell} |"
        )
    real = results["scores"]["real_distribution"]
    lines.append(f"| real ratings | | | {results['real_mean']:.2f} | 0 | |")
    lines.append("| Agent4Rec (paper, MovieLens-1M, hosted LLM) | 0.77 | | | | |")
    lines.append("")
    lines.append("Real distribution: " + ", ".join(f"{k:g}: {v}" for k, v in real.items()))
    if not any(name in methods for name in TUNED):
        lines += ["", NO_TUNED_ROW]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = np.arange(0.5, 5.01, 0.5)
    series = {"real": results["scores"]["real_distribution"]}
    series.update({name: m["distribution"] for name, m in results["scores"]["methods"].items()})
    width = 0.45 / len(series)
    fig, ax = plt.subplots(figsize=(8, 3.8))
    for k, (name, dist) in enumerate(series.items()):
        total = sum(dist.values())
        heights = [dist.get(float(b), 0) / total for b in bins]
        ax.bar(bins + (k - (len(series) - 1) / 2) * width, heights, width=width, label=name)
    ax.set_xticks(bins)
    ax.set_xlabel("stars (predictions rounded to half stars)")
    ax.set_ylabel("share of held-out ratings")
    ax.set_title("Rating distributions: real and predicted")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(
    config_path,
    set_overrides,
    out: Path,
    n_users: int,
    n_validation: int,
    after: str,
    held: int,
    methods: list[str],
    backend=None,
    embed=None,
    adapter: str | None = None,
) -> dict:
    from agents.sandbox.config import load_config
    from data_prep import movielens
    from eval.sandbox.cases import HORIZON, draw_users

    config = load_config(config_path, [*set_overrides, "temperature=0"])
    data = movielens.load(config.data)
    moment = movielens.parse_moment(after, data)
    if not 1 <= held <= HORIZON:
        raise SystemExit(
            f"error: --held must be 1 to {HORIZON} (the tests' users have {HORIZON} ratings after their cutoff)"
        )
    users, validation_users = draw_users(
        data, moment, HORIZON, config.min_history, n_users, n_validation, config.seed
    )
    cases = make_cases(data, users, held)
    validation = make_cases(data, validation_users, held)
    trained, tuned = None, None
    if adapter:  # one backend with the adapter: the other rows run with it off (adapter_scope: watch)
        trained = rating_adapter(adapter, moment, config)
        tuned = load_config(
            config_path, [*set_overrides, "temperature=0", "decision.adapter_scope=watch-rate"]
        )
        tuned.llm.adapter = adapter
        methods = [*methods, *(m for m in TUNED if m not in methods)]
    elif any(m in TUNED for m in methods):
        raise SystemExit(f"error: {sorted(TUNED)} need --adapter")
    if any(m in LLM_METHODS for m in methods) and backend is None:
        from agents.llm import load_llm

        backend = load_llm(tuned.llm if tuned else config.llm)  # the other rows turn the adapter off
    if any(m in ("agent-llm", "agent", *TUNED) for m in methods) and embed is None:
        from agents.retrieval import Retriever
        from eval.backends import packaged_minilm

        embed = Retriever(packaged_minilm("cpu", 64)).embed
    predictions, counts = {}, {}
    for method in methods:
        counts[method] = Counter()
        method_rng = np.random.default_rng([config.seed, [*METHODS, *TUNED].index(method)])
        predict = METHODS[TUNED.get(method, method)]
        predictions[method] = predict(
            cases, data=data, config=tuned if method in TUNED else config, backend=backend, embed=embed,
            rng=method_rng, counts=counts[method], validation=validation,
        )  # fmt: skip
        print(f"{method}: done")
    real = [s for c in cases for _, s in c["held"]]
    results = {
        "users": users,
        "validation_users": validation_users,
        "after": movielens.day(moment),
        "held_per_user": held,
        "ratings": len(real),
        "real_mean": round(float(np.mean(real)), 4),
        "seed": config.seed,
        "model": config.llm.model if any(m in LLM_METHODS for m in methods) else None,
        "adapter": trained,
        "scores": score(cases, predictions),
        "counts": {m: {k: v for k, v in c.items()} for m, c in counts.items() if c},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    (out / "table.md").write_text(table(results))
    plot(results, out / "distribution.png")
    print(table(results))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = arguments(
        "eval.sandbox.alignment",
        __doc__,
        "a LoRA adapter trained on choice and rating pairs: adds the tuned rows",
        "their held-out ratings validate the blend",
    )
    parser.add_argument("--held", type=int, default=5, help="last ratings held out per user")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=[*METHODS, *TUNED])
    args = parser.parse_args(argv)
    run(
        args.config,
        args.set,
        args.out,
        args.users,
        args.validation_users,
        args.after,
        args.held,
        args.methods,
        adapter=args.adapter,
    )


if __name__ == "__main__":
    main()
