"""What the sandbox's tests share (eval.sandbox.discrimination, eval.sandbox.generation, eval.sandbox.alignment): the users they
test, the agents they test (built as the sandbox builds its own), the adapter check, and resumable
results.

**Users.** A user is eligible when the first of their last ``HORIZON`` ratings (the cutoff of the
longest hold-out the tests use, the generation test's; ties by movie id) is at or after ``after`` and at
least ``min_history`` of their ratings are strictly older than it; the three tests draw the same users. Test and validation users are drawn from the eligible ones
with the seed, disjoint: settings (the score normalisation, the rating blend) are chosen on the
validation users and reported on the test users, which took no part in choosing. With an adapter, the
adapter's training pairs must all be older than ``after`` (data_prep.choice_pairs --before), so nothing
a tuned model learned comes from a tested user's held-out part or from after any tested cutoff; the
tests refuse an adapter whose card says otherwise.

**Agents.** ``VARIANTS`` are the simulator's agents under test: the sandbox config with a decision mode
and memory switches, with or without the adapter, each agent built by agent.agents_at at the user's
cutoff (its profile, its history in memory) and deciding through the sandbox's Decider at temperature
0. The memory ablations apply to the tuned agent when an adapter is given and
to the untuned scoring agent otherwise.

**Resuming.** Each method's result is written to OUT/methods/NAME.json as it finishes; a rerun skips
those and refuses (naming what changed) when the inputs differ (data, users, config), unless
--overwrite. A row on the adapter records the adapter's digest and is rerun when the adapter changes.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data_prep import fingerprint
from data_prep.movielens import day

NORMALISATIONS = ("sum", "mean", "pmi")
CHUNK = 16  # prompts per call, for the progress bar

HORIZON = 10  # the generation test's steps: the longest hold-out of the three tests
ABLATIONS = {
    "no-short-term": ["memory.short_term=false"],
    "no-long-term": ["memory.long_term=false"],
    "no-reflection": ["memory.reflection=false"],
}


def variants(adapter: str | None, ablations=tuple(ABLATIONS)) -> dict[str, tuple[list[str], bool]]:
    """name -> (config overrides, uses the adapter)."""
    out = {
        "agent-generate": (["decision.mode=generate"], False),
        "agent-score": (["decision.mode=score"], False),
    }
    if adapter:
        out["tuned"] = (["decision.mode=score"], True)
    base = "tuned" if adapter else "agent-score"
    for name in ablations:
        out[f"{base}/{name}"] = ([*out[base][0], *ABLATIONS[name]], out[base][1])
    return out


def arguments(module: str, doc: str, adapter_help: str, validation_help: str) -> argparse.ArgumentParser:
    """The command-line options every sandbox test shares; each test adds its own."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=doc.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--users", type=int, default=100, help="tested users, drawn with the seed")
    parser.add_argument("--validation-users", type=int, default=50, help=validation_help)
    parser.add_argument(
        "--after", default="2010-01-01", help="held-out ratings at or after this date (YYYY-MM-DD)"
    )
    parser.add_argument("--adapter", help=adapter_help)
    parser.add_argument("--set", nargs="*", action="extend", default=[], help="config overrides")
    return parser


def eligible_users(data, after: int, held: int, min_history: int) -> list[int]:
    out = []
    for user, ratings in sorted(data.by_user().items()):
        if len(ratings) < held + min_history:
            continue
        cutoff = ratings[-held].ts
        if cutoff >= after and sum(r.ts < cutoff for r in ratings) >= min_history:
            out.append(user)
    return out


def draw_users(
    data, after: int, held: int, min_history: int, n_test: int, n_validation: int, seed: int
) -> tuple[list[int], list[int]]:
    """Test and validation users, disjoint, drawn with the seed from the eligible ones."""
    eligible = eligible_users(data, after, held, min_history)
    if n_test + n_validation > len(eligible):
        raise SystemExit(
            f"error: {n_test} test and {n_validation} validation users asked for, but only {len(eligible)} users "
            f"have their last {held} ratings after {day(after)} and {min_history} older ones"
        )
    drawn = np.random.default_rng(seed).choice(eligible, size=n_test + n_validation, replace=False)
    return sorted(int(u) for u in drawn[:n_test]), sorted(int(u) for u in drawn[n_test:])


def check_adapter(adapter: str | None, after: int, config) -> dict | None:
    """The adapter's training card: its pairs must come from this data, all be older than ``after``, and
    have been built with this config's memory and prompt settings; otherwise an error saying what is
    wrong (a card that does not say is wrong too)."""
    if not adapter:
        return None
    folder = Path(adapter)
    record, card_path = folder / "training_data.json", folder / "training_card.json"
    for path in (record, card_path):
        if not path.exists():
            raise SystemExit(
                f"error: {path} is missing: the tests cannot tell what the adapter was trained on"
            )
    latest = json.loads(record.read_text()).get("latest_target_ts")
    if latest is None or latest >= after:
        when = day(latest) if latest is not None else "an unknown time"
        raise SystemExit(
            f"error: the adapter {adapter} was trained on choices up to {when}, not all before {day(after)}: "
            "its tests would see what it learned from after their cutoffs. Build the pairs with "
            "python -m data_prep.choice_pairs --before, or test with a later --after"
        )
    pairs = json.loads(card_path.read_text()).get("data") or {}
    if pairs.get("task") != "sandbox_choice":
        raise SystemExit(f"error: {adapter} was not trained on sandbox choice pairs (data_prep.choice_pairs)")
    if pairs.get("data_sha256") != data_digest(config.data):
        raise SystemExit(
            f"error: the adapter's pairs come from other data than {config.data} ({pairs.get('data')})"
        )
    options = pairs.get("options") or {}
    expected = {
        "round_days": config.round_days,
        "retrieve_top": config.memory.retrieve_top,
        "short_term_capacity": config.memory.short_term_capacity,
        "recency_decay": config.memory.recency_decay,
    }
    wrong = {k: (options.get(k), v) for k, v in expected.items() if options.get(k) != v}
    if wrong:
        raise SystemExit(
            f"error: the adapter's pairs were built with other prompt settings (pairs, config): {wrong}"
        )
    return {
        "adapter": adapter,
        "latest_target": day(latest),
        "pairs": pairs.get("options"),
        "page_sizes": options.get("page_sizes"),
    }


def adapter_context(backend, uses_adapter: bool):
    """A row without the adapter runs on the base model alone."""
    off = getattr(backend, "adapter_off", None)
    return nullcontext() if uses_adapter or off is None else off()


def page_text(data, page: list[int], moment: int) -> str:
    """A page as the sandbox shows it at ``moment``: each film's ratings and tags from before it."""
    from data_prep.prompt import page_lines

    popularity = data.popularity()
    counts = {m: (popularity.count(m, moment), popularity.mean(m, moment)) for m in page}
    return page_lines(page, data.movies, counts, moment)


class AgentRow:
    """One of the simulator's agents under test: its config (temperature 0), its Decider, its memory
    model, and its agents per set of (user, cutoff)."""

    def __init__(self, name, overrides, uses_adapter, config_path, set_overrides, data, backend, embed, seed):
        from agents.sandbox.config import load_config
        from agents.sandbox.decide import Decider
        from agents.sandbox.memory import LLMMemoryModel

        self.name, self.uses_adapter, self.data, self.backend, self.embed = (
            name,
            uses_adapter,
            data,
            backend,
            embed,
        )
        self.config = load_config(config_path, [*set_overrides, *overrides, "temperature=0"])
        self.rng = np.random.default_rng([seed, sum(map(ord, name))])
        self.counts: Counter = Counter()
        self.decider = Decider(self.config, backend, self.rng, self.counts)
        self.model = LLMMemoryModel(backend, around=self.decider.adapter, writer=self.config.memory.writer)
        self.built: dict[tuple, tuple[list, list]] = {}

    def agents(self, cases: list[dict]) -> list:
        """Each case's user's agent at the case's cutoff, built once and handed out with its memory as
        it started (retrieval refreshes what it recalls, a test's steps add to it)."""
        from agents.sandbox.agent import agents_at

        key = tuple((c["user"], c["cutoff"]) for c in cases)
        if key not in self.built:
            users, moments = [c["user"] for c in cases], [c["cutoff"] for c in cases]
            agents = agents_at(self.data, users, moments, self.config, self.embed, self.model, self.rng)
            self.built[key] = (agents, [agent.memory.to_json() for agent in agents])
        agents, states = self.built[key]
        for agent, state in zip(agents, states, strict=True):
            agent.memory.load_json(state)
            agent.rated, agent.inbox = [], []
        return agents

    def scores(
        self, agents, pages, moments, clocks, rounds, wanted=NORMALISATIONS
    ) -> dict[str, list[np.ndarray]]:
        """Every film's score on each agent's page under the ``wanted`` normalisations: the page as it
        stood at ``moments`` (counts, tags), shown at the simulated ``clocks`` in round ``rounds``."""
        from agents.sandbox.agent import watch_messages

        out: dict[str, list[np.ndarray]] = {n: [] for n in wanted}
        with adapter_context(self.backend, self.uses_adapter):
            for start in tqdm(range(0, len(agents), CHUNK), desc=self.name, leave=False):
                end = start + CHUNK
                prompts = [
                    watch_messages(agent, page_text(self.data, page, moment), clock, now)
                    for agent, page, moment, clock, now in zip(
                        agents[start:end],
                        pages[start:end],
                        moments[start:end],
                        clocks[start:end],
                        rounds[start:end],
                        strict=True,
                    )
                ]
                numbers = [[str(n) for n in range(1, len(page) + 1)] for page in pages[start:end]]
                for norm, values in self.decider.all_scores("watch", prompts, numbers, wanted).items():
                    out[norm] += values
        return out


class Results:
    """Per-method results under OUT/methods/, fingerprinted (see the module docstring)."""

    def __init__(self, out: Path, inputs: dict, overwrite: bool):
        self.folder = out / "methods"
        has_work = self.folder.exists() and any(self.folder.glob("*.json"))
        if not fingerprint.verdict(out, inputs, overwrite=overwrite, has_work=has_work):
            for path in self.folder.glob("*.json"):
                path.unlink()
            print(f"--overwrite: discarded the earlier results in {out}")
        fingerprint.record(out, inputs)
        self.folder.mkdir(parents=True, exist_ok=True)

    def path(self, method: str) -> Path:
        return self.folder / (method.replace("/", "__") + ".json")

    def get(self, method: str, adapter: str | None = None) -> dict | None:
        """The method's stored result; for a row on an adapter (``adapter``: its digest), only when it
        was made with that adapter (a retrained adapter reruns the tuned rows and keeps the others)."""
        path = self.path(method)
        if not path.exists():
            return None
        value = json.loads(path.read_text())
        return value if value.get("adapter_sha256") == adapter else None

    def put(self, method: str, value: dict) -> None:
        tmp = self.path(method).with_suffix(".tmp")
        tmp.write_text(json.dumps(value, indent=1))
        tmp.replace(self.path(method))


def config_read(config) -> dict:
    """The config as the tests' fingerprint records it: everything but ``text`` (the tests write no
    chat or post, so how messages are written cannot change a result)."""
    from agents.sandbox.config import as_dict

    return {k: v for k, v in as_dict(config).items() if k != "text"}


def data_digest(folder: str) -> str:
    root = Path(folder)
    files = [root / name for name in ("movies.csv", "ratings.csv", "tags.csv") if (root / name).exists()]
    return fingerprint.digest_files(files, root)
