"""Sandbox figures a person can rerun.

    python -m bench.sandbox_bench pareto       # the activity law fitted to MovieLens per-user rating counts
    python -m bench.sandbox_bench memory       # how long a memory record lives, per forget_scale
    python -m bench.sandbox_bench efficiency   # wall time per round against the number of agents
    python -m bench.sandbox_bench efficiency --real --agents 1 10 100 --max-single 10   # SmolLM2 offline
    python -m bench.sandbox_bench score        # score mode's cost per candidate against generation
    python -m bench.sandbox_bench cocoon --rounds 10 --agents 20   # exposure entropy, MF, +/- injection

``pareto``: alpha of a Pareto law fitted by maximum likelihood (x_min = the smallest count) to the
number of ratings per user, with the Kolmogorov-Smirnov distance of the data from the fitted law, and
the same for the counts above a few larger x_min (the tail is where a power law is usually judged).

``efficiency``: one round's wall time for 1 to 1,000 agents (every agent active) against a fake backend
with a fixed latency per call plus a cost per answered row, batched (the world's one call per step for
all agents) and one request at a time (the same answers, each its own call), side by side in one run;
LLM calls per agent per round. The fake stands for a remote server; the sentence encoder is replaced
by a hashed bag of words and the recommender is popularity, so the figures are the world's own
overhead plus the modelled LLM time. With ``--real`` the world is the shipped config's (MovieLens
profiles, ALS, MiniLM memories) and the LLM is its offline model on this machine: the same round,
with prompt and answer tokens per agent.

``memory``: forgetting in the memory's own code (memory.Memory.forget): 20,000 identical long-term
records per row, a forgetting pass every ``reflect_every`` rounds, and the round by which half of them
are gone, for fresh records of three importances and for a history record a year old, per
``forget_scale`` (the history's scale a tenth of it, as shipped).

``score``: one page decision of the shipped config's agents (the real offline model, greedy) made by
generation (the page step's JSON answer) and by score (each film's number on the page scored), side by
side, on the same pages of 6 and 10 films: seconds per decision and per candidate.

``cocoon``: information cocoons. The shipped config's world with the trained MF, retrained on the
simulated clicks every round, run with no random injection and with ``--inject`` random items per page,
side by side from the same seed; per round the genre entropy of everything shown (all agents) and the
mean over agents of the entropy of what each was shown. ``--backend scripted`` replaces the LLM with
a user who always watches the first item on the page (the recommender's feedback loop alone, fast).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
from tqdm import tqdm

from agents.llm import Answer
from agents.retrieval import hashed_bag_of_words
from agents.sandbox.social import fit_pareto
from data_prep import movielens


def pareto(args) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = movielens.load(args.data)
    counts = np.array(sorted(Counter(r.user for r in data.ratings).values()))
    rows = {}
    for xmin in (counts.min(), 50, 100, 200):
        tail = counts[counts >= xmin]
        rows[int(xmin)] = fit_pareto(tail)
    print(json.dumps(rows, indent=1))
    # the goodness-of-fit figure: the data's survival function against each fitted law, log-log
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.loglog(counts, 1 - np.arange(len(counts)) / len(counts), ".", ms=3, color="k", label="data")
    for xmin, fit in rows.items():
        share = (counts >= xmin).mean()  # the fitted tail drawn at its place in the whole sample
        x = np.geomspace(xmin, counts.max(), 50)
        ax.loglog(x, share * (x / xmin) ** -fit["alpha"], label=f"x_min {xmin}: alpha {fit['alpha']:.2f}")
    ax.set_xlabel("ratings per user")
    ax.set_ylabel("share of users with at least x")
    ax.set_title("ml-latest-small: per-user activity and fitted Pareto laws")
    ax.legend(fontsize=8)
    fig.tight_layout()
    args.out.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out / "pareto.png", dpi=110)
    (args.out / "pareto.json").write_text(json.dumps(rows, indent=1))
    print(f"-> {args.out}/pareto.json, pareto.png")
    return rows


class FakeBackend:
    """Valid answers by rule, after sleeping latency + per_row * rows (a remote server's cost)."""

    def __init__(self, latency: float, per_row: float):
        self.latency, self.per_row, self.calls = latency, per_row, 0

    def generate(self, conversations, sampling, constraint=None):
        self.calls += 1
        time.sleep(self.latency + self.per_row * len(conversations))
        return [Answer(self.answer(c, constraint), constrained=True) for c in conversations]

    @staticmethod
    def answer(conversation, constraint) -> str:
        name = conversation[0]["content"].removeprefix("You are ").split(";")[0]
        turn = int(hashlib.md5(name.encode()).hexdigest(), 16) % 3
        if constraint.kind == "choice":
            return ("recommender", "social", "nothing")[turn]
        keys = set(json.loads(constraint.schema)["properties"])
        if "summary" in keys:
            return json.dumps({"summary": conversation[-1]["content"][-60:], "importance": 7})
        if "items" in keys:
            return json.dumps({"action": "watch", "items": [1], "query": "", "feeling": "fine"})
        if "action" in keys:
            return json.dumps({"action": ("chat", "post")[turn % 2], "contact": 1, "text": "hello"})
        if "insight" in keys:
            return json.dumps({"insight": "a pattern"})
        return json.dumps({"say": "sure"})


class OneAtATime:
    """The same backend asked one conversation per call."""

    def __init__(self, backend):
        self.backend = backend

    def generate(self, conversations, sampling, constraint=None):
        return [self.backend.generate([c], sampling, constraint)[0] for c in conversations]


def one_round(data, n: int, backend, seed: int = 0) -> tuple[float, int]:
    from agents.sandbox.config import load_config
    from agents.sandbox.profiles import Profile
    from agents.sandbox.social import generate_graph
    from agents.sandbox.world import World

    config = load_config(None, ["recommender.kind=popularity", "activity.pareto_xmin=1", f"seed={seed}"])
    rng = np.random.default_rng(seed)
    genres = sorted({g for m in data.movies.values() for g in m.genres})
    profiles = [
        Profile(10_000 + i, f"Agent {i}", interests=[genres[i % len(genres)]], source="handcrafted")
        for i in range(n)
    ]
    names = [p.name for p in profiles]
    graph = generate_graph(names, [p.interests for p in profiles], 3, 0.0, rng)
    world = World(config, profiles, data, backend, lambda t: hashed_bag_of_words(t, 64), graph, rng)
    start = time.perf_counter()
    world.step()
    answers = (
        sum(v for k, v in world.counts.items() if k.startswith("llm_calls:"))
        + world.model.counts["llm_calls"]
    )
    return time.perf_counter() - start, answers


def efficiency(args) -> dict:
    data = movielens.load(args.data)
    # a round first, untimed: the first round of a process pays one-off costs (imports, a schema's grammar)
    # that would land on whichever row came first
    one_round(data, 10, FakeBackend(0.0, 0.0))
    rows = []
    for n in args.agents:
        fake = FakeBackend(args.latency, args.per_row)
        seconds, answers = one_round(data, n, fake)
        row = {
            "agents": n,
            "batched_s": round(seconds, 3),
            "calls": fake.calls,
            "answers_per_agent": round(answers / n, 2),
        }
        if n <= args.max_single:
            single = FakeBackend(args.latency, args.per_row)
            single_s, _ = one_round(data, n, OneAtATime(single))
            row.update(
                one_at_a_time_s=round(single_s, 3),
                single_calls=single.calls,
                ratio=round(single_s / seconds, 2),
            )
        rows.append(row)
        print(json.dumps(row))
    return {"latency_s": args.latency, "per_row_s": args.per_row, "rows": rows}


def real_world(config_path: str, overrides: list[str], backend, embed, out: Path):
    from agents.sandbox.config import load_config
    from agents.sandbox.run import build

    out.mkdir(parents=True, exist_ok=True)
    return build(load_config(config_path, overrides), out, backend, embed)


def real_parts(config_path: str):
    """The shipped config's LLM and sentence encoder, loaded once for every world of a benchmark."""
    from agents.llm import load_llm
    from agents.retrieval import Retriever
    from agents.sandbox.config import load_config
    from eval.backends import packaged_minilm

    return load_llm(load_config(config_path).llm), Retriever(packaged_minilm("cpu", 64)).embed


def real_efficiency(args) -> dict:
    """One round, every agent active, the shipped config's world and offline model: batched and (up to
    --max-single agents) one conversation per call, side by side."""
    backend, embed = real_parts(args.config)
    rows = []
    for n in args.agents:
        row = {"agents": n}
        for mode in ("batched", "one_at_a_time"):
            if mode == "one_at_a_time" and n > args.max_single:
                continue
            counting = Counting(backend)
            asked = counting if mode == "batched" else OneAtATime(counting)
            overrides = ["activity.pareto_xmin=1", f"agents={n}", *args.set]
            world = real_world(args.config, overrides, asked, embed, args.out / f"world-{n}-{mode}")
            start = time.perf_counter()
            world.step()
            seconds = time.perf_counter() - start
            counts = world.counts + world.model.counts
            row[mode] = {
                "s_per_round": round(seconds, 1),
                "llm_calls": counting.calls,
                "answers_per_agent": round(counting.answers / n, 2),
                "prompt_tokens_per_agent": round(counts["prompt_tokens"] / n),
                "answer_tokens_per_agent": round(counts["answer_tokens"] / n),
            }
            print(json.dumps({"agents": n, mode: row[mode]}), flush=True)
        if "one_at_a_time" in row:
            row["ratio"] = round(row["one_at_a_time"]["s_per_round"] / row["batched"]["s_per_round"], 2)
        rows.append(row)
    return {"model": backend.info, "rows": rows}


class Counting:
    """Counts the calls and answers that reach a backend; passes its answers through."""

    def __init__(self, backend):
        self.backend, self.calls, self.answers = backend, 0, 0

    def generate(self, conversations, sampling, constraint=None):
        self.calls += 1
        self.answers += len(conversations)
        return self.backend.generate(conversations, sampling, constraint)


class FirstItemUser(FakeBackend):
    """A scripted user for the cocoon benchmark: always to the recommender, always the first item."""

    def __init__(self):
        super().__init__(0.0, 0.0)

    def answer(self, conversation, constraint) -> str:
        if constraint.kind == "choice":
            return "recommender"
        return super().answer(conversation, constraint)


def genre_entropy(genres: Counter) -> float:
    total = sum(genres.values())
    return float(-sum(c / total * np.log2(c / total) for c in genres.values())) if total else float("nan")


def cocoon(args) -> dict:
    """Exposure entropy over rounds with the trained MF, without and with random injection."""
    if args.backend == "real":
        backend, embed = real_parts(args.config)
        decide = []
    else:  # the scripted user answers the page step (generate mode); it scores nothing
        backend, embed = FirstItemUser(), lambda texts: hashed_bag_of_words(texts, 64)
        decide = ["decision.mode=generate"]
    runs = {}
    for inject in (0, args.inject):
        overrides = [
            "recommender.kind=mf",
            "recommender.retrain_every=1",
            f"recommender.rec_random_k={inject}",
            "activity.pareto_xmin=1",  # every agent every round: the same people measured each round
            f"recommender.train_on={args.train_on}",
            f"agents={args.agents}",
            *decide,
            *args.set,
        ]
        world = real_world(args.config, overrides, backend, embed, args.out / f"cocoon-inject-{inject}")
        rounds = []
        for _ in tqdm(range(args.rounds), desc=f"inject {inject}", unit="round"):
            events, stats = world.step()
            per_agent: dict[str, Counter] = {}
            for event in events:
                for item in event.get("items") or []:
                    per_agent.setdefault(event["agent"], Counter()).update(world.movies[item].genres)
            agent_entropy = [genre_entropy(g) for g in per_agent.values()]
            rounds.append(
                {
                    "round": stats["round"],
                    "exposure_genre_entropy": stats["exposure_genre_entropy"],
                    "mean_agent_entropy": round(float(np.mean(agent_entropy)), 4) if agent_entropy else None,
                    "agents_shown": len(per_agent),
                    "watches": stats["watches"],
                }
            )
            print(json.dumps({"inject": inject, **rounds[-1]}), flush=True)
        runs[inject] = rounds
    plot_cocoon(runs, args.out / "cocoon.png", args)
    result = {
        "backend": args.backend,
        "agents": args.agents,
        "rounds": args.rounds,
        "train_on": args.train_on,
        "runs": runs,
    }
    (args.out / "cocoon.json").write_text(json.dumps(result, indent=1))
    print(f"-> {args.out}/cocoon.json, cocoon.png")
    return result


def plot_cocoon(runs: dict, path: Path, args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for ax, key, title in (
        (axes[0], "exposure_genre_entropy", "everything shown in the round"),
        (axes[1], "mean_agent_entropy", "what each agent was shown (mean over agents)"),
    ):
        for inject, rounds in runs.items():
            points = [(r["round"], r[key]) for r in rounds if r[key] is not None]
            label = "MF, no injection" if inject == 0 else f"MF + {inject} random per page"
            ax.plot(*zip(*points, strict=True), marker="o", ms=3, label=label)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("round")
    axes[0].set_ylabel("genre entropy (bits)")
    axes[0].legend(fontsize=8)
    history = "all users' ratings" if args.train_on == "all" else "the agents' own ratings"
    fig.suptitle(
        f"Exposure over rounds ({args.agents} agents, {args.backend} user; MF on {history} + clicks)",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def memory(args) -> dict:
    """Half-lives of memory records under the memory's own forgetting, per forget_scale."""
    from agents.sandbox.config import load_config
    from agents.sandbox.memory import Memory, Record

    rows = []
    kinds = {
        "fresh, importance 0.3": (0.3, 0, "observation"),
        "fresh, importance 0.5": (0.5, 0, "observation"),
        "fresh, importance 0.9": (0.9, 0, "observation"),
        "history, a year old, importance 0.5": (0.5, -365, "history"),
    }
    for scale in args.scales:
        # the history's scale a tenth of the others' (the shipped ratio: 0.01 to 0.1)
        config = load_config(
            args.config, [f"memory.forget_scale={scale}", f"memory.history_forget_scale={scale / 10}"]
        ).memory
        row = {"forget_scale": scale}
        for name, (importance, created, kind) in kinds.items():
            memory = Memory(config, None, None, np.random.default_rng(0))
            memory.long = [
                Record("r", importance, created, created, [1.0], kind) for _ in range(args.records)
            ]
            half, now = None, 0
            while half is None and now < args.horizon:
                now += config.reflect_every
                memory.forget(now)
                if len(memory.long) <= args.records / 2:
                    half = now
            row[name] = half if half is not None else f"> {args.horizon}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"reflect_every": config.reflect_every, "records": args.records, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "memory.json").write_text(json.dumps(result, indent=1))
    return result


def score_cost(args) -> dict:
    """One page decision by generation and by score, the same agents and pages, side by side."""
    from agents.sandbox.agent import agents_at, watch_messages
    from agents.sandbox.config import load_config
    from agents.sandbox.decide import Decider
    from agents.sandbox.memory import LLMMemoryModel
    from agents.sandbox.world import step_schema
    from eval.sandbox.cases import page_text

    backend, embed = real_parts(args.config)
    data = movielens.load(load_config(args.config).data)
    config = load_config(args.config, ["temperature=0", *args.set])
    rng = np.random.default_rng(0)
    users = sorted(int(u) for u in rng.choice(sorted(data.by_user()), size=args.pages, replace=False))
    moments = [data.by_user()[u][-1].ts for u in users]
    decider = Decider(config, backend, rng, Counter())
    agents = agents_at(data, users, moments, config, embed, LLMMemoryModel(backend), rng)
    rows = []
    for size in args.sizes:
        pages = [[int(m) for m in rng.choice(sorted(data.movies), size=size, replace=False)] for _ in users]
        prompts = [
            watch_messages(a, page_text(data, p, t), t, 0)
            for a, p, t in zip(agents, pages, moments, strict=True)
        ]
        start = time.perf_counter()
        decider.ask("recommender", [a.profile.name for a in agents], prompts, step_schema(size))
        generated = time.perf_counter() - start
        start = time.perf_counter()
        decider.scores("watch", prompts, [[str(n) for n in range(1, len(p) + 1)] for p in pages])  # numbers
        scored = time.perf_counter() - start
        row = {
            "films_per_page": size,
            "pages": len(pages),
            "generate_s_per_page": round(generated / len(pages), 3),
            "score_s_per_page": round(scored / len(pages), 3),
            "score_s_per_candidate": round(scored / len(pages) / size, 4),
            "score_over_generate": round(scored / generated, 3),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"model": backend.info, "batch": config.llm.generation_batch_size, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "score_cost.json").write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("pareto")
    fit.add_argument("--data", default="../shared/data/raw/movielens_latest_small")
    fit.add_argument("--out", type=Path, default=Path("runs/bench/sandbox"))
    speed = sub.add_parser("efficiency")
    speed.add_argument("--data", default="../shared/data/raw/movielens_latest_small")
    speed.add_argument("--agents", type=int, nargs="+", default=[1, 10, 100, 1000])
    speed.add_argument("--latency", type=float, default=0.05, help="seconds per call")
    speed.add_argument("--per-row", type=float, default=0.002, help="seconds per answered row")
    speed.add_argument("--max-single", type=int, default=100, help="largest size also run one at a time")
    speed.add_argument("--real", action="store_true", help="the config's world and offline LLM")
    forgetting = sub.add_parser("memory")
    forgetting.add_argument("--scales", type=float, nargs="+", default=[1.0, 0.3, 0.1, 0.03])
    forgetting.add_argument("--records", type=int, default=20000)
    forgetting.add_argument("--horizon", type=int, default=2000, help="rounds simulated at most")
    cost = sub.add_parser("score")
    cost.add_argument("--pages", type=int, default=32)
    cost.add_argument("--sizes", type=int, nargs="+", default=[6, 10])
    cocoon_parser = sub.add_parser("cocoon")
    cocoon_parser.add_argument("--rounds", type=int, default=10)
    cocoon_parser.add_argument("--agents", type=int, default=20)
    cocoon_parser.add_argument("--inject", type=int, default=2, help="random items per page, second run")
    cocoon_parser.add_argument("--backend", choices=["real", "scripted"], default="real")
    cocoon_parser.add_argument(
        "--train-on",
        choices=["all", "agents"],
        default="all",
        help="the MF's real history: all users or the agents",
    )
    for sub_parser in (speed, cocoon_parser, forgetting, cost):
        sub_parser.add_argument("--config", default="configs/sandbox/movielens.yaml")
        sub_parser.add_argument("--out", type=Path, default=Path("runs/bench/sandbox"))
        sub_parser.add_argument("--set", nargs="*", action="extend", default=[], help="config overrides")
    args = parser.parse_args(argv)
    if args.command == "pareto":
        pareto(args)
    elif args.command == "cocoon":
        cocoon(args)
    elif args.command == "memory":
        memory(args)
    elif args.command == "score":
        score_cost(args)
    else:
        result = real_efficiency(args) if args.real else efficiency(args)
        args.out.mkdir(parents=True, exist_ok=True)
        name = "efficiency_real.json" if args.real else "efficiency.json"
        (args.out / name).write_text(json.dumps(result, indent=1))
        print(f"-> {args.out}/{name}")


if __name__ == "__main__":
    main()
