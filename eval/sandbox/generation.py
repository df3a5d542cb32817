"""The RecAgent paper's generation test, run through the simulator: from a user's cutoff, does the agent
watch, page after page, what the user really watched next?

For each tested user (eval.sandbox.cases: the same users as eval.sandbox.discrimination and eval.sandbox.alignment):
the cutoff is their ``steps``-th last rating (ties by movie id), and their real next ``steps`` films are
the truth. The configured recommender (``recommender.kind``, ``page_size``, ``rec_random_k``), over the films that
existed at the cutoff and trained on every rating older than it, shows ``steps`` pages one after another, as a visit's "next
page" does: each page the next films of its ranking for the user that were not shown before, with
``rec_random_k`` random unseen films injected; the user's films before the cutoff are never shown. The
pages are the same for every method, and each method watches one film per page:

- ``random``; ``popularity`` (the most rated before the cutoff); ``mf`` (the highest ALS score at the
  cutoff: the recommender's own choice);
- the simulator's agents (score mode): each user's agent built at the cutoff, as the sandbox builds
  it, choosing by score (greedy), rating the film (the star model as of the cutoff), and remembering it
  as a sandbox round does (the LLM compresses the observation, records are enhanced and promoted);
  each page is a round, and every ``memory.reflect_every`` rounds the memory forgets and reflects.
  ``agent-score`` runs on the base model, ``tuned`` with ``--adapter``, and the memory ablations (no
  short-term, no long-term, no reflection) on the tuned agent (the scoring agent without an adapter).

Per user: hits = |watched & real next|, recall = hits / steps, hit = hits > 0; reported with 95% BCa
intervals over users, beside the ceiling (the share of the real next films that any page showed).
Paired claims: the tuned agent (else the scoring agent) against popularity and MF on recall,
Bonferroni-corrected. A page's counts and tags are those of the cutoff (a later moment would show the
user's own future ratings). Each agent row scores with the normalisation eval.sandbox.discrimination chose for
it on its validation users (``--choices-from`` its results.json), else the config's.

    python -m eval.sandbox.generation --config configs/sandbox/movielens.yaml --out runs/generation --users 100 \\
        --after 2010-01-01 [--adapter runs/sandbox/sft/choice] \
        [--choices-from runs/discrimination/results.json]

Writes OUT/results.json, OUT/table.md and OUT/methods/ (each method as it finishes: a rerun resumes).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from eval.metrics import bca_interval, claims_lines, paired_claim
from eval.sandbox.cases import (
    HORIZON,
    AgentRow,
    Results,
    adapter_context,
    arguments,
    check_adapter,
    config_read,
    data_digest,
    draw_users,
    variants,
)

BASELINES = ("random", "popularity", "mf", "choice-model")
DAY = 86400


def make_cases(data, users: list[int], steps: int) -> list[dict]:
    by_user = data.by_user()
    cases = []
    for user in users:
        ratings = by_user[user]
        cutoff = ratings[-steps].ts
        cases.append({"user": user, "cutoff": cutoff, "next": [r.movie for r in ratings[-steps:]]})
    return cases


def make_pages(data, cases: list[dict], config, steps: int, seed: int) -> None:
    """Each case's pages (case["pages"]) and MF scores at the cutoff (case["mf"]: film -> score)."""
    from agents.sandbox.recommender import Feed, MFRecommender
    from data_prep.movielens import existing_films

    fits: dict[int, tuple] = {}
    for case in tqdm(cases, desc="pages (a recommender per cutoff)", leave=False):
        rng = np.random.default_rng([seed, case["user"]])
        if case["cutoff"] not in fits:
            items = existing_films(data, case["cutoff"])  # the films of the cutoff: none released later
            clicks = [(r.user, r.movie) for r in data.ratings if r.ts < case["cutoff"]]
            feed = Feed(config.recommender, items, rng)
            feed.train(clicks)
            mf = feed.recommender
            if not isinstance(mf, MFRecommender):
                mf = MFRecommender(items, rng, config.recommender)
                mf.fit(clicks)
            fits[case["cutoff"]] = (feed, mf)
        feed, mf = fits[case["cutoff"]]
        feed.rng = rng  # the injected films: drawn per user from the seed
        seen = {r.movie for r in data.history(case["user"], case["cutoff"])}
        pages = []
        for _ in range(steps):
            page, _ = feed.page(case["user"], seen | {m for p in pages for m in p})
            pages.append(page)
        case["pages"] = pages
        scores = mf.scores(case["user"])
        case["mf"] = (
            {m: float(scores[mf.item_index[m]]) for p in pages for m in p} if scores is not None else None
        )


def walk_random(cases, rng, **_) -> list[list[int]]:
    return [[p[int(rng.integers(len(p)))] for p in c["pages"]] for c in cases]


def walk_popularity(cases, data, **_) -> list[list[int]]:
    popularity = data.popularity()
    return [[min(p, key=lambda m: (-popularity.count(m, c["cutoff"]), m)) for p in c["pages"]] for c in cases]


def walk_mf(cases, data, **_) -> list[list[int]]:
    out = []
    for case in cases:
        if case["mf"] is None:  # no rating before the cutoff: popularity
            out += walk_popularity([case], data)
            continue
        out.append([max(p, key=lambda m: (case["mf"][m], -m)) for p in case["pages"]])
    return out


def walk_choice_model(cases, data, choice, **_) -> list[list[int]]:
    """The fitted choice model alone (agents/sandbox/choice.py): the best film of each page for the
    user's past before the cutoff."""
    from agents.sandbox.choice import as_of, past_of

    out = []
    for case in cases:
        past = past_of(data, case["user"], case["cutoff"])
        out.append(
            [p[int(np.argmax(choice.score(past, p, *as_of(data, p, case["cutoff"]))))] for p in case["pages"]]
        )
    return out


WALKS = {
    "random": walk_random,
    "popularity": walk_popularity,
    "mf": walk_mf,
    "choice-model": walk_choice_model,
}


def walk_agent(row: AgentRow, cases: list[dict], steps: int, choice=None) -> list[list[int]]:
    """The simulator's agents page by page: choose by score (with the fitted choice model's log-odds at
    the row's ``decision.choice_weight``: the agent's past is its history and its watches so far), rate,
    remember; forget and reflect every ``reflect_every`` rounds."""
    from agents.sandbox.agent import remember
    from agents.sandbox.choice import agent_past, as_of
    from agents.sandbox.memory import reflect_all
    from agents.sandbox.rating import Rater
    from data_prep.movielens import day
    from data_prep.prompt import watched_line

    agents = row.agents(cases)
    rater = Rater(row.data.ratings, row.decider, row.config, row.data.movies)  # predictions as of each cutoff
    norm = row.config.decision.normalisation
    cutoffs = [c["cutoff"] for c in cases]
    watched: list[list[int]] = [[] for _ in cases]
    with adapter_context(row.backend, row.uses_adapter):
        for step in tqdm(range(steps), desc=f"{row.name}: pages", leave=False):
            clocks = [int(t + step * row.config.round_days * DAY) for t in cutoffs]
            pages = [c["pages"][step] for c in cases]
            scores = row.scores(agents, pages, cutoffs, clocks, [step] * len(cases), (norm,))[norm]
            weight = row.config.decision.choice_weight
            if weight and choice is not None:
                scores = [
                    s + weight * choice.score(agent_past(a), p, *as_of(row.data, p, t))
                    for s, a, p, t in zip(scores, agents, pages, cutoffs, strict=True)
                ]
            picks = [
                page[row.decider.draw(s)] for page, s in zip(pages, scores, strict=True)
            ]  # greedy: temperature 0
            stars, _ = rater.rate(agents, picks, cutoffs, [step] * len(cases))
            for agent, pick, value, clock, mine in zip(agents, picks, stars, clocks, watched, strict=True):
                mine.append(pick)
                agent.rated.append([pick, value, step])
                agent.inbox.append(watched_line(row.data.movies[pick].text(), value, day(clock)))
            remember(agents, row.model, step)
            if (step + 1) % row.config.memory.reflect_every == 0:
                memories = [a.memory for a in agents]
                for memory in memories:
                    memory.forget(step)
                reflect_all(memories, step)
    row.counts.update(
        {f"memory:{k}": v for k, v in sum((Counter(a.memory.counts) for a in agents), Counter()).items()}
    )
    row.counts.update({f"rating:{k}": v for k, v in rater.counts.items()})
    return watched


def score(cases: list[dict], walks: list[list[int]], steps: int) -> dict:
    hits = np.array([len(set(w) & set(c["next"])) for c, w in zip(cases, walks, strict=True)], dtype=float)
    out = {"users": len(cases), "recall_per_user": (hits / steps).tolist()}
    for name, values in (("recall", hits / steps), ("hit_rate", (hits > 0).astype(float))):
        low, high, _ = bca_interval(values)
        out[name] = {"mean": round(float(values.mean()), 4), "ci95": [round(low, 4), round(high, 4)]}
    return out


def ceiling(cases: list[dict]) -> float:
    """The share of the real next films that any page showed: no method can do better."""
    return round(
        float(
            np.mean(
                [len({m for p in c["pages"] for m in p} & set(c["next"])) / len(c["next"]) for c in cases]
            )
        ),
        4,
    )


def claims(results: dict, subject: str) -> list[dict]:
    others = [m for m in ("popularity", "mf") if m in results["methods"]]
    if subject not in results["methods"] or not others:
        return []
    confidence = 1 - 0.05 / len(others)
    out = []
    methods = results["methods"]
    for other in others:
        claim = paired_claim(
            methods[subject]["recall_per_user"], methods[other]["recall_per_user"], confidence
        )
        out.append({"claim": f"{subject} > {other} (recall)", **claim})
    return out


def ablations(results: dict, subject: str) -> list[dict]:
    """What each memory component adds to ``subject``: its recall minus the ablated row's, per user, with a
    paired BCa interval (Bonferroni over the ablations present), and how many users' walks changed at all
    (recall counts only hits, so a walk can change without its recall changing)."""
    rows = [m for m in results["methods"] if m.startswith(f"{subject}/no-")]
    if subject not in results["methods"] or not rows:
        return []
    confidence = 1 - 0.05 / len(rows)
    full = results["methods"][subject]
    out = []
    for row in rows:
        other = results["methods"][row]
        claim = paired_claim(full["recall_per_user"], other["recall_per_user"], confidence)
        changed = sum(a != b for a, b in zip(full.get("walks", []), other.get("walks", []), strict=False))
        out.append({"claim": row, **claim, "walks_changed": changed})
    return out


def run(
    config_path, set_overrides, out: Path, n_users: int, n_validation: int, after: str, steps: int,
    methods: list[str] | None = None, adapter: str | None = None, backend=None, embed=None, overwrite: bool = False,
    choices_from: Path | None = None,
) -> dict:  # fmt: skip
    from agents.sandbox.config import as_dict, load_config
    from data_prep import movielens
    from data_prep.fingerprint import adapter_digest

    if not 1 <= steps <= HORIZON:
        raise SystemExit(
            f"error: --steps must be 1 to {HORIZON} (the tests' users have {HORIZON} ratings after their cutoff)"
        )
    config = load_config(config_path, [*set_overrides, "temperature=0"])
    data = movielens.load(config.data)
    moment = movielens.parse_moment(after, data)
    trained = check_adapter(adapter, moment, config)
    rows = {name: value for name, value in variants(adapter).items() if name != "agent-generate"}
    if choices_from:  # each row's settings as the discrimination test chose them on validation users
        chosen = json.loads(Path(choices_from).read_text())["methods"]
        for name, (overrides, uses) in rows.items():
            if chosen.get(name, {}).get("normalisation"):
                settings = [f"decision.normalisation={chosen[name]['normalisation']}"]
                settings.append(f"decision.choice_weight={chosen[name].get('choice_weight', 0)}")
                rows[name] = ([*overrides, *settings], uses)
    methods = methods or [*BASELINES, *rows]
    wanted = [m for m in methods if m in BASELINES or m in rows]
    left_out = [] if adapter else [m for m in variants("adapter") if m.startswith("tuned")]
    users, _ = draw_users(data, moment, HORIZON, config.min_history, n_users, n_validation, config.seed)
    inputs = {
        "data": data_digest(config.data),
        "config": config_read(config),
        "users": users,
        "after": moment,
        "steps": steps,
        "rows": {name: overrides for name, (overrides, _) in rows.items()},
    }
    store = Results(out, inputs, overwrite)
    digest = adapter_digest(adapter)

    def made_with(method: str) -> str | None:
        """The adapter digest a method's result must have been made with (None: no adapter)."""
        return digest if method in rows and rows[method][1] else None

    cases = make_cases(data, users, steps)
    make_pages(data, cases, config, steps, config.seed)
    todo = [m for m in wanted if m in rows and store.get(m, made_with(m)) is None]
    choice = None
    if any(m == "choice-model" or m in todo for m in wanted if store.get(m, made_with(m)) is None):
        from agents.retrieval import Retriever
        from agents.sandbox.choice import fit_on_data
        from eval.backends import packaged_minilm

        embed = embed or Retriever(packaged_minilm("cpu", 64)).embed
        choice = fit_on_data(
            data, moment, embed, np.random.default_rng([config.seed, 7]), config.decision.choice_pages
        )
    if todo and backend is None:
        from agents.llm import load_llm

        config.llm.adapter = adapter
        backend = load_llm(config.llm)
    if todo and embed is None:
        from agents.retrieval import Retriever
        from eval.backends import packaged_minilm

        embed = Retriever(packaged_minilm("cpu", 64)).embed
    for method in wanted:
        if store.get(method, made_with(method)) is not None:
            print(f"{method}: done earlier, kept ({store.path(method)})")
            continue
        if method in rows:
            overrides, uses_adapter = rows[method]
            row = AgentRow(
                method, overrides, uses_adapter, config_path, set_overrides, data, backend, embed, config.seed
            )
            walks = walk_agent(row, cases, steps, choice)
            value = {
                **score(cases, walks, steps),
                "counts": dict(row.counts),
                "normalisation": row.config.decision.normalisation,
                "choice_weight": row.config.decision.choice_weight,
            }
        else:
            rng = np.random.default_rng([config.seed, list(WALKS).index(method)])
            walks = WALKS[method](cases, data=data, rng=rng, choice=choice)
            value = score(cases, walks, steps)
        value["walks"] = walks
        value["adapter_sha256"] = made_with(method)
        store.put(method, value)
        print(f"{method}: recall {value['recall']['mean']:.3f}, hit rate {value['hit_rate']['mean']:.3f}")
    results = {
        "users": users,
        "after": movielens.day(moment),
        "steps": steps,
        "seed": config.seed,
        "adapter": trained,
        "recommender": as_dict(config)["recommender"],
        "ceiling_recall": ceiling(cases),
        "left_out": dict.fromkeys(left_out, "needs --adapter"),
        "methods": {m: store.get(m, made_with(m)) for m in wanted},
    }
    results["claims"] = claims(results, "tuned" if "tuned" in wanted else "agent-score")
    results["ablations"] = ablations(results, "tuned" if "tuned" in wanted else "agent-score")
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(table(results))
    print(table(results))
    return results


def table(results: dict) -> str:
    first = next(iter(results["methods"].values()))
    lines = [
        f"| method ({first['users']} test users, {results['steps']} pages of {results['recommender']['page_size']} "
        f"from {results['recommender']['kind']}, real next {results['steps']} films after {results['after']}) | recall | hit rate |",
        "|---|---|---|",
    ]
    for method, r in results["methods"].items():
        cells = [
            f"{r[k]['mean']:.3f} [{r[k]['ci95'][0]:.3f}, {r[k]['ci95'][1]:.3f}]"
            for k in ("recall", "hit_rate")
        ]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    for method, why in results["left_out"].items():
        lines.append(f"| {method} | left out: {why} | |")
    lines.append(f"| ceiling (the real next films any page showed) | {results['ceiling_recall']:.3f} | |")
    lines += claims_lines(results["claims"])
    lines += claims_lines(
        results.get("ablations", []),
        title="what the memory part adds (full minus ablated, recall)",
        after={"users whose walk changed": lambda a: f"{a['walks_changed']} of {a['users']}"},
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = arguments(
        "eval.sandbox.generation",
        __doc__,
        "a LoRA adapter from train.sft: the tuned rows",
        "drawn (and left out) as in the other tests",
    )
    parser.add_argument("--steps", type=int, default=HORIZON)
    names = list(dict.fromkeys([*BASELINES, *variants("adapter"), *variants(None)]))
    parser.add_argument("--methods", nargs="+", choices=[n for n in names if n != "agent-generate"])
    parser.add_argument(
        "--choices-from",
        type=Path,
        help="eval.sandbox.discrimination's results.json: each row's normalisation",
    )
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    run(
        args.config, args.set, args.out, args.users, args.validation_users, args.after, args.steps, args.methods,
        args.adapter, overwrite=args.overwrite, choices_from=args.choices_from,
    )  # fmt: skip


if __name__ == "__main__":
    main()
