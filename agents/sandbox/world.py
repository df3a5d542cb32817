"""The sandbox world, round by round: agents with a profile, a memory and actions, a recommender and a
social network, on a simulated clock that starts at ``config.start``.

The world sees only the past of its start: its catalogue is the films that existed then (rated before
it, or released in an earlier year; films released during the simulated time are not added), the
recommender trains on the ratings before it (and then on the simulated clicks), the pages show each
film's ratings on the site so far, search reads the films' tags written before it, and a watched film's
stars come from the review simulator's star model fitted on the ratings before it (rating.py). Data-aligned agents start with their users' real history
(agent.py).

Each round: every agent acts with its own probability (its activity level). An active agent first
chooses the recommender, the social network or nothing. In the recommender it sees a page and then,
for up to ``MAX_STEPS`` steps, watches (and rates), asks for the next page, searches by free text or
leaves; in generate mode one JSON answer says which (and which films, and how it felt), in score mode
it chooses the action and then the film by score (decide.py). Socially it chats with a contact (each
side speaks from its own profile, memory and recent films, turn by turn; ``chat: one-call`` writes the
whole dialogue in one call, labelled) or posts to all its contacts; ``text.messages: template`` states
the film and the stars in a fixed sentence instead of the LLM's words. Everything an agent sees becomes
an observation for its memory at the end of the round, and the observation is also the query its
memory recalls by.

Every decision is a structured output or a scored choice (decide.py); an answer that cannot be used
becomes the step's fallback (nothing, leave), counted per kind. LLM calls are batched across the agents
of a round: one call per decision step for all the agents at that step, one per chat turn for all
chats, one for all the round's observations (so a post to N contacts costs one batched call).

All randomness comes from ``self.rng``, the run's one generator; ``state()``/``restore()`` carry
everything (the generator's state included) as JSON, so a run resumed from a checkpoint continues
exactly as the uninterrupted one would with a deterministic backend.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

from agents.llm import Constraint
from agents.retrieval import BM25, top_indices
from agents.sandbox.agent import DAY, Agent, remember, start_agents, watch_messages
from agents.sandbox.choice import agent_past, as_of, fit_on_data
from agents.sandbox.decide import PROMPT_FEATURES, Decider
from agents.sandbox.memory import LLMMemoryModel, Memory, reflect_all
from agents.sandbox.profiles import Profile
from agents.sandbox.rating import Rater
from agents.sandbox.recommender import Feed
from agents.sandbox.social import activity_levels, levels_from_counts
from agents.sandbox.textcheck import (
    feeling_agrees,
    grounded,
    interview_truthful,
    search_on_taste,
    title_index,
)
from agents.text import distinct, repeats_ngram, words
from data_prep.movielens import day, existing_films, parse_moment
from data_prep.prompt import build_sandbox_messages, observation, page_lines, watched_line

PLACES = ["recommender", "social", "nothing"]
PLACE_TEXT = {
    "recommender": "browse the movies the recommender suggests, and maybe watch some",
    "social": "chat with a friend or post to your friends",
    "nothing": "do nothing for now",
}
PAGE_ACTIONS = ["watch", "next", "search", "leave"]
PAGE_TEXT = {
    "watch": "watch one of these movies",
    "next": "ask for another page",
    "search": "search for a movie",
    "leave": "leave the recommender",
}
MAX_STEPS = 3
CHAT_TURNS = 2  # each side speaks this often


def step_schema(page_size: int) -> Constraint:
    return Constraint.json_object(
        action={"type": "string", "enum": PAGE_ACTIONS},
        # one to page_size item numbers (ignored unless watching): a bounded list, so a small model can
        # neither answer "watch" with nothing nor repeat numbers until it is cut off
        items={
            "type": "array",
            "items": {"type": "integer", "minimum": 1, "maximum": page_size},
            "minItems": 1,
            "maxItems": page_size,
        },
        query={"type": "string", "maxLength": 80},  # an empty query to search is a counted fallback
        feeling={"type": "string", "maxLength": 200},
    )


def social_schema(contacts: int) -> Constraint:
    return Constraint.json_object(
        action={"type": "string", "enum": ["chat", "post"]},
        contact={"type": "integer", "minimum": 1, "maximum": max(contacts, 1)},
        text={"type": "string", "minLength": 1, "maxLength": 280},
    )


SAY = Constraint.json_object(say={"type": "string", "minLength": 1, "maxLength": 280})
QUERY = Constraint.json_object(query={"type": "string", "minLength": 1, "maxLength": 80})


@dataclass(frozen=True)
class Move:
    """What an agent does on a recommender page (one step of a visit)."""

    action: str  # watch | next | search | leave | fallback (an unusable answer, counted)
    films: tuple[int, ...] = ()  # watch: the films it watches
    query: str = ""  # search: the query ("": the template writes it, text.search: template)
    feeling: str = ""  # watch, generate mode: how it felt, in its own words
    answer: str = ""  # fallback: the answer that could not be used, as it came


def verdict(stars: float) -> str:
    return (
        "loved it"
        if stars >= 4.5
        else "liked it"
        if stars >= 3.5
        else "it was all right"
        if stars >= 2.5
        else "not for me"
    )


def template_message(kind: str, films: list[tuple[str, float]], nth: int = 0) -> str:
    """A chat line or a post that states one of the speaker's films and its stars (text.messages: template):
    the latest for an opening or a post, the nth latest for the speaker's nth reply in a chat, so a
    dialogue moves through what each side watched instead of repeating it."""
    if not films:
        return (
            "I have not watched anything lately. What about you?"
            if kind != "post"
            else "Nothing watched lately."
        )
    if nth >= len(films):
        return "That is all I have watched lately."
    title, stars = films[-1 - nth]
    if kind == "post":
        return f"Just watched {title}: {stars:g} out of 5, {verdict(stars)}."
    if kind == "open":
        return f"I watched {title} and gave it {stars:g} out of 5: {verdict(stars)}. What have you watched lately?"
    return f"I watched {title} lately, {stars:g} out of 5: {verdict(stars)}."


def films_line(films: list[tuple[str, float]]) -> str:
    shown = "; ".join(f"{title} ({stars:g} of 5)" for title, stars in films)
    return f"Films you watched lately: {shown or 'none'}."


class World:
    def __init__(
        self,
        config,
        profiles: list[Profile],
        data,
        backend,
        embed,
        graph,
        rng: np.random.Generator,
        human=None,
        fresh: bool = True,
    ):
        """config: SandboxConfig; data: the MovieLens data (data_prep.movielens); backend: a shared LLM
        backend (agents/llm.py); embed: texts -> unit vectors; graph: {name: set of names}; human: an
        optional player standing in for one agent's decisions; fresh: False for a world a checkpoint
        will restore (its agents are not started: no seeding, no reflection, no LLM call)."""
        self.config, self.movies, self.backend, self.embed, self.graph = (
            config,
            data.movies,
            backend,
            embed,
            graph,
        )
        self.rng = rng
        self.start = parse_moment(config.start, data)
        self.counts: Counter = Counter()
        self.decider = Decider(config, backend, rng, self.counts, human)
        self.model = LLMMemoryModel(backend, around=self.decider.adapter, writer=config.memory.writer)
        past = [r for r in data.ratings if r.ts < self.start]
        self.past_counts = Counter(r.movie for r in past)  # each film's ratings on the site before the start
        self.past_stars: Counter = Counter()
        for r in past:
            self.past_stars[r.movie] += r.stars
        self.site, self.site_stars = Counter(self.past_counts), Counter(self.past_stars)  # and in the run
        # the films of the start (rated before it, or released in an earlier year): what pages and search
        # show; search's corpus, indexed once, with the tags written before the start
        self.catalogue = existing_films(data, self.start)
        self.index = BM25([self.movies[i].text(tags_before=self.start) for i in self.catalogue])
        self.activity_fit: dict | None = None
        # what the LLM writes in an agent's name, checked (textcheck.py): this round's, for statistics
        self.titles = title_index({m: movie.title for m, movie in self.movies.items()})
        self.genres = {m: movie.genres for m, movie in self.movies.items()}
        self.written: list[dict] = []
        self.vader = None
        levels = self.levels(profiles, data)
        agents = start_agents(profiles, levels, config, self.movies, embed, self.model, rng) if fresh else []
        self.agents = {a.profile.name: a for a in agents}
        users = {p.user for p in profiles}
        self.history = [
            (r.user, r.movie) for r in past if config.recommender.train_on == "all" or r.user in users
        ]
        self.rater = Rater(past, self.decider, config, self.movies)
        if fresh and config.stars.llm_validation:  # the most recent validation ratings before the start
            rows = [r for r in self.rater.model.validation if r[3] < self.start][
                -config.stars.llm_validation :
            ]
            self.rater.validate(rows, data, embed, self.model, rng)
        self.feed = Feed(config.recommender, self.catalogue, rng, self.counts)
        self.fitted_on: list[tuple[int, int]] = []  # the simulated clicks of the last retraining
        self.feed.train(self.history)
        self.round = 0
        self.choice = None
        if config.decision.mode == "score" and config.decision.choice_weight > 0:  # its own generator
            self.choice = fit_on_data(
                data, self.start, embed, np.random.default_rng([config.seed, 7]), config.decision.choice_pages
            )
            self.recent_past = as_of(data, self.catalogue, self.start)[1]
        self.model.collect = True  # from here on, what the memory writes is checked each round

    def levels(self, profiles: list[Profile], data) -> np.ndarray:
        """Activity levels: a data-aligned agent's from its user's count before the start through the
        Pareto law fitted to every user's count then; the others drawn from the law."""
        activity = self.config.activity
        levels = activity_levels(len(profiles), activity.pareto_alpha, activity.pareto_xmin, self.rng)
        aligned = [k for k, p in enumerate(profiles) if p.history]
        if activity.from_data and aligned:
            counts = Counter(r.user for r in data.ratings if r.ts < self.start)
            fitted, mapped = levels_from_counts(
                [len(profiles[k].history) for k in aligned],
                list(counts.values()),
                activity.pareto_alpha,
                activity.pareto_xmin,
            )
            levels[aligned] = mapped
            self.activity_fit = fitted
        return levels

    def rec_id(self, agent: Agent) -> int:
        """The agent's user in the recommender: its MovieLens user, or a negative id of its own."""
        return agent.profile.user if agent.profile.user is not None else -1 - agent.profile.id

    @property
    def now(self) -> int:
        """The simulated moment of the current round."""
        return self.start + int(self.round * self.config.round_days * DAY)

    # -- prompts -----------------------------------------------------------------------------------------
    def prompt(self, agent: Agent, decision: str, instruction: str, what: str) -> list[dict]:
        """Profile (the features that bear on the decision), the memories this observation recalls, the
        observation, the instruction."""
        seen = observation(self.now, what)
        memories = agent.memory.context(seen, self.round)
        return build_sandbox_messages(
            agent.profile.summary(PROMPT_FEATURES[decision]), memories, instruction, seen
        )

    def listing(self, page: list[int]) -> str:
        counts = {
            m: (self.site[m], self.site_stars[m] / self.site[m] if self.site[m] else None) for m in page
        }
        return page_lines(page, self.movies, counts, self.start)

    def log(
        self, events: list, agent: str, action: str, item: int | None = None, text: str = "", **extra
    ) -> None:
        events.append(
            {"round": self.round, "agent": agent, "action": action, "item": item, "text": text, **extra}
        )

    def features(self, agents: list[Agent]) -> list[list[str]]:
        return [a.profile.features for a in agents]

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
        prompts = []
        for agent in active:
            # the options in an order drawn per agent, so a small model's position bias averages out
            order = [PLACES[i] for i in self.rng.permutation(len(PLACES))]
            listing = "\n".join(f"{p}: {PLACE_TEXT[p]}" for p in order)
            prompts.append(
                self.prompt(
                    agent,
                    "place",
                    f"What do you do now? Answer with one word:\n{listing}",
                    "You have some free time.",
                )
            )
        choices = self.decider.choose(
            "place", [a.profile.name for a in active], prompts, PLACES, self.features(active)
        )
        browsing, social = [], []
        for agent, choice in zip(active, choices, strict=True):
            if choice is None:
                self.counts["fallback:place"] += 1
                self.log(events, agent.profile.name, "go:nothing", fallback=True)
                continue
            self.log(events, agent.profile.name, f"go:{choice}")
            (browsing if choice == "recommender" else social if choice == "social" else []).append(agent)
        self.browse(browsing, events, shown)
        self.socialise(social, events)
        self.remember()
        if self.round % self.config.recommender.retrain_every == 0:
            self.fitted_on = [(self.rec_id(a), i) for a in self.agents.values() for i in a.watched]
            self.feed.train(self.history + self.fitted_on)
        if self.round % self.config.memory.reflect_every == 0:
            memories = [agent.memory for agent in self.agents.values()]
            for memory in memories:
                memory.forget(self.round)
            reflect_all(memories, self.round)  # one batched call for everyone
            self.check_memory()
        return events, self.statistics(events, shown, len(active))

    # -- the recommender -----------------------------------------------------------------------------------
    def browse(self, agents: list[Agent], events: list, shown: list[int]) -> None:
        pages = {}
        for agent in agents:
            items, injected = self.feed.page(self.rec_id(agent), agent.seen())
            pages[agent.profile.name] = items
            shown.extend(items)
            self.log(events, agent.profile.name, "browse", items=items, injected=injected)
        visiting = list(agents)
        seen = {name: set(items) for name, items in pages.items()}
        for _ in range(MAX_STEPS):
            if not visiting:
                break
            if self.config.decision.mode == "score":
                moves = self.page_step_scored(visiting, pages)
            else:
                moves = self.page_step_generated(visiting, pages)
            watching = [
                (agent, film, move.feeling)
                for agent, move in zip(visiting, moves, strict=True)
                if move.action == "watch"
                for film in move.films
            ]
            self.watch(watching, events)
            searching = [
                (a, self.template_query(a) if self.config.text.search == "template" else move.query)
                for a, move in zip(visiting, moves, strict=True)
                if move.action == "search"
            ]
            still = []
            for agent, move in zip(visiting, moves, strict=True):
                name = agent.profile.name
                if move.action in ("fallback", "leave"):
                    self.log(events, name, "leave", fallback=move.action == "fallback")
                    continue
                if move.action != "next":
                    continue  # a visit ends with watching; a search is served below
                seen[name] |= set(pages[name])
                pages[name], _ = self.feed.page(
                    self.rec_id(agent), agent.seen() | seen[name]
                )  # nothing shown twice
                shown.extend(pages[name])
                self.log(events, name, "next", items=pages[name])
                still.append(agent)
            for agent, query in searching:
                name = agent.profile.name
                seen[name] |= set(pages[name])
                found = self.search(query, agent.seen() | seen[name])
                self.check_search(agent, query, found, agent.seen() | seen[name])
                self.log(events, name, "search", text=query, items=found)
                if not found:  # nothing matches: the visit ends, counted
                    self.counts["fallback:search_found_nothing"] += 1
                    self.log(events, name, "leave", fallback=True, reason="the search found nothing")
                    continue
                pages[name] = found
                shown.extend(found)
                still.append(agent)
            visiting = [a for a in visiting if a in still]

    def page_step_generated(self, visiting: list[Agent], pages: dict) -> list[Move]:
        """One JSON answer per agent: its move (films and feeling, or a query); fallbacks counted."""
        prompts = [
            self.prompt(
                agent,
                "page",
                "Choose: watch (give the numbers of the movies you watch and how you felt), next "
                "(another page), search (give a query) or leave.",
                f"The recommender shows:\n{self.listing(pages[agent.profile.name])}",
            )
            for agent in visiting
        ]
        schema = step_schema(self.config.recommender.page_size)
        answers = self.decider.ask("recommender", [a.profile.name for a in visiting], prompts, schema)
        moves = []
        for agent, text in zip(visiting, answers, strict=True):
            page = pages[agent.profile.name]
            value = schema.parse(text)  # valid under the schema, or None
            action = value.get("action") if value else None
            numbers = value.get("items", []) if value else []
            valid = isinstance(numbers, list) and all(
                isinstance(k, int) and 1 <= k <= len(page) for k in numbers
            )
            query = str(value.get("query") or "").strip() if value else ""
            if action not in PAGE_ACTIONS or (action == "watch" and (not numbers or not valid)):
                self.counts["fallback:recommender"] += 1
                moves.append(Move("fallback", answer=text))
            elif action == "search" and not query:
                self.counts["fallback:empty_search"] += 1
                moves.append(Move("fallback", answer=text))
            elif action == "watch":
                films = tuple(page[k - 1] for k in dict.fromkeys(numbers))
                moves.append(Move("watch", films, feeling=str(value.get("feeling") or "")))
            else:
                moves.append(Move(action, query=query if action == "search" else ""))
        return moves

    def page_step_scored(self, visiting: list[Agent], pages: dict) -> list[Move]:
        """The action by score (features weighing in), then the film by score, a query by generation."""
        names = [a.profile.name for a in visiting]
        listing = {a.profile.name: self.listing(pages[a.profile.name]) for a in visiting}
        options = "\n".join(f"{a}: {PAGE_TEXT[a]}" for a in PAGE_ACTIONS)
        prompts = [
            self.prompt(
                a,
                "page",
                f"What do you do? Answer with one word:\n{options}",
                f"The recommender shows:\n{listing[a.profile.name]}",
            )
            for a in visiting
        ]
        actions = self.decider.choose("page", names, prompts, PAGE_ACTIONS, self.features(visiting))
        moves: list[Move | None] = [None] * len(visiting)
        watchers = [k for k, act in enumerate(actions) if act == "watch"]
        for k, item in zip(
            watchers,
            self.pick([visiting[k] for k in watchers], [pages[names[k]] for k in watchers]),
            strict=True,
        ):
            moves[k] = Move("watch", (item,)) if item is not None else Move("fallback")
        searchers = [k for k, act in enumerate(actions) if act == "search"]
        if searchers and self.config.text.search == "template":  # the query is the agent's first interest
            for k in searchers:
                moves[k] = Move("search")  # browse() puts in the template's query
            searchers = []
        if searchers:
            asked = self.decider.ask(
                "search", [names[k] for k in searchers],
                [self.prompt(visiting[k], "page", "What do you search for? Give a short query.", f"The recommender shows:\n{listing[names[k]]}") for k in searchers],
                QUERY,
            )  # fmt: skip
            for k, text in zip(searchers, asked, strict=True):
                value = QUERY.parse(text)
                query = str(value.get("query") or "").strip() if value else ""
                if not query:
                    self.counts["fallback:empty_search"] += 1
                moves[k] = Move("search", query=query) if query else Move("fallback", answer=text)
        for k, act in enumerate(actions):
            if act is None:
                self.counts["fallback:recommender"] += 1
                moves[k] = Move("fallback")
            elif act in ("next", "leave"):
                moves[k] = Move(act)
        return moves

    def pick(self, agents: list[Agent], pages: list[list[int]]) -> list[int | None]:
        """Score mode: the film each agent watches from its page, by score (the adapter's decision)."""
        prompts = [
            watch_messages(a, self.listing(p), self.now, self.round)
            for a, p in zip(agents, pages, strict=True)
        ]
        out: list[int | None] = [None] * len(agents)
        machine = [k for k, a in enumerate(agents) if not self.decider.plays(a.profile.name)]
        numbers = [[str(n) for n in range(1, len(pages[k]) + 1)] for k in machine]  # a film: its number
        scored = self.decider.scores("watch", [prompts[k] for k in machine], numbers)
        for k, scores in zip(machine, scored, strict=True):
            if self.choice is not None:  # the fitted choice model's log-odds, weighted
                scores = scores + self.config.decision.choice_weight * self.choice_scores(agents[k], pages[k])
            out[k] = pages[k][self.decider.draw(scores)]
        for k, agent in enumerate(agents):
            if self.decider.plays(agent.profile.name):
                numbers = [str(n) for n in range(1, len(pages[k]) + 1)]
                answer = self.decider.human.answer("watch", prompts[k], Constraint.choice(numbers)).strip()
                if answer in numbers:
                    out[k] = pages[k][int(answer) - 1]
                else:  # the caller falls back; counted here, as the generate path counts it
                    self.counts["fallback:recommender"] += 1
        return out

    def choice_scores(self, agent: Agent, page: list[int]) -> np.ndarray:
        """The choice model's log-odds of a page's films for this agent: its real history and its
        watches in the run; the site's counts (before the start and in the run)."""
        past = agent_past(agent)
        counts = {
            m: (self.site[m], self.site_stars[m] / self.site[m] if self.site[m] else None) for m in page
        }
        recent = {m: self.recent_past.get(m, 0) + self.site[m] - self.past_counts[m] for m in page}
        return self.choice.score(past, page, counts, recent, int(day(self.now)[:4]))

    def watch(self, watching: list[tuple[Agent, int, str]], events: list) -> None:
        """The films watched at this step, rated in one batch (rating.py), into each agent's log and
        the site's counts; the experience becomes an observation."""
        if not watching:
            return
        n = len(watching)
        stars, sources = self.rater.rate(
            [a for a, _, _ in watching], [m for _, m, _ in watching], [self.now] * n, [self.round] * n
        )
        felt = [(feeling, value) for (_, _, feeling), value in zip(watching, stars, strict=True) if feeling]
        if felt:
            self.check_feelings(felt)
        for (agent, item, feeling), value, source in zip(watching, stars, sources, strict=True):
            agent.rated.append([item, value, self.round])
            self.site[item] += 1
            self.site_stars[item] += value
            self.log(events, agent.profile.name, "watch", item, feeling, stars=value, rated_by=source)
            text = watched_line(self.movies[item].text(), value, day(self.now))
            agent.inbox.append(f"{text} {feeling}".strip())

    def search(self, query: str, exclude: set[int]) -> list[int]:
        """The films whose title, genres and tags match the query best (BM25 over the catalogue of the
        start); only films that match at all (an empty page when none does)."""
        scores = self.index.scores(query)
        blocked = [k for k, i in enumerate(self.catalogue) if i in exclude]
        scores[blocked] = -np.inf
        best = top_indices(scores, self.config.recommender.page_size)
        return [self.catalogue[k] for k in best if scores[k] > 0]

    # -- the social network -------------------------------------------------------------------------------------
    def socialise(self, agents: list[Agent], events: list) -> None:
        contacts = {a.profile.name: sorted(self.graph.get(a.profile.name, ())) for a in agents}
        for agent in agents:
            if not contacts[agent.profile.name]:
                self.counts["social_without_contacts"] += 1
                self.log(events, agent.profile.name, "nothing", reason="no contacts")
        agents = [a for a in agents if contacts[a.profile.name]]
        if not agents:
            return
        if self.config.decision.mode == "generate" and self.config.text.messages == "llm":
            chats, posts = self.social_generated(agents, contacts, events)
        else:
            chats, posts = self.social_chosen(agents, contacts, events)
        for agent, text in posts:  # one post reaches every contact; their memories take it in one batch
            self.log(events, agent.profile.name, "post", text=text, audience=contacts[agent.profile.name])
            agent.inbox.append(f"I posted: {text}")
            for name in contacts[agent.profile.name]:
                self.agents[name].inbox.append(f"{agent.profile.name} posted: {text}")
            self.counts["post_deliveries"] += len(contacts[agent.profile.name])
        self.chat(chats, events)

    def social_context(self, agent: Agent, contacts: list[str]) -> str:
        listing = "\n".join(f"{k}. {c}" for k, c in enumerate(contacts, start=1))
        return f"Your contacts:\n{listing}\n{films_line(agent.recent(self.movies))}"

    def social_generated(self, agents: list[Agent], contacts: dict, events: list) -> tuple[list, list]:
        """One JSON answer per agent: chat (a contact and the opening line) or post (the text)."""
        prompts = [
            self.prompt(
                agent,
                "social",
                "Chat with one contact about films you watched (give their number and your opening line) or "
                "post to all of them (give the post).",
                self.social_context(agent, contacts[agent.profile.name]),
            )
            for agent in agents
        ]
        width = max(len(c) for c in contacts.values())
        schema = social_schema(width)
        answers = self.decider.ask("social", [a.profile.name for a in agents], prompts, schema)
        chats, posts = [], []
        for agent, text in zip(agents, answers, strict=True):
            value = schema.parse(text)
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
        return chats, posts

    def social_chosen(self, agents: list[Agent], contacts: dict, events: list) -> tuple[list, list]:
        """Chat or post as a choice (scored, with the features' weights, in score mode), the contact as a
        choice, the words from the LLM or the template."""
        names = [a.profile.name for a in agents]
        prompts = [
            self.prompt(
                a,
                "social",
                "Do you chat with one contact or post to all of them? Answer chat or post.",
                self.social_context(a, contacts[a.profile.name]),
            )
            for a in agents
        ]
        actions = self.decider.choose("social", names, prompts, ["chat", "post"], self.features(agents))
        chats, posts = [], []
        chatting = [a for a, act in zip(agents, actions, strict=True) if act == "chat"]
        asked = [  # the contact: a question of its own, every chatting agent's in one call
            self.prompt(
                a,
                "social",
                "Which contact do you chat with? Answer with their name.",
                self.social_context(a, contacts[a.profile.name]),
            )
            for a in chatting
        ]
        options = [contacts[a.profile.name] for a in chatting]
        partners = self.decider.choose(
            "contact", [a.profile.name for a in chatting], asked, options, [[]] * len(chatting)
        )
        openings = self.words(
            "open", chatting, [f"Write your opening line to {p} about a film you watched." for p in partners]
        )
        for agent, partner, opening in zip(chatting, partners, openings, strict=True):
            if partner is None or opening is None:
                self.counts["fallback:social"] += 1
                self.log(events, agent.profile.name, "nothing", fallback=True)
                continue
            chats.append((agent, self.agents[partner], opening))
        posting = [a for a, act in zip(agents, actions, strict=True) if act == "post"]
        for agent, text in zip(
            posting,
            self.words(
                "post",
                posting,
                ["Write a short post for all your friends about a film you watched."] * len(posting),
            ),
            strict=True,
        ):
            if text is None:
                self.counts["fallback:social"] += 1
                self.log(events, agent.profile.name, "nothing", fallback=True)
                continue
            posts.append((agent, text))
        for agent, act in zip(agents, actions, strict=True):
            if act is None:
                self.counts["fallback:social"] += 1
                self.log(events, agent.profile.name, "nothing", fallback=True)
        return chats, posts

    def words(
        self,
        kind: str,
        agents: list[Agent],
        instructions: list[str],
        context: list[str] | None = None,
        nth: list[int] | None = None,
    ) -> list[str | None]:
        """Messages: the template's (text.messages: template) or the LLM's (None when unusable); `nth`
        counts each speaker's earlier lines in its chat (the template's films move on with it)."""
        if not agents:
            return []
        if self.config.text.messages == "template":
            self.counts["template_messages"] += len(agents)
            return [
                template_message(kind, a.recent(self.movies), nth[k] if nth else 0)
                for k, a in enumerate(agents)
            ]
        decision = "post" if kind == "post" else "chat"
        prompts = [
            self.prompt(
                a,
                decision,
                instruction,
                "\n".join(filter(None, [context[k] if context else "", films_line(a.recent(self.movies))])),
            )
            for k, (a, instruction) in enumerate(zip(agents, instructions, strict=True))
        ]
        out = []
        for text in self.decider.ask(decision, [a.profile.name for a in agents], prompts, SAY):
            value = SAY.parse(text)
            out.append(str(value["say"]) if value and str(value.get("say") or "").strip() else None)
        return out

    def chat(self, chats: list, events: list) -> None:
        """Two-sided chats, turn by turn, every chat's turn in one batch; or one call per dialogue."""
        if not chats:
            return
        dialogues = [[(a.profile.name, opening)] for a, _, opening in chats]
        if self.config.chat == "one-call" and self.config.text.messages == "llm":
            prompts = [
                self.prompt(
                    a,
                    "chat",
                    f"Write the rest of your chat with {b.profile.name} ({b.profile.summary()}), both sides, a few lines.",
                    f"You said: {opening}\n{films_line(a.recent(self.movies))}",
                )
                for a, b, opening in chats
            ]
            answers = self.decider.ask("chat", [a.profile.name for a, _, _ in chats], prompts, SAY)
            for (a, _, _), dialogue, text in zip(chats, dialogues, answers, strict=True):
                value = SAY.parse(text)
                if not value or not value.get("say"):
                    self.counts["fallback:chat"] += 1
                    self.log(events, a.profile.name, "chat-turn", fallback=True, answer=text)
                    continue
                dialogue.append(("(one call)", str(value["say"])))
        else:
            for turn in range(2 * CHAT_TURNS - 1):
                speakers = [(b if turn % 2 == 0 else a, a if turn % 2 == 0 else b) for a, b, _ in chats]
                lines = ["\n".join(f"{who}: {said}" for who, said in d) for d in dialogues]
                said = self.words(
                    "reply",
                    [me for me, _ in speakers],
                    [f"Reply to {other.profile.name} in one or two sentences." for _, other in speakers],
                    [f"Your chat so far:\n{text}" for text in lines],
                    [
                        sum(who == me.profile.name for who, _ in d)
                        for (me, _), d in zip(speakers, dialogues, strict=True)
                    ],
                )
                for (me, _), dialogue, text in zip(speakers, dialogues, said, strict=True):
                    if text is None:
                        self.counts["fallback:chat"] += 1
                        self.log(events, me.profile.name, "chat-turn", fallback=True)
                        continue
                    dialogue.append((me.profile.name, text))
        for (a, b, _), dialogue in zip(chats, dialogues, strict=True):
            text = "\n".join(f"{who}: {said}" for who, said in dialogue)
            self.log(
                events,
                a.profile.name,
                "chat",
                text=text,
                partner=b.profile.name,
                mode=self.config.chat,
                messages=[s for _, s in dialogue],
            )
            for me, other in ((a, b), (b, a)):
                me.inbox.append(f"I chatted with {other.profile.name}:\n{text}")

    # -- memory ------------------------------------------------------------------------------------------------
    def remember(self) -> None:
        """Every agent's observations of the round, compressed in one batched call, then stored."""
        if remember(list(self.agents.values()), self.model, self.round):
            self.counts["llm_batches"] += 1
        self.check_memory()

    def interview(self, name: str, question: str) -> str:
        agent = self.agents[name]
        prompt = self.prompt(
            agent,
            "interview",
            f"Answer the interviewer: {question}",
            f"An interviewer asks you a question.\n{films_line(agent.recent(self.movies))}",
        )
        value = SAY.parse(self.decider.ask("interview", [name], [prompt], SAY)[0])
        answer = str(value["say"]) if value and value.get("say") else "(no usable answer)"
        watched = agent.seen()
        template = "I watched " + "; ".join(t for t, _ in agent.recent(self.movies)) + "."
        self.written.append(
            {
                "kind": "interview",
                "by": "llm",
                "text": answer,
                "passed": interview_truthful(answer, watched, self.titles),
                "template_passed": interview_truthful(template, watched, self.titles),
            }
        )
        return answer

    # -- what the LLM writes, checked (textcheck.py) --------------------------------------------------------------
    def check_feelings(self, felt: list[tuple[str, float]]) -> None:
        if self.vader is None:
            from agents.encoders import VaderSentiment

            self.vader = VaderSentiment(offline=True)
        scores = self.vader([f for f, _ in felt] + [verdict(v) for _, v in felt])
        own, templates = scores[: len(felt)], scores[len(felt) :]
        for (feeling, value), mine, template in zip(felt, own, templates, strict=True):
            self.written.append(
                {
                    "kind": "feeling",
                    "by": "llm",
                    "text": feeling,
                    "passed": feeling_agrees(float(mine), value),
                    "template_passed": feeling_agrees(float(template), value),
                }
            )

    def template_query(self, agent: Agent) -> str:
        return agent.profile.interests[0] if agent.profile.interests else ""

    def check_search(self, agent: Agent, query: str, found: list[int], exclude: set[int]) -> None:
        genres, template = self.genres, self.template_query(agent)
        interests = agent.profile.interests
        self.written.append(
            {
                "kind": "search",
                "by": self.config.text.search,
                "text": query,
                "passed": search_on_taste(found, genres, interests),
                "template_passed": bool(template)
                and search_on_taste(self.search(template, exclude), genres, interests),
            }
        )

    def check_memory(self) -> None:
        """The memory's new texts: each grounded in the memories it was made from? Its template, the first
        of them, is checked the same way."""
        for kind, text, sources in self.model.written:
            self.written.append(
                {
                    "kind": kind,
                    "by": "llm",
                    "text": text,
                    "passed": grounded(text, sources, self.titles),
                    "template_passed": grounded(sources[0], sources, self.titles),
                }
            )
        self.model.written = []

    def text_checks(self) -> dict:
        """Per kind of text this round: how many, the share that passed its check, the same for the
        template, and distinct-2; then the round's texts are cleared."""
        out = {}
        for kind in sorted({w["kind"] for w in self.written}):
            rows = [w for w in self.written if w["kind"] == kind]
            out[kind] = {
                "texts": len(rows),
                "by": rows[0]["by"],
                "passed": round(float(np.mean([w["passed"] for w in rows])), 4),
                "template_passed": round(float(np.mean([w["template_passed"] for w in rows])), 4),
                "distinct_2": round(distinct([words(w["text"]) for w in rows], 2), 4),
            }
        self.written = []
        return out

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
        messages = [m for e in events if e["action"] == "chat" for m in e["messages"]]
        messages += [e["text"] for e in events if e["action"] == "post"]
        tokenised = [words(m) for m in messages]
        stars = [e["stars"] for e in events if e["action"] == "watch"]
        return {
            "round": self.round,
            "active_agents": active,
            "watches": actions["watch"],
            "mean_stars": round(float(np.mean(stars)), 3) if stars else None,
            "chats": actions["chat"],
            "posts": actions["post"],
            "items_shown": len(shown),
            "exposure_genre_entropy": entropy,
            "messages": len(messages),
            "messages_distinct_2": round(distinct(tokenised, 2), 4) if messages else None,
            "messages_repeating_4gram": round(sum(map(repeats_ngram, tokenised)) / len(messages), 4)
            if messages
            else None,
            "messages_by": self.config.text.messages,
            "text_checks": self.text_checks(),
        }

    # -- checkpoints -----------------------------------------------------------------------------------------
    def state(self) -> dict:
        return {
            "round": self.round,
            "start": self.start,
            "rng": self.rng.bit_generator.state,
            "counts": dict(self.counts),
            "model_counts": dict(self.model.counts),
            "graph": {k: sorted(v) for k, v in self.graph.items()},
            "feed": {"fitted_on": self.fitted_on, "seed": getattr(self.feed.recommender, "seed", None)},
            "stars": self.rater.state(),
            "agents": [
                {
                    "profile": asdict(a.profile),
                    "activity": a.activity,
                    "rated": a.rated,
                    "memory": a.memory.to_json(),
                }
                for a in self.agents.values()
            ],
        }

    def restore(self, state: dict) -> None:
        self.round = state["round"]
        self.counts.clear()
        self.counts.update(state["counts"])
        self.model.counts = Counter(state["model_counts"])
        self.graph = {k: set(v) for k, v in state["graph"].items()}
        self.site, self.site_stars = Counter(self.past_counts), Counter(self.past_stars)
        self.agents = {}
        for entry in state["agents"]:
            profile = Profile(**entry["profile"])
            agent = Agent(
                profile, Memory(self.config.memory, self.embed, self.model, self.rng), entry["activity"]
            )
            agent.rated = [list(r) for r in entry["rated"]]
            agent.memory.load_json(entry["memory"])
            self.agents[profile.name] = agent
            for movie, stars, _ in agent.rated:  # the site's counts: the data's before the start + the run's
                self.site[movie] += 1
                self.site_stars[movie] += stars
        # the recommender exactly as it was after its last fit: same clicks, same seed
        self.fitted_on = [tuple(c) for c in state["feed"]["fitted_on"]]
        self.feed.train(self.history + self.fitted_on, state["feed"]["seed"])
        self.counts.clear()  # a refit that fails again was counted when it first failed
        self.counts.update(state["counts"])
        self.rater.restore(state["stars"])
        self.rng.bit_generator.state = state["rng"]
        for message in state.get("pending_broadcasts", []):  # heard in the next round
            self.broadcast(message)
