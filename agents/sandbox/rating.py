"""The stars an agent gives a film it watched: one user model across the simulators.

A watched film's stars come from the review simulator's star model (agents/review/stars.py, the same
code as the review agents'), fitted on MovieLens's half-star ratings before the moment of the rating:
per prediction, the user's median unless a candidate (the user's mean shrunk towards everyone's,
Koren's baseline with the film's bias, ...) beats it by a paired margin on the validation ratings of
the same group (a film with or without earlier ratings) older than that moment, all of them only from
what is older.

The LLM's own stars (read from its probabilities of 1-5 after the agent's profile and the memories the
film recalls: ``stars.read`` expected, their expected value calibrated by a time-aware isotonic fit on the
validation ratings, stars.py; or greedy, the most likely digit) blend in only where the model's blend rule
says they help: ``llm_validation`` validation ratings, the most
recent before the start, are asked of the LLM as the agent of that user at that moment (built like
every agent: agent.agents_at), and a blend is used only where its paired gain over the model alone on
them is significant (stars.py: one-sided 95%, Bonferroni over the blends). Without them the model alone
rates and no LLM call is made. ``sources`` says, per rating, which candidate (and blend) gave it.
"""

from __future__ import annotations

import numpy as np

from agents.review.stars import StarModel
from agents.sandbox.agent import agents_at, rate_messages

HALF_STARS = (0.5, 5.0)  # MovieLens's scale
STARS = [str(s) for s in range(1, 6)]


def star_model(ratings) -> StarModel:
    """The review simulator's star model over MovieLens ratings (data_prep.movielens.Rating)."""
    rows = [(f"{r.user}:{r.movie}:{r.ts}", str(r.user), str(r.movie), r.ts, r.stars) for r in ratings]
    return StarModel(rows, scale=HALF_STARS)


def user_key(agent) -> str:
    """The agent's user in the star model: its MovieLens user, or a name no rating has (global + film)."""
    return str(agent.profile.user) if agent.profile.user is not None else f"agent:{agent.profile.id}"


def llm_stars(
    decider, agents, items: list[int], movies: dict, moments: list[int], rounds: list[int]
) -> list[float | None]:
    """The LLM's stars for each (agent, film), read from its probabilities (``stars.read``), one batched
    call; None where none could be read."""
    prompts = [
        rate_messages(a, movies[m], t, r) for a, m, t, r in zip(agents, items, moments, rounds, strict=True)
    ]
    return decider.read("rate", [a.profile.name for a in agents], prompts, STARS, decider.config.stars.read)


class Rater:
    def __init__(self, past, decider, config, movies: dict):
        """past: the ratings before the start; decider: the world's (decide.py); config: SandboxConfig."""
        self.model, self.decider, self.config, self.movies = star_model(past), decider, config, movies
        self.counts = {"llm_asked": 0, "llm_unusable": 0}
        self.validation_answers: dict[
            str, float
        ] = {}  # the LLM's stars for validation ratings (checkpointed)

    def validate(self, rows, data, embed, memory_model, rng: np.random.Generator) -> None:
        """Ask the LLM for these validation ratings (the star model's rows: id, user, film, moment,
        stars), each as its user's agent at that moment; the blends then compete (stars.py)."""
        if not rows:
            return
        agents = agents_at(
            data, [int(r[1]) for r in rows], [r[3] for r in rows], self.config, embed, memory_model, rng
        )
        answers = llm_stars(
            self.decider,
            agents,
            [int(r[2]) for r in rows],
            self.movies,
            [r[3] for r in rows],
            [0] * len(rows),
        )
        self.counts["llm_validation_unusable"] = sum(a is None for a in answers)
        self.load({r[0]: a for r, a in zip(rows, answers, strict=True) if a is not None})

    def load(self, answers: dict[str, float]) -> None:
        """The LLM's validation stars (from validate, or a checkpoint): the blends compete on them."""
        self.validation_answers = dict(answers)
        if answers:
            calibrate = self.config.stars.read == "expected"
            self.model.set_llm_validation(self.validation_answers, calibrate=calibrate)

    def state(self) -> dict:
        return {"validation_answers": self.validation_answers, "counts": dict(self.counts)}

    def restore(self, state: dict) -> None:
        self.counts = dict(state["counts"])
        self.load(state["validation_answers"])

    def blends(self, items: list[int], moments: list[int]) -> bool:
        """Whether the blend rule uses the LLM's stars for any of these (film, moment)s."""
        return any(c != "model" for c in self.model.blend_options([str(m) for m in items], list(moments)))

    def rate(
        self, agents, items: list[int], moments: list[int], rounds: list[int]
    ) -> tuple[list[float], list[str]]:
        """Stars for each (agent, film) as of its moment (the star model sees only older ratings), on
        the platform's half-star step (a rating a user could give), and what gave them."""
        answers = None
        if self.blends(items, moments):
            answers = llm_stars(self.decider, agents, items, self.movies, moments, rounds)
            self.counts["llm_asked"] += len(answers)
            self.counts["llm_unusable"] += sum(a is None for a in answers)
        values, sources = self.model.predict(
            [user_key(a) for a in agents], [str(m) for m in items], list(moments), answers
        )
        return [float(np.rint(v * 2) / 2) for v in values], sources  # a rating: MovieLens's half-star step
