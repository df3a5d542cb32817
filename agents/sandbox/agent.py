"""A sandbox agent: a profile, a memory, an activity level, and what it watched in the run.

``start_agents`` builds agents as the sandbox starts them, and the sandbox's tests build theirs the same
way at each tested user's cutoff: a data-aligned agent's memory starts with its user's rated films
before that moment (``history_records``: the texts data_prep.prompt writes, importance from how far the
rating is from the user's mean, created at the rating's real time on the round clock). No LLM call:
the memory reflects on them every ``memory.reflect_every`` rounds as the run goes, as on anything else.

``watch_messages`` is the prompt of the choice of a film on a page, the one decision a tuned model is
trained for (data_prep.choice_pairs builds its pairs with the same functions).
"""

from __future__ import annotations

import math

import numpy as np

from agents.sandbox.decide import PROMPT_FEATURES
from agents.sandbox.memory import Memory, Record, promote_due
from agents.sandbox.profiles import Profile, aligned_profiles
from data_prep.movielens import day, history_importance
from data_prep.prompt import (
    RATE_INSTRUCTION,
    WATCH_INSTRUCTION,
    build_sandbox_messages,
    page_observation,
    rate_observation,
    watched_line,
)

DAY = 86400


class Agent:
    def __init__(self, profile: Profile, memory: Memory, activity: float):
        self.profile, self.memory, self.activity = profile, memory, activity
        self.rated: list[list] = []  # [movie, stars, round] watched in the run, in order
        self.inbox: list[str] = []  # observations waiting for the end of the round

    @property
    def watched(self) -> list[int]:
        return [movie for movie, _, _ in self.rated]

    def seen(self) -> set[int]:
        """Every film it rated before the start or watched in the run: never recommended again."""
        return {movie for movie, _, _ in self.profile.history} | set(self.watched)

    def recent(self, movies: dict, n: int = 3) -> list[tuple[str, float]]:
        """Its last n films with their stars, the run's watches after the real history."""
        rows = [(m, s) for m, s, _ in self.profile.history] + [(m, s) for m, s, _ in self.rated]
        return [(movies[m].title, s) for m, s in rows[-n:]]


def remember(agents: list[Agent], model, now_round: int) -> bool:
    """Every agent's waiting observations compressed in one batched call and stored in its memory, then
    every record due for an insight promoted in one more (memory.promote_due). Returns whether any
    observation was waiting."""
    pending = [(agent, o) for agent in agents for o in agent.inbox]
    if not pending:
        return False
    compressed = model.compress([o for _, o in pending])
    for agent in agents:
        agent.inbox = []
    by_agent: dict[int, list] = {}
    for (agent, _), item in zip(pending, compressed, strict=True):
        by_agent.setdefault(id(agent), []).append(item)
    for agent in agents:
        if id(agent) in by_agent:
            agent.memory.store(by_agent[id(agent)], now_round)
    promote_due([agent.memory for agent in agents], now_round)
    return True


def rounds_before(ts: int, start: int, round_days: float) -> int:
    """A real moment before the start on the round clock (round 0 is the start): minus the rounds since."""
    return -math.ceil((start - ts) / (round_days * DAY))


def history_records(profile: Profile, movies: dict, round_days: float) -> list[Record]:
    """The profile's rated films as memory records, oldest first (embedded by their film's text)."""
    out = []
    for movie, stars, ts in profile.history:
        when = rounds_before(ts, profile.start, round_days)
        text = watched_line(movies[movie].text(), stars, day(ts))
        importance = history_importance(stars, profile.mean_stars)
        out.append(Record(text, importance, when, when, None, kind="history", key=movies[movie].text()))
    return out


def start_agents(profiles, levels, config, movies, embed, model, rng: np.random.Generator) -> list[Agent]:
    """Agents for these profiles with these activity levels, their memories seeded with their history
    (no LLM call: reflection comes every ``memory.reflect_every`` rounds, as the run goes)."""
    agents = []
    for profile, level in zip(profiles, levels, strict=True):
        memory = Memory(config.memory, embed, model, rng)
        memory.seed(history_records(profile, movies, config.round_days))
        agents.append(Agent(profile, memory, float(level)))
    return agents


def agents_at(
    data, users: list[int], moments: list[int], config, embed, model, rng: np.random.Generator
) -> list[Agent]:
    """Data-aligned agents of these users, each at its own moment, built as the sandbox builds its agents
    (the sandbox's tests: each tested user at its cutoff). Activity plays no part here (1)."""
    profiles = [
        aligned_profiles(data, [u], t, rng, config.features)[0] for u, t in zip(users, moments, strict=True)
    ]
    return start_agents(profiles, [1.0] * len(profiles), config, data.movies, embed, model, rng)


def rate_messages(agent: Agent, movie, now: int, now_round: int) -> list[dict]:
    """The LLM's stars for a film the agent just watched: profile, the memories the film recalls."""
    seen = rate_observation(now, movie.text())
    return build_sandbox_messages(
        agent.profile.summary(PROMPT_FEATURES["rate"]),
        agent.memory.context(seen, now_round),
        RATE_INSTRUCTION,
        seen,
    )


def watch_messages(
    agent: Agent, listing: str, now: int, now_round: int, instruction: str = WATCH_INSTRUCTION
) -> list[dict]:
    """The choice of a film on a page: profile, the memories the page recalls, the page, the question."""
    seen = page_observation(now, listing)
    memories = agent.memory.context(seen, now_round)
    return build_sandbox_messages(
        agent.profile.summary(PROMPT_FEATURES["watch"]), memories, instruction, seen
    )
