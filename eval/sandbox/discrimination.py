"""The RecAgent paper's discrimination test, run through the simulator: can an agent tell the films its
user watched next from ones they never watched?

For each tested user (eval.sandbox.cases: drawn with the seed among users whose held-out ratings are
after ``--after``): the user's ratings in time order (ties by movie id); the last ``a`` are held out (T);
``b`` films the user never rated that existed before the user's first held-out rating (the cutoff):
rated by someone before it or released in an earlier year (a film released later would give itself
away; a film nobody had rated yet shows "no ratings yet" on the page, as a new film the user really
watched next can), join them; the method picks ``a`` of the a + b
(S); p = mean over users of |T & S| / |T|, with a 95% BCa interval over users. Everything a method sees
is older than the cutoff: the user's earlier ratings, every user's ratings before it (popularity, MF,
the counts a page shows), and the tags written before it.

Methods: ``random`` (chance is a / (a + b)); ``popularity`` (most rated before the cutoff); ``embedding``
(cosine of each candidate's text to the mean embedding of the user's watched films, MiniLM offline);
``mf`` (ALS, implicit, trained at the cutoff); ``llm`` (the bare LLM: "User N, a movie watcher" and the
last ten titles, a structured list of numbers); and the simulator's agents (eval.sandbox.cases's
VARIANTS): each tested user's agent built as the sandbox builds it, at the cutoff, shown the candidates
as a page and deciding as in the sandbox: ``agent-generate`` (a structured list of numbers),
``agent-score`` (the candidates ranked by the score of their numbers as the answer, the top a), ``tuned`` (the same
with the LoRA adapter of ``--adapter``), and the memory ablations (no short-term, no long-term; no
reflection is the full agent here: it decides at the cutoff, before any round has reflected). The score
normalisation of each
scoring row is chosen on the validation users (the best mean p over the four settings) and reported on
the test users. Paired claims: the tuned agent (or, without an adapter, the scoring agent) against
popularity and MF in every setting, with BCa intervals Bonferroni-corrected over the claims.

    python -m eval.sandbox.discrimination --config configs/sandbox/movielens.yaml --out runs/discrimination \\
        --users 100 --validation-users 50 --after 2010-01-01 [--adapter runs/sandbox/sft/choice]

Any MovieLens folder in the ml-latest-small layout works (``--set data=FOLDER``). Writes
OUT/results.json (per setting and method: p, interval, users, fallbacks, the chosen normalisation),
OUT/table.md and OUT/methods/ (each method's result as it finishes: a rerun resumes).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agents.retrieval import top_indices
from eval.metrics import bca_interval, claims_lines, paired_claim
from eval.sandbox.cases import (
    CHUNK,
    HORIZON,
    NORMALISATIONS,
    AgentRow,
    Results,
    adapter_context,
    arguments,
    check_adapter,
    config_read,
    data_digest,
    draw_users,
    page_text,
    variants,
)

SETTINGS = ((1, 5), (3, 3), (3, 7), (1, 9))
# The agent decides once, at the cutoff, before any round: reflection (every reflect_every rounds) has not
# happened yet, so that ablation is the full agent here; eval.sandbox.generation, where rounds pass, measures it.
ABLATIONS_HERE = ("no-short-term", "no-long-term")
BASELINES = ("random", "popularity", "embedding", "mf", "choice-model", "llm")
CHOICE_WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)  # the choice model's weight beside the LLM's score
PAPER = {  # the paper's Table 3 (20 MovieLens-1M users, ChatGPT), for reference
    "Embedding (paper)": (0.25, 0.55, 0.45, 0.30),
    "RecSim (paper)": (0.25, 0.53, 0.37, 0.10),
    "RecAgent (paper)": (0.55, 0.78, 0.68, 0.50),
    "real humans (paper)": (0.60, 0.81, 0.72, 0.58),
}


def make_cases(data, users: list[int], a: int, b: int, rng: np.random.Generator, skipped=None) -> list[dict]:
    """One case per user; a user with fewer than b possible distractors before the cutoff is left
    out and listed in ``skipped`` (reported in results.json). Distractors: films the user never rated
    that existed before the cutoff (data_prep.movielens.existing_films: rated by someone before it, or
    released in an earlier year)."""
    from data_prep.movielens import existing_films

    by_user = data.by_user()
    cases = []
    for user in users:
        ratings = by_user[user]  # time order, ties by movie id
        held = [r.movie for r in ratings[-a:]]
        cutoff = ratings[-a].ts
        rated = {r.movie for r in ratings}
        unseen = [m for m in existing_films(data, cutoff) if m not in rated]
        if len(unseen) < b:
            if skipped is not None:
                skipped.append(user)
            continue
        distractors = [unseen[i] for i in rng.choice(len(unseen), size=b, replace=False)]
        candidates = [*held, *distractors]
        order = rng.permutation(len(candidates))
        cases.append(
            {
                "user": user,
                "cutoff": cutoff,
                "history": [r.movie for r in ratings[:-a] if r.ts < cutoff],  # strictly older
                "held": held,
                "candidates": [candidates[i] for i in order],
            }
        )
    return cases


def pick_random(cases, a, rng, **_):
    return [
        [c["candidates"][i] for i in rng.choice(len(c["candidates"]), size=a, replace=False)] for c in cases
    ]


def pick_popularity(cases, a, data, **_):
    popularity = data.popularity()
    picks = []
    for case in cases:
        count = {m: popularity.count(m, case["cutoff"]) for m in case["candidates"]}
        picks.append(sorted(case["candidates"], key=lambda m: (-count[m], m))[:a])
    return picks


def pick_embedding(cases, a, data, encoder, **_):
    picks = []
    for case in cases:
        texts = [
            data.movies[m].text(tags_before=case["cutoff"]) for m in (*case["history"], *case["candidates"])
        ]
        vectors = np.asarray(encoder(texts), dtype=float)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        profile = vectors[: len(case["history"])].mean(axis=0)
        scores = vectors[len(case["history"]) :] @ profile
        picks.append([case["candidates"][i] for i in top_indices(scores, a)])
    return picks


def pick_mf(cases, a, data, config, rng, cache=None, **_):
    """ALS trained per user on every rating older than that user's cutoff (nothing later)."""
    from agents.sandbox.recommender import MFRecommender

    picks = []
    cache = {} if cache is None else cache
    for case in tqdm(cases, desc="mf per user", leave=False):
        key = (case["user"], case["cutoff"])  # settings with the same a share their training
        if key not in cache:
            clicks = [(r.user, r.movie) for r in data.ratings if r.ts < case["cutoff"]]
            mf = MFRecommender(list(data.movies), rng, config.recommender)
            mf.fit(clicks)
            cache[key] = (mf.scores(case["user"]), mf.item_index)
        scores, index = cache[key]
        if scores is None:  # no rating before the cutoff: popularity
            picks.append(pick_popularity([case], a, data)[0])
            continue
        candidate = np.array([scores[index[m]] for m in case["candidates"]])
        picks.append([case["candidates"][i] for i in top_indices(candidate, a)])
    return picks


def listing(case, data) -> str:
    """The candidates as a page: what the sandbox's pages show at the cutoff."""
    return page_text(data, case["candidates"], case["cutoff"])


def numbers_schema(a: int, size: int):
    from agents.llm import Constraint

    return Constraint.json_object(
        items={
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": size},
            "minItems": a,
            "maxItems": a,
        }
    )


def numbers_instruction(a: int) -> str:
    return f"Which {a} of these movies will you watch next? Give their numbers."


def parse_numbers(cases, answers, a, rng, counts) -> list[list[int]]:
    """The numbers of a structured answer valid under numbers_schema, each number once; an answer that
    fails the schema is replaced at random and one that repeats a number is topped up at random, both
    counted."""
    picks = []
    for case, answer in zip(cases, answers, strict=True):
        size = len(case["candidates"])
        value = numbers_schema(a, size).parse(answer)
        valid = list(dict.fromkeys(int(n) for n in value["items"])) if value else []  # 2.0 is an integer
        if len(valid) < a:
            counts["fallbacks"] += 1
            rest = [k for k in range(1, size + 1) if k not in valid]
            valid += [rest[i] for i in rng.choice(len(rest), size=a - len(valid), replace=False)]
        picks.append([case["candidates"][k - 1] for k in valid])
    return picks


def pick_llm(cases, a, data, backend, rng, counts, history_titles: int = 10, **_):
    """The bare LLM: no profile, no memory; the user's last titles and the page."""
    from agents.llm import Sampling
    from data_prep.prompt import build_sandbox_messages

    prompts = [
        build_sandbox_messages(
            f"User {case['user']}, a movie watcher",
            [f"I watched {data.movies[m].title}" for m in case["history"][-history_titles:]],
            numbers_instruction(a),
            f"The movies:\n{listing(case, data)}",
        )
        for case in cases
    ]
    sampling = Sampling(max_new_tokens=32, seed=int(rng.integers(2**31 - 1)))
    answers = []
    for start in tqdm(range(0, len(prompts), CHUNK), desc="llm", leave=False):
        chunk = prompts[start : start + CHUNK]
        answers += [
            x.text for x in backend.generate(chunk, sampling, numbers_schema(a, len(cases[0]["candidates"])))
        ]
    return parse_numbers(cases, answers, a, rng, counts)


def model_scores(choice, data, cases: list[dict]) -> list[np.ndarray]:
    """The fitted choice model's log-odds of each case's candidates, as of its cutoff."""
    from agents.sandbox.choice import as_of, past_of

    return [
        choice.score(
            past_of(data, c["user"], c["cutoff"]), c["candidates"], *as_of(data, c["candidates"], c["cutoff"])
        )
        for c in cases
    ]


def pick_choice_model(cases, a, data, choice, **_):
    """The choice model alone (agents/sandbox/choice.py), fitted on real choices before --after."""
    return top(cases, model_scores(choice, data, cases), a)


METHODS = {
    "random": pick_random,
    "popularity": pick_popularity,
    "embedding": pick_embedding,
    "mf": pick_mf,
    "llm": pick_llm,
    "choice-model": pick_choice_model,
}


def agent_scores(row: AgentRow, cases: list[dict]) -> dict[str, list[np.ndarray]]:
    """Every candidate's score under each normalisation, each user's agent at the cutoff."""
    agents = row.agents(cases)
    moments = [c["cutoff"] for c in cases]
    return row.scores(agents, [c["candidates"] for c in cases], moments, moments, [0] * len(cases))


def agent_numbers(row: AgentRow, cases: list[dict], a: int) -> list[list[int]]:
    """The agent's structured answer: ``a`` numbers of the page."""
    from agents.sandbox.agent import watch_messages

    agents = row.agents(cases)
    answers = []
    with adapter_context(row.backend, row.uses_adapter):
        for start in tqdm(range(0, len(cases), CHUNK), desc=row.name, leave=False):
            chunk = cases[start : start + CHUNK]
            prompts = [
                watch_messages(g, listing(c, row.data), c["cutoff"], 0, numbers_instruction(a))
                for g, c in zip(agents[start : start + CHUNK], chunk, strict=True)
            ]
            names = [f"User {c['user']}" for c in chunk]
            answers += row.decider.ask(
                "watch", names, prompts, numbers_schema(a, len(cases[0]["candidates"]))
            )
    return parse_numbers(cases, answers, a, row.rng, row.counts)


def top(cases, scores: list[np.ndarray], a: int) -> list[list[int]]:
    return [[c["candidates"][i] for i in top_indices(s, a)] for c, s in zip(cases, scores, strict=True)]


def hits(cases, picks) -> np.ndarray:
    return np.array(
        [len(set(c["held"]) & set(p)) / len(c["held"]) for c, p in zip(cases, picks, strict=True)]
    )


def score(cases, picks) -> dict:
    values = hits(cases, picks)
    low, high, _ = bca_interval(values)
    return {
        "p": round(float(values.mean()), 4),
        "ci95": [round(low, 4), round(high, 4)],
        "users": len(values),
        "hits": values.tolist(),
    }


def run_agent_row(row: AgentRow, cases: dict, validation: dict, choice=None) -> dict:
    """One agent row over the settings: a scoring row chooses its normalisation and the weight of the
    fitted choice model on the validation users (best mean p over the settings; ties: the smaller
    weight, then sum, mean, pmi) and reports the test users with them."""
    out = {"settings": {}}
    if row.config.decision.mode == "generate":
        for key, test_cases in cases.items():
            a = int(key.split(",")[0])
            out["settings"][key] = score(test_cases, agent_numbers(row, test_cases, a))
        out["fallbacks"] = row.counts["fallbacks"]
        return out
    weights = CHOICE_WEIGHTS if choice is not None else (0.0,)

    def combined(scored, model, norm, w):
        return [llm + w * m for llm, m in zip(scored[norm], model, strict=True)]

    def model_for(these, scored):
        """The choice model's log-odds of each case's candidates (zeros without a model)."""
        if choice is None:
            return [0 * s for s in scored["sum"]]
        return model_scores(choice, row.data, these)

    options = [(w, norm) for w in weights for norm in NORMALISATIONS]
    chosen_on: dict[str, dict] = {}
    for key, val_cases in validation.items():
        a = int(key.split(",")[0])
        scored = agent_scores(row, val_cases)
        model = model_for(val_cases, scored)
        chosen_on[key] = {
            f"{norm},{w:g}": float(
                hits(val_cases, top(val_cases, combined(scored, model, norm, w), a)).mean()
            )
            for w, norm in options
        }
    best_w, best_norm = max(
        options,
        key=lambda o: (
            np.mean([v[f"{o[1]},{o[0]:g}"] for v in chosen_on.values()]),
            -o[0],
            -NORMALISATIONS.index(o[1]),
        ),
    )
    # the LLM's scores alone (weight 0, its own normalisation chosen on validation): what the LLM adds
    alone_norm = max(
        NORMALISATIONS,
        key=lambda n: (np.mean([v[f"{n},0"] for v in chosen_on.values()]), -NORMALISATIONS.index(n)),
    )
    out["llm_alone"] = {"normalisation": alone_norm, "settings": {}}
    for key, test_cases in cases.items():
        a = int(key.split(",")[0])
        scored = agent_scores(row, test_cases)
        model = model_for(test_cases, scored)
        out["settings"][key] = score(
            test_cases, top(test_cases, combined(scored, model, best_norm, best_w), a)
        )
        alone = score(test_cases, top(test_cases, scored[alone_norm], a))
        out["llm_alone"]["settings"][key] = {k: alone[k] for k in ("p", "ci95", "users")}
    out.update(normalisation=best_norm, choice_weight=best_w, validation_p=chosen_on)
    return out


def cases_for(data, users, seed: int) -> tuple[dict, dict]:
    """Each setting's cases (each its own generator from the seed) and the users left out."""
    cases, skipped = {}, {}
    for a, b in SETTINGS:
        left: list[int] = []
        cases[f"{a},{b}"] = make_cases(data, users, a, b, np.random.default_rng([seed, a, b]), left)
        skipped[f"{a},{b}"] = left
    return cases, skipped


def claims(results: dict, subject: str) -> list[dict]:
    """``subject`` minus popularity and minus MF in every setting, paired over users, Bonferroni over
    the claims made."""
    out = []
    pairs = [
        (key, other)
        for key, row in results["settings"].items()
        for other in ("popularity", "mf")
        if subject in row and other in row
    ]
    confidence = 1 - 0.05 / max(len(pairs), 1)
    for key, other in pairs:
        row = results["settings"][key]
        claim = paired_claim(row[subject]["hits"], row[other]["hits"], confidence)
        out.append({"claim": f"{subject} > {other}", "setting": key, **claim})
    return out


def run(
    config_path, set_overrides, out: Path, n_users: int, n_validation: int, after: str, methods: list[str],
    adapter: str | None = None, backend=None, encoder=None, embed=None, overwrite: bool = False,
) -> dict:  # fmt: skip
    from agents.sandbox.config import load_config
    from data_prep import movielens

    config = load_config(config_path, [*set_overrides, "temperature=0"])
    data = movielens.load(config.data)
    moment = movielens.parse_moment(after, data)
    trained = check_adapter(adapter, moment, config)
    rows = variants(adapter, ABLATIONS_HERE)
    methods = methods or [*BASELINES, *rows]
    wanted = [m for m in methods if m in BASELINES or m in rows]
    left_out = [] if adapter else [m for m in variants("adapter", ABLATIONS_HERE) if m.startswith("tuned")]
    test_users, val_users = draw_users(
        data, moment, HORIZON, config.min_history, n_users, n_validation, config.seed
    )
    inputs = {
        "data": data_digest(config.data),
        "config": config_read(config),
        "users": test_users,
        "validation_users": val_users,
        "after": moment,
    }
    results_store = Results(out, inputs, overwrite)
    digest = fingerprint_adapter(adapter)

    def made_with(method: str) -> str | None:
        """The adapter digest a method's result must have been made with (None: no adapter)."""
        return digest if method in rows and rows[method][1] else None

    cases, skipped = cases_for(data, test_users, config.seed)
    validation, _ = cases_for(data, val_users, config.seed + 1)
    needs_llm = [
        m
        for m in wanted
        if m not in ("random", "popularity", "embedding", "mf", "choice-model")
        and results_store.get(m, made_with(m)) is None
    ]
    if needs_llm and backend is None:
        from agents.llm import load_llm

        config.llm.adapter = adapter
        backend = load_llm(config.llm)
    if "embedding" in wanted and encoder is None and results_store.get("embedding") is None:
        from eval.backends import packaged_minilm

        encoder = packaged_minilm("cpu", 64)
    todo = [m for m in wanted if results_store.get(m, made_with(m)) is None]
    scoring = [m for m in todo if m == "choice-model" or (m in rows and "decision.mode=score" in rows[m][0])]
    if embed is None and (any(m in rows for m in needs_llm) or scoring):
        from agents.retrieval import Retriever
        from eval.backends import packaged_minilm

        embed = Retriever(encoder or packaged_minilm("cpu", 64)).embed
    choice = None
    if scoring:  # the choice model, fitted on real choices strictly before --after (its own generator)
        from agents.sandbox.choice import fit_on_data

        choice = fit_on_data(
            data, moment, embed, np.random.default_rng([config.seed, 7]), config.decision.choice_pages
        )
    mf_cache: dict = {}
    for method in wanted:
        if results_store.get(method, made_with(method)) is not None:
            print(f"{method}: done earlier, kept ({results_store.path(method)})")
            continue
        if method in rows:
            overrides, uses_adapter = rows[method]
            row = AgentRow(
                method, overrides, uses_adapter, config_path, set_overrides, data, backend, embed, config.seed
            )
            value = run_agent_row(row, cases, validation, choice)
            value["counts"] = {k: v for k, v in row.counts.items() if k != "fallbacks"}
        else:
            value = {"settings": {}}
            for key, setting_cases in cases.items():
                a, b = map(int, key.split(","))
                counts: Counter = Counter()
                method_rng = np.random.default_rng([config.seed, a, b, list(METHODS).index(method)])
                with adapter_context(backend, False):  # the bare LLM is the base model
                    picks = METHODS[method](
                        setting_cases, a, data=data, rng=method_rng, encoder=encoder, backend=backend, config=config,
                        counts=counts, cache=mf_cache, choice=choice,
                    )  # fmt: skip
                value["settings"][key] = {**score(setting_cases, picks), **dict(counts)}
        if method == "choice-model":  # kept with the row, so a resumed run still reports them
            value["fitted_before"] = movielens.day(moment)
            value["coefficients"] = choice.coefficients()
        value["adapter_sha256"] = made_with(method)
        results_store.put(method, value)
        print(f"{method}: " + ", ".join(f"({k}) {v['p']:.2f}" for k, v in value["settings"].items()))
    results = {
        "users": test_users,
        "validation_users": val_users,
        "after": movielens.day(moment),
        "seed": config.seed,
        "adapter": trained,
        "left_out": {
            **dict.fromkeys(left_out, "needs --adapter"),
            f"{'tuned' if adapter else 'agent-score'}/no-reflection": "the same as the full agent here: it "
            "decides at its cutoff, before any reflection (eval.sandbox.generation measures it)",
        },
        "settings": {},
        "methods": {},
    }
    for key in cases:
        results["settings"][key] = {
            "chance": round(int(key.split(",")[0]) / sum(map(int, key.split(","))), 4),
            "users_without_enough_distractors": skipped[key],
        }
    for method in wanted:
        value = results_store.get(method, made_with(method))
        results["methods"][method] = {k: v for k, v in value.items() if k != "settings"}
        for key, cell in value["settings"].items():
            results["settings"][key][method] = cell
    subject = "tuned" if "tuned" in wanted else "agent-score"
    results["claims"] = claims(results, subject)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "table.md").write_text(table(results, wanted))
    print(table(results, wanted))
    return results


def fingerprint_adapter(adapter: str | None) -> str | None:
    from data_prep.fingerprint import adapter_digest

    return adapter_digest(adapter)


def table(results: dict, methods: list[str]) -> str:
    keys = [f"{a},{b}" for a, b in SETTINGS]
    first = results["settings"][keys[0]]
    scored = first[methods[0]]["users"] if methods else 0
    lines = [
        f"| method ({scored} test users, {len(first['users_without_enough_distractors'])} left out; "
        f"held-out ratings after {results['after']}) | " + " | ".join(f"(a,b)=({k})" for k in keys) + " |",
        "|---|" + "---|" * len(keys),
        "| chance a/(a+b) | " + " | ".join(f"{results['settings'][k]['chance']:.2f}" for k in keys) + " |",
    ]
    for method in methods:
        cells = []
        for k in keys:
            r = results["settings"][k][method]
            cells.append(f"{r['p']:.2f} [{r['ci95'][0]:.2f}, {r['ci95'][1]:.2f}]")
        chosen = results["methods"][method]
        note = (
            f"{chosen['normalisation']}, choice model x{chosen.get('choice_weight', 0):g}"
            if "normalisation" in chosen
            else ""
        )
        lines.append(f"| {method}{f' ({note})' if note else ''} | " + " | ".join(cells) + " |")
        alone = chosen.get("llm_alone")
        if alone and chosen.get("choice_weight", 0):
            cells = [
                f"{c['p']:.2f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]"
                for c in (alone["settings"][k] for k in keys)
            ]
            lines.append(
                f"| {method}, its LLM alone ({alone['normalisation']}) | " + " | ".join(cells) + " |"
            )
    for method, why in results["left_out"].items():
        lines.append(f"| {method} | left out: {why} |" + " |" * (len(keys) - 1))
    for name, values in PAPER.items():
        lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    lines += claims_lines(results["claims"], {"setting": lambda c: f"({c['setting']})"})
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = arguments(
        "eval.sandbox.discrimination",
        __doc__,
        "a LoRA adapter from train.sft on data_prep.choice_pairs: the tuned rows",
        "drawn apart from the tested users: each row's normalisation is chosen on them",
    )
    all_methods = list(
        dict.fromkeys([*BASELINES, *variants("adapter", ABLATIONS_HERE), *variants(None, ABLATIONS_HERE)])
    )
    parser.add_argument("--methods", nargs="+", choices=all_methods, help="default: every one that can run")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    run(
        args.config, args.set, args.out, args.users, args.validation_users, args.after, args.methods,
        args.adapter, overwrite=args.overwrite,
    )  # fmt: skip


if __name__ == "__main__":
    main()
