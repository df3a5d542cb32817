"""The sandbox world, round by round: agents with a profile, a memory and actions, a recommender and a
social network, on a simulated clock.

Each round: every agent acts with its own probability (Pareto activity levels). An active agent first
chooses the recommender, the social network or nothing. In the recommender it sees a page and then,
for up to ``max_steps`` steps, watches one or more of the page's items (writing how it felt), asks for
the next page, searches by free text or leaves. Socially it chats with a contact (each side speaks from
its own profile and memory, turn by turn; ``chat: one-call`` writes the whole dialogue in one call,
labelled) or posts to all its contacts. Everything an agent sees becomes an observation for its memory
at the end of the round.

Every decision is a structured output (a choice among the valid actions, JSON with item numbers on
the page), so even a small model gives a valid action; an answer that still cannot be used becomes the
step's fallback (nothing, leave), counted per kind. LLM calls are batched across the agents of a
round: one call per decision step for all the agents at that step, one per chat turn for all chats,
one for all posts, one for all the round's observations (so a post to N contacts costs one batched
call, not 2N sequential ones).

All randomness comes from ``self.rng``, the run's one generator; ``state()``/``restore()`` carry
everything (the generator's state included) as JSON, so a run resumed from a checkpoint continues
exactly as the uninterrupted one would with a deterministic backend.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict

import numpy as np

from agents.llm import Constraint, Sampling, count_tokens
from agents.retrieval import BM25, top_indices
from agents.sandbox.memory import LLMMemoryModel, Memory, promote_due, reflect_all
from agents.sandbox.profiles import Profile
from agents.sandbox.prompts import frame
from agents.sandbox.recommender import Feed
from agents.sandbox.social import activity_levels

PLACES = ["recommender", "social", "nothing"]
PLACE_TEXT = {
    "recommender": "browse the movies the recommender suggests, and maybe watch some",
    "social": "chat with a friend or post to your friends",
    "nothing": "do nothing for now",
}
MAX_STEPS = 3
CHAT_TURNS = 2  # each side speaks this often


def step_schema(page_size: int) -> Constraint:
    return Constraint.json_object(
        action={"type": "string", "enum": ["watch", "next", "search", "leave"]},
        # one to page_size item numbers (ignored unless watching): a bounded list, so a small model can
        # neither answer "watch" with nothing nor repeat numbers until it is cut off
        items={
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": page_size},
            "minItems": 1,
            "maxItems": page_size,
        },
        query={"type": "string", "maxLength": 80},
        feeling={"type": "string", "maxLength": 200},
    )


def social_schema(contacts: int) -> Constraint:
    return Constraint.json_object(
        action={"type": "string", "enum": ["chat", "post"]},
        contact={"type": "integer", "minimum": 1, "maximum": max(contacts, 1)},
        text={"type": "string", "minLength": 1, "maxLength": 280},
    )


SAY = Constraint.json_object(say={"type": "string", "minLength": 1, "maxLength": 280})


def parse_json(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None
    return value if isinstance(value, dict) else None


class Agent:
    def __init__(self, profile: Profile, memory: Memory, activity: float):
        self.profile, self.memory, self.activity = profile, memory, activity
        self.watched: list[int] = []  # simulated watches, in order
        self.inbox: list[str] = []  # observations waiting for the end of the round


class World:
    def __init__(
        self, config, profiles, movies, history, backend, embed, graph, rng: np.random.Generator, human=None
    ):
        """config: SandboxConfig; movies: {id: Movie}; history: real (user, item) clicks that train the
        recommender; backend: a shared LLM backend (agents/llm.py); embed: texts -> unit vectors;
        graph: {name: set of names}; human: optional callable standing in for one agent's decisions."""
        self.config, self.movies, self.backend, self.embed, self.graph = config, movies, backend, embed, graph
        self.rng, self.human = rng, human
        self.model = LLMMemoryModel(backend)
        self.titles = {m.title: m.id for m in movies.values()}
        self.catalogue = sorted(movies)  # search's corpus, indexed once
        self.index = BM25([movies[i].text() for i in self.catalogue])
        levels = activity_levels(
            len(profiles), config.activity.pareto_alpha, config.activity.pareto_xmin, rng
        )
        self.agents = {
            p.name: Agent(p, Memory(config.memory, embed, self.model, rng), float(level))
            for p, level in zip(profiles, levels, strict=True)
        }
        self.known = self.known_movies()
        self.history = list(history)
        self.feed = Feed(config.recommender, list(movies), rng)
        self.fitted_on: list[tuple[int, int]] = []  # the simulated clicks of the last retraining
        self.feed.train(self.history)
        self.round = 0
        self.counts: Counter = Counter()

    def known_movies(self) -> dict[str, set[int]]:
        """Each agent's real watched history (from its profile) as movie ids: never recommended again."""
        return {
            name: {self.titles[t] for t in agent.profile.watched if t in self.titles}
            for name, agent in self.agents.items()
        }

    # -- the LLM, batched ----------------------------------------------------------------------------------
    def ask(
        self, kind: str, names: list[str], prompts: list[list[dict]], constraint: Constraint
    ) -> list[str]:
        """One batched call for everyone at this step; a human-played agent answers at the terminal."""
        answers = [""] * len(names)
        machine = [i for i, n in enumerate(names) if not (self.human and self.human.plays(n))]
        if machine:
            # a fresh seed per call from the run's generator: varied, and the same on a rerun
            sampling = Sampling(160, self.config.temperature, 1.0, int(self.rng.integers(2**31 - 1)))
            out = self.backend.generate([prompts[i] for i in machine], sampling, constraint)
            for i, text in zip(machine, out, strict=True):
                answers[i] = text
            self.counts[f"llm_calls:{kind}"] += len(machine)
            self.counts["llm_batches"] += 1
            count_tokens(self.backend, self.counts)
        for i, name in enumerate(names):
            if self.human and self.human.plays(name):
                answers[i] = self.human.answer(kind, prompts[i], constraint)
        return answers

    def prompt(self, agent: Agent, instruction: str, context: str, query: str) -> list[dict]:
        memories = agent.memory.context(query, self.round)
        return frame(agent.profile.summary(), memories, instruction, f"Round {self.round}. {context}")

    def log(
        self, events: list, agent: str, action: str, item: int | None = None, text: str = "", **extra
    ) -> None:
        events.append(
            {"round": self.round, "agent": agent, "action": action, "item": item, "text": text, **extra}
        )

    # -- a round -------------------------------------------------------------------------------------------
    def step(self) -> tuple[list[dict], dict]:
        """One round. Returns its interactions and statistics."""
        self.round += 1
        events: list[dict] = []
        if any(a.inbox for a in self.agents.values()):  # a broadcast since the last round: heard first
            self.remember()
        shown: list[int] = []
        active = [a for a in self.agents.values() if self.rng.random() < a.activity]
        cap = self.config.activity.max_active
        if cap and len(active) > cap:
            active = [active[i] for i in sorted(self.rng.choice(len(active), size=cap, replace=False))]
        names = [a.profile.name for a in active]
        prompts = []
        for agent in active:
            # the options in an order drawn per agent, so a small model's position bias averages out
            order = [PLACES[i] for i in self.rng.permutation(len(PLACES))]
            listing = "\n".join(f"{p}: {PLACE_TEXT[p]}" for p in order)
            instruction = f"What do you do now? Answer with one word:\n{listing}"
            prompts.append(self.prompt(agent, instruction, "", "movies friends"))
        choices = self.ask("place", names, prompts, Constraint.choice(PLACES))
        browsing, social = [], []
        for agent, choice in zip(active, choices, strict=True):
            if choice not in PLACES:
                self.counts["fallback:place"] += 1
                self.log(events, agent.profile.name, "go:nothing", fallback=True, answer=choice)
                continue
            self.log(events, agent.profile.name, f"go:{choice}")
            (browsing if choice == "recommender" else social if choice == "social" else []).append(agent)
        self.browse(browsing, events, shown)
        self.socialise(social, events)
        self.remember()
        if self.round % self.config.recommender.retrain_every == 0:
            self.fitted_on = [(a.profile.id, i) for a in self.agents.values() for i in a.watched]
            self.feed.train(self.history + self.fitted_on)
        if self.round % self.config.memory.reflect_every == 0:
            memories = [agent.memory for agent in self.agents.values()]
            for memory in memories:
                memory.forget(self.round)
            reflect_all(memories, self.round)  # one batched call for everyone
        return events, self.statistics(events, shown, len(active))

    def browse(self, agents: list[Agent], events: list, shown: list[int]) -> None:
        pages = {}
        for agent in agents:
            exclude = self.known[agent.profile.name] | set(agent.watched)
            items, injected = self.feed.page(agent.profile.id, exclude)
            pages[agent.profile.name] = items
            shown.extend(items)
            self.log(events, agent.profile.name, "browse", items=items, injected=injected)
        visiting = list(agents)
        seen = {name: set(items) for name, items in pages.items()}
        for _ in range(MAX_STEPS):
            if not visiting:
                break
            prompts = []
            for agent in visiting:
                page = pages[agent.profile.name]
                listing = "\n".join(f"{k}. {self.movies[i].text()}" for k, i in enumerate(page, start=1))
                prompts.append(
                    self.prompt(
                        agent,
                        "Choose: watch (give the numbers of the movies you watch and how you felt), next "
                        "(another page), search (give a query) or leave.",
                        f"The recommender shows:\n{listing}",
                        listing,
                    )
                )
            answers = self.ask(
                "recommender",
                [a.profile.name for a in visiting],
                prompts,
                step_schema(self.config.recommender.page_size),
            )
            still = []
            for agent, text in zip(visiting, answers, strict=True):
                name, page = agent.profile.name, pages[agent.profile.name]
                value = parse_json(text)
                action = value.get("action") if value else None
                numbers = value.get("items", []) if value else []
                valid_numbers = isinstance(numbers, list) and all(
                    isinstance(k, int) and 1 <= k <= len(page) for k in numbers
                )
                if action not in ("watch", "next", "search", "leave") or (
                    action == "watch" and (not numbers or not valid_numbers)
                ):
                    self.counts["fallback:recommender"] += 1
                    self.log(events, name, "leave", fallback=True, answer=text)
                    continue
                if action == "watch":
                    for k in dict.fromkeys(numbers):
                        item = page[k - 1]
                        agent.watched.append(item)
                        feeling = str(value.get("feeling") or "")
                        self.log(events, name, "watch", item, feeling)
                        agent.inbox.append(f"I watched {self.movies[item].title}. {feeling}".strip())
                    continue  # a visit ends with watching
                if action == "leave":
                    self.log(events, name, "leave")
                    continue
                seen[name] |= set(page)
                exclude = self.known[name] | set(agent.watched) | seen[name]  # nothing shown twice in a visit
                if action == "next":
                    page, _ = self.feed.page(agent.profile.id, exclude)
                else:
                    query = str(value.get("query") or "")
                    page = self.search(query, exclude)
                    self.log(events, name, "search", text=query)
                pages[name] = page
                shown.extend(page)
                self.log(events, name, action, items=page)
                still.append(agent)
            visiting = still

    def search(self, query: str, exclude: set[int]) -> list[int]:
        """Items whose title, genres and tags match the query best (BM25 over the catalogue)."""
        scores = self.index.scores(query)
        blocked = [k for k, i in enumerate(self.catalogue) if i in exclude]
        scores[blocked] = -np.inf
        size = min(self.config.recommender.page_size, len(self.catalogue) - len(blocked))
        return [self.catalogue[k] for k in top_indices(scores, size)]

    def socialise(self, agents: list[Agent], events: list) -> None:
        contacts = {a.profile.name: sorted(self.graph.get(a.profile.name, ())) for a in agents}
        for agent in agents:
            if not contacts[agent.profile.name]:
                self.counts["social_without_contacts"] += 1
                self.log(events, agent.profile.name, "nothing", reason="no contacts")
        agents = [a for a in agents if contacts[a.profile.name]]
        if not agents:
            return
        prompts = []
        for agent in agents:
            listing = "\n".join(f"{k}. {c}" for k, c in enumerate(contacts[agent.profile.name], start=1))
            prompts.append(
                self.prompt(
                    agent,
                    "Chat with one contact (give their number and your opening line) or post to all of "
                    "them (give the post).",
                    f"Your contacts:\n{listing}",
                    "friends chat post",
                )
            )
        width = max(len(c) for c in contacts.values())
        answers = self.ask("social", [a.profile.name for a in agents], prompts, social_schema(width))
        chats, posts = [], []
        for agent, text in zip(agents, answers, strict=True):
            value = parse_json(text)
            mine = contacts[agent.profile.name]
            ok = value and value.get("action") in ("chat", "post") and str(value.get("text") or "").strip()
            if (
                ok
                and value["action"] == "chat"
                and not (isinstance(value.get("contact"), int) and 1 <= value["contact"] <= len(mine))
            ):
                ok = False
            if not ok:
                self.counts["fallback:social"] += 1
                self.log(events, agent.profile.name, "nothing", fallback=True, answer=text)
                continue
            if value["action"] == "post":
                posts.append((agent, str(value["text"])))
            else:
                chats.append((agent, self.agents[mine[value["contact"] - 1]], str(value["text"])))
        for agent, text in posts:  # one post reaches every contact; their memories take it in one batch
            self.log(events, agent.profile.name, "post", text=text, audience=contacts[agent.profile.name])
            agent.inbox.append(f"I posted: {text}")
            for name in contacts[agent.profile.name]:
                self.agents[name].inbox.append(f"{agent.profile.name} posted: {text}")
            self.counts["post_deliveries"] += len(contacts[agent.profile.name])
        self.chat(chats, events)

    def chat(self, chats: list, events: list) -> None:
        """Two-sided chats, turn by turn, every chat's turn in one batch; or one call per dialogue."""
        if not chats:
            return
        dialogues = [[(a.profile.name, opening)] for a, _, opening in chats]
        if self.config.chat == "one-call":
            prompts = [
                self.prompt(
                    a,
                    f"Write the rest of your chat with {b.profile.name} ({b.profile.summary()}), "
                    "both sides, a few lines.",
                    f"You said: {opening}",
                    b.profile.name,
                )
                for a, b, opening in chats
            ]
            answers = self.ask("chat", [a.profile.name for a, _, _ in chats], prompts, SAY)
            for (a, _, _), dialogue, text in zip(chats, dialogues, answers, strict=True):
                value = parse_json(text)
                if not value or not value.get("say"):
                    self.counts["fallback:chat"] += 1
                    self.log(events, a.profile.name, "chat-turn", fallback=True, answer=text)
                    continue
                dialogue.append(("(one call)", str(value["say"])))
        else:
            for turn in range(2 * CHAT_TURNS - 1):
                speakers = [(b if turn % 2 == 0 else a, a if turn % 2 == 0 else b) for a, b, _ in chats]
                prompts = []
                for (me, other), dialogue in zip(speakers, dialogues, strict=True):
                    lines = "\n".join(f"{who}: {said}" for who, said in dialogue)
                    prompts.append(
                        self.prompt(
                            me,
                            f"Reply to {other.profile.name} in one or two sentences.",
                            f"Your chat so far:\n{lines}",
                            lines,
                        )
                    )
                answers = self.ask("chat", [me.profile.name for me, _ in speakers], prompts, SAY)
                for (me, _), dialogue, text in zip(speakers, dialogues, answers, strict=True):
                    value = parse_json(text)
                    if not value or not value.get("say"):
                        self.counts["fallback:chat"] += 1
                        self.log(events, me.profile.name, "chat-turn", fallback=True, answer=text)
                        continue
                    dialogue.append((me.profile.name, str(value["say"])))
        for (a, b, _), dialogue in zip(chats, dialogues, strict=True):
            text = "\n".join(f"{who}: {said}" for who, said in dialogue)
            self.log(events, a.profile.name, "chat", text=text, partner=b.profile.name, mode=self.config.chat)
            for me, other in ((a, b), (b, a)):
                me.inbox.append(f"I chatted with {other.profile.name}:\n{text}")

    def remember(self) -> None:
        """Every agent's observations of the round, compressed in one batched call, then stored."""
        pending = [(agent, o) for agent in self.agents.values() for o in agent.inbox]
        if not pending:
            return
        compressed = self.model.compress([o for _, o in pending])
        self.counts["llm_batches"] += 1
        for agent in self.agents.values():
            agent.inbox = []
        by_agent: dict[str, list] = {}
        for (agent, _), item in zip(pending, compressed, strict=True):
            by_agent.setdefault(agent.profile.name, []).append(item)
        for name, items in by_agent.items():
            self.agents[name].memory.store(items, self.round)
        promote_due([agent.memory for agent in self.agents.values()], self.round)  # one batched call

    def interview(self, name: str, question: str) -> str:
        agent = self.agents[name]
        prompt = self.prompt(
            agent, f"Answer the interviewer: {question}", "An interviewer asks you a question.", question
        )
        value = parse_json(self.ask("interview", [name], [prompt], SAY)[0])
        return str(value["say"]) if value and value.get("say") else "(no usable answer)"

    def broadcast(self, message: str) -> None:
        for agent in self.agents.values():
            agent.inbox.append(f"Everyone heard: {message}")

    def statistics(self, events: list[dict], shown: list[int], active: int) -> dict:
        genres = Counter(g for i in shown for g in self.movies[i].genres)
        total = sum(genres.values())
        # None when nothing was shown: no exposure to measure
        entropy = (
            round(float(-sum(c / total * np.log2(c / total) for c in genres.values())), 4) if total else None
        )
        actions = Counter(e["action"] for e in events)
        return {
            "round": self.round,
            "active_agents": active,
            "watches": actions["watch"],
            "chats": actions["chat"],
            "posts": actions["post"],
            "items_shown": len(shown),
            "exposure_genre_entropy": entropy,
        }

    # -- checkpoints -----------------------------------------------------------------------------------------
    def state(self) -> dict:
        return {
            "round": self.round,
            "rng": self.rng.bit_generator.state,
            "counts": dict(self.counts),
            "model_counts": dict(self.model.counts),
            "graph": {k: sorted(v) for k, v in self.graph.items()},
            "feed": {"fitted_on": self.fitted_on, "seed": getattr(self.feed.recommender, "seed", None)},
            "agents": [
                {
                    "profile": asdict(a.profile),
                    "activity": a.activity,
                    "watched": a.watched,
                    "memory": a.memory.to_json(),
                }
                for a in self.agents.values()
            ],
        }

    def restore(self, state: dict) -> None:
        self.round = state["round"]
        self.counts, self.model.counts = Counter(state["counts"]), Counter(state["model_counts"])
        self.graph = {k: set(v) for k, v in state["graph"].items()}
        self.agents = {}
        for entry in state["agents"]:
            profile = Profile(**entry["profile"])
            agent = Agent(
                profile, Memory(self.config.memory, self.embed, self.model, self.rng), entry["activity"]
            )
            agent.watched = list(entry["watched"])
            agent.memory.load_json(entry["memory"])
            self.agents[profile.name] = agent
        self.known = self.known_movies()
        # the recommender exactly as it was after its last fit: same clicks, same seed
        self.fitted_on = [tuple(c) for c in state["feed"]["fitted_on"]]
        self.feed.train(self.history + self.fitted_on, state["feed"]["seed"])
        self.rng.bit_generator.state = state["rng"]
        for message in state.get("pending_broadcasts", []):  # heard in the next round
            self.broadcast(message)
