"""Conversational recommenders to evaluate: one interface, batched across dialogues.

    crs.reset(); reply = crs.interact("I want sushi tonight")      # one session
    replies = BaseCRS.respond(sessions, texts)                      # many sessions, batched calls

- ``BaseCRS``: a single prompt: the dialogue so far and the catalogue's best BM25 matches for it; the
  LLM answers with its reply and the numbers of the restaurants it recommends (a JSON schema).
- ``AgentCRS``: plans each turn: it updates the preferences the user has stated (likes, dislikes;
  a JSON schema), chooses to ask, recommend or answer (a structured choice), and then asks about what it
  does not know yet, recommends the best catalogue match for the remembered preferences that it has not
  recommended before (the user's dislikes filtered out), or answers about the last recommended place from
  the catalogue's facts.
- ``Assistant``: a plain LLM assistant with no catalogue (the RecLLMSim setting's assistant).

The catalogue is the restaurants of the Yelp sample (``load_restaurants``). Every reply records what was
recommended (catalogue ids), so the simulator knows when to rate the recommendation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from agents.llm import Constraint, Sampling
from agents.retrieval import BM25, top_indices
from agents.runs import json_lines

CANDIDATES = 5


@dataclass
class Restaurant:
    id: str
    name: str
    city: str
    categories: list[str]
    price: str  # "$" to "$$$$", or "" when unknown
    stars: float | None

    def text(self) -> str:
        price = f", {self.price}" if self.price else ""
        return f"{self.name} ({', '.join(self.categories)}; {self.city}{price})"


def load_restaurants(path) -> list[Restaurant]:
    """The Yelp sample's businesses that are restaurants or food places; a malformed line is an error
    naming the line (the catalogue is small and must be whole)."""
    out = []
    for number, item in json_lines(path):
        try:
            categories = [c.strip() for c in (item.get("categories") or "").split(",") if c.strip()]
        except AttributeError as err:
            raise SystemExit(f"error: {path} line {number}: {err}") from None
        if not {"Restaurants", "Food"} & set(categories):
            continue
        level = (item.get("attributes") or {}).get("RestaurantsPriceRange2")
        price = "$" * int(level) if str(level).isdigit() else ""
        kept = [c for c in categories if c not in ("Restaurants", "Food")]
        out.append(
            Restaurant(item["item_id"], item["name"], item.get("city", ""), kept, price, item.get("stars"))
        )
    return out


@dataclass
class Session:
    dialogue: list[tuple[str, str]] = field(default_factory=list)  # (role, text)
    recommended: list[str] = field(default_factory=list)  # catalogue ids, in order
    likes: list[str] = field(default_factory=list)
    dislikes: list[str] = field(default_factory=list)
    targets: list[str] = field(default_factory=list)  # a catalogue goal's targets: only the oracle reads them


@dataclass
class Reply:
    text: str
    recommended: list[str] | None  # catalogue ids recommended in this reply; None: not known (Assistant)
    plan: str = ""  # AgentCRS: ask | recommend | answer
    fallback: bool = False  # the LLM's answer was unusable; a fixed reply was given (counted)
    nothing_found: bool = False  # AgentCRS planned to recommend, but no place was left to recommend (counted)
    error: str | None = None  # a plugged-in CRS failed this turn (why); the dialogue ends, nothing is rated
    refused: list[str] = field(default_factory=list)  # item ids it named that the catalogue lacks (counted)
    raw: str | None = None  # with an error: what the CRS sent back, as it came (for a person to see)
    cut_short: bool = False  # the reply stopped at the model's token limit (kept, counted)
    # how ``recommended`` was known: "items" (the CRS said) or "names" (the catalogue names in its text,
    # NameMatcher: a CRS that gives no ids); ambiguous: names found that fit several places (not counted as
    # recommended, counted)
    matched_by: str = "items"
    ambiguous: list[str] = field(default_factory=list)


def disliked(phrase: str, restaurant: Restaurant) -> bool:
    """A disliked phrase matches a place when all its words are whole words of the place's text."""
    words = set(re.findall(r"\w+", restaurant.text().lower()))
    return all(w in words for w in re.findall(r"\w+", phrase.lower()))


class NameMatcher:
    """The catalogue places a reply names, for a CRS that says what it recommends only in words.

    A name is matched as whole words, as the catalogue writes it (case included: "this time" is not the
    place "Time"), the longest name first where names overlap ("Taco Bell Cantina" before "Taco Bell"). A
    one-word name is not matched at the start of a sentence, where any word is capitalised. A name
    several places share (a chain) is settled by the cities named in the dialogue: one place of that name
    in those cities is matched; otherwise the name is ambiguous and nothing is matched for it. Names
    shorter than ``shortest`` characters are not looked for (a place called "Go" would match everywhere)."""

    def __init__(self, catalogue: list[Restaurant], shortest: int = 4):
        self.by_name: dict[str, list[Restaurant]] = {}
        for place in catalogue:
            name = " ".join(place.name.split())
            if len(name) >= shortest:
                self.by_name.setdefault(name, []).append(place)
        self.cities = sorted({p.city for p in catalogue if p.city}, key=len, reverse=True)
        names = sorted(self.by_name, key=len, reverse=True)
        self.pattern = (
            re.compile(
                r"(?<!\w)(" + "|".join(re.escape(n).replace(r"\ ", r"\s+") for n in names) + r")(?!\w)"
            )
            if names
            else None
        )

    def __call__(self, text: str, context: str = "") -> tuple[list[str], list[str]]:
        """(ids matched, in the order named; names found that stay ambiguous). ``context``: the
        dialogue's other text, whose city names settle a chain."""
        if self.pattern is None:
            return [], []
        said = (text + " " + context).lower()
        cities = {c for c in self.cities if re.search(rf"(?<!\w){re.escape(c.lower())}(?!\w)", said)}
        ids, ambiguous = [], []
        for found in self.pattern.finditer(text):
            name = " ".join(found.group(1).split())
            if " " not in name and re.search(r"(^|[.!?:]\s*)$", text[: found.start()]):
                continue  # a one-word name opening a sentence: any word is capitalised there
            places = self.by_name[name]
            if len(places) > 1:
                places = [p for p in places if p.city in cities]
            if len(places) == 1:
                ids.append(places[0].id)
            else:
                ambiguous.append(name)
        return list(dict.fromkeys(ids)), list(dict.fromkeys(ambiguous))


class CRS:
    """One session of a recommender; ``respond`` serves many sessions with batched LLM calls."""

    name = "crs"

    def __init__(
        self, backend, catalogue: list[Restaurant], temperature: float = 0.7, seed: int = 0, text: str = "llm"
    ):
        """text: llm (the LLM writes each reply) or template (a fixed sentence states the same move: the
        place chosen, the question asked; for a backbone that cannot write a readable reply)."""
        self.backend, self.catalogue, self.text = backend, catalogue, text
        self.sampling = Sampling(140, temperature, 1.0, seed)
        self.index = BM25([r.text() for r in catalogue]) if catalogue else None
        self.by_id = {r.id: r for r in catalogue}
        self.session = Session()

    def reset(self) -> None:
        self.session = Session()

    def interact(self, text: str) -> str:
        return self.respond([self.session], [text])[0].text

    def transcript(self, session: Session, last: int = 6) -> str:
        return "\n".join(f"{'User' if r == 'user' else 'You'}: {t}" for r, t in session.dialogue[-last:])

    def matches(self, query: str, exclude: set[str], n: int = CANDIDATES) -> list[Restaurant]:
        scores = self.index.scores(query)
        blocked = [k for k, r in enumerate(self.catalogue) if r.id in exclude]
        scores[blocked] = -1e9
        return [self.catalogue[k] for k in top_indices(scores, n) if scores[k] > -1e9]

    def ask(self, prompts: list[str], constraint: Constraint) -> list[dict | None]:
        """Batched; each answer valid under the constraint's schema, or None."""
        answers = self.backend.generate(
            [[{"role": "user", "content": p}] for p in prompts], self.sampling, constraint
        )
        return [constraint.parse(answer.text) for answer in answers]


REPLY = Constraint.json_object(
    reply={"type": "string", "minLength": 1, "maxLength": 400},
    recommend={
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": CANDIDATES},
        "maxItems": 2,
    },
)
SAY = Constraint.json_object(reply={"type": "string", "minLength": 1, "maxLength": 400})
FALLBACK = "Sorry, could you tell me more about what you are looking for?"
ASK = "What are you in the mood for: a kind of food, a price, a part of town?"


class BaseCRS(CRS):
    name = "base"

    def respond(self, sessions: list[Session], texts: list[str]) -> list[Reply]:
        prompts, shown = [], []
        for session, text in zip(sessions, texts, strict=True):
            session.dialogue.append(("user", text))
            candidates = self.matches(" ".join(t for r, t in session.dialogue if r == "user"), set())
            shown.append(candidates)
            listing = "\n".join(f"{k}. {r.text()}" for k, r in enumerate(candidates, start=1))
            prompts.append(
                "You are a restaurant recommender. Help the user choose a restaurant from these places:\n"
                f"{listing}\nThe conversation:\n{self.transcript(session)}\n"
                "Reply to the user; give the numbers of the places you recommend (0 or none if you do not "
                "recommend yet)."
            )
        replies = []
        for session, candidates, value in zip(sessions, shown, self.ask(prompts, REPLY), strict=True):
            if value is None or not value["reply"].strip():
                reply = Reply(FALLBACK, [], fallback=True)
            else:  # 0 means "none yet" (the schema allows 0 to the number of places shown)
                numbers = [n for n in value["recommend"] if 1 <= n <= len(candidates)]
                places = [candidates[n - 1] for n in dict.fromkeys(numbers)]
                words = (
                    " ".join(naming(p) for p in places) or ASK if self.text == "template" else value["reply"]
                )
                reply = Reply(named(words, places), [p.id for p in places])
            session.dialogue.append(("assistant", reply.text))
            session.recommended += reply.recommended
            replies.append(reply)
        return replies


PREFERENCES = Constraint.json_object(
    likes={"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 4},
    dislikes={"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 4},
)
PLANS = ["ask", "recommend", "answer"]


class AgentCRS(CRS):
    name = "agent"

    def respond(self, sessions: list[Session], texts: list[str]) -> list[Reply]:
        for session, text in zip(sessions, texts, strict=True):
            session.dialogue.append(("user", text))
        # 1. remember what the user said they like and dislike
        stated = self.ask(
            [
                "What food or restaurant features does the user say they like or dislike in this message? "
                f"Use short phrases.\nMessage: {text}"
                for text in texts
            ],
            PREFERENCES,
        )
        for session, value in zip(sessions, stated, strict=True):
            if value:  # phrases of at least 3 characters (an empty dislike would match every place)
                likes = [p.strip() for p in value["likes"] if len(p.strip()) >= 3]
                dislikes = [p.strip() for p in value["dislikes"] if len(p.strip()) >= 3]
                session.likes = list(dict.fromkeys([*session.likes, *likes]))[-6:]
                session.dislikes = list(dict.fromkeys([*session.dislikes, *dislikes]))[-6:]
        # 2. plan: ask, recommend or answer
        plans = self.backend.generate(
            [
                [
                    {
                        "role": "user",
                        "content": "You are a restaurant recommender planning your next move. The user likes: "
                        f"{', '.join(s.likes) or 'unknown'}; dislikes: {', '.join(s.dislikes) or 'unknown'}. "
                        f"You have recommended {len(s.recommended)} places.\n{self.transcript(s)}\n"
                        "Do you ask a question, recommend a place, or answer the user's question? One word: "
                        "ask, recommend or answer.",
                    }
                ]
                for s in sessions
            ],
            self.sampling,
            Constraint.choice(PLANS),
        )
        plans = [p.text.strip() if p.text.strip() in PLANS else "ask" for p in plans]
        if any(p == "answer" for p in plans):  # nothing recommended yet: nothing to answer about
            plans = [
                p if p != "answer" or s.recommended else "recommend"
                for p, s in zip(plans, sessions, strict=True)
            ]
        # 3. act: the place to recommend is chosen from the catalogue, not by the LLM
        prompts, picks = [], []
        for session, plan in zip(sessions, plans, strict=True):
            pick = None
            if plan == "recommend":
                query = " ".join(session.likes) or " ".join(t for r, t in session.dialogue if r == "user")
                avoid = set(session.recommended) | {
                    r.id for r in self.catalogue if any(disliked(d, r) for d in session.dislikes)
                }
                found = self.matches(query, avoid, 1)
                pick = found[0] if found else None
            elif plan == "answer":
                pick = self.by_id[session.recommended[-1]]
            picks.append(pick)
            instruction = {
                "ask": "Ask the user one question about what they want (cuisine, price, place, occasion).",
                "recommend": f"Recommend this place and say why it fits: {pick.text() if pick else 'none found'}.",
                "answer": f"Answer the user's question about this place from these facts: {pick.text() if pick else ''}"
                + (f", rated {pick.stars} stars" if pick and pick.stars else "")
                + ".",
            }[plan]
            prompts.append(f"You are a restaurant recommender.\n{self.transcript(session)}\n{instruction}")
        if self.text == "template":
            said = [{"reply": self.template(plan, pick)} for plan, pick in zip(plans, picks, strict=True)]
        else:
            said = self.ask(prompts, SAY)
        replies = []
        for session, plan, pick, value in zip(sessions, plans, picks, said, strict=True):
            if value is None or not value["reply"].strip():
                reply = Reply(FALLBACK, [], plan=plan, fallback=True)
            else:
                places = [pick] if plan == "recommend" and pick else []
                reply = Reply(
                    named(value["reply"], places),
                    [p.id for p in places],
                    plan=plan,
                    nothing_found=plan == "recommend" and not pick,
                )
            session.dialogue.append(("assistant", reply.text))
            session.recommended += reply.recommended
            replies.append(reply)
        return replies

    @staticmethod
    def template(plan: str, pick: Restaurant | None) -> str:
        if plan == "recommend":
            return naming(pick) if pick else "I could not find a place I have not suggested yet that fits."
        if plan == "answer" and pick:
            return (
                f"{pick.name} serves {', '.join(pick.categories[:3]) or 'food'} in {pick.city}"
                + (f", {pick.price}" if pick.price else "")
                + (f", rated {pick.stars:g} stars on Yelp." if pick.stars else ".")
            )
        return ASK


class Assistant(CRS):
    """A plain LLM assistant (the RecLLMSim setting): no catalogue, no recommendations recorded."""

    name = "assistant"

    def respond(self, sessions: list[Session], texts: list[str]) -> list[Reply]:
        conversations = []
        for session, text in zip(sessions, texts, strict=True):
            session.dialogue.append(("user", text))
            conversations.append(
                [{"role": "system", "content": "You are a helpful assistant."}]
                + [{"role": r, "content": t} for r, t in session.dialogue[-6:]]
            )
        answers = [a.text for a in self.backend.generate(conversations, self.sampling)]
        replies = []
        for session, answer in zip(sessions, answers, strict=True):
            reply = Reply(answer.strip() or FALLBACK, None, fallback=not answer.strip())
            session.dialogue.append(("assistant", reply.text))
            replies.append(reply)
        return replies


def naming(place: Restaurant) -> str:
    stars = f", {place.stars:g} stars on Yelp" if place.stars else ""
    return f"I recommend {place.name} ({', '.join(place.categories[:3])}; {place.city}{', ' + place.price if place.price else ''}{stars})."


def named(text: str, places: list[Restaurant]) -> str:
    """A reply that recommends places names them: a place the LLM's words leave out is added plainly."""
    missing = [p for p in places if p.name.lower() not in text.lower()]
    return " ".join([text.strip(), *(naming(p) for p in missing)])


class RandomCRS(CRS):
    """The ladder's floor: a catalogue place drawn at random each turn (never twice), named plainly."""

    name = "random"

    def __init__(self, backend, catalogue, temperature=0.7, seed=0, text="template"):
        super().__init__(backend, catalogue, temperature, seed, "template")  # no LLM: always the template
        self.rng = np.random.default_rng(seed)

    def respond(self, sessions: list[Session], texts: list[str]) -> list[Reply]:
        replies = []
        for session, text in zip(sessions, texts, strict=True):
            session.dialogue.append(("user", text))
            left = [r for r in self.catalogue if r.id not in session.recommended] or self.catalogue
            place = left[int(self.rng.integers(len(left)))]
            reply = Reply(naming(place), [place.id])
            session.dialogue.append(("assistant", reply.text))
            session.recommended += reply.recommended
            replies.append(reply)
        return replies


class OracleCRS(CRS):
    """The ladder's ceiling: recommends the goal's targets in order, named plainly. It reads what no real
    CRS knows (``Session.targets``): an instrument to check that the simulator can tell good from bad."""

    name = "oracle"

    def respond(self, sessions: list[Session], texts: list[str]) -> list[Reply]:
        replies = []
        for session, text in zip(sessions, texts, strict=True):
            session.dialogue.append(("user", text))
            left = [i for i in session.targets if i not in session.recommended] or session.targets[-1:]
            place = self.by_id[left[0]]
            reply = Reply(self.say(place, session), [place.id])
            session.dialogue.append(("assistant", reply.text))
            session.recommended += reply.recommended
            replies.append(reply)
        return replies

    def say(self, place: Restaurant, session: Session) -> str:
        return naming(place)


OFF_TOPIC = ["Nice weather today.", "I do not know.", "Anyway.", "Whatever you say."]
PRICE_WORDS = {"$": "cheap", "$$": "moderately priced", "$$$": "pricey", "$$$$": "very expensive"}


class IgnoringOracle(OracleCRS):
    """A rung of known-bad language and action: the oracle's places, in a curt reply that ignores what the
    user said (an off-topic remark, then the bare name; no question answered, no feedback taken up). Its
    recommendation quality equals the oracle's; its language and action ratings should be lower."""

    name = "oracle-ignores"

    def say(self, place: Restaurant, session: Session) -> str:
        return f"{OFF_TOPIC[len(session.dialogue) // 2 % len(OFF_TOPIC)]} {place.name}."


class ExplainingOracle(OracleCRS):
    """A rung of known-good language and action: the oracle's places, each explained against the needs
    the user stated in the dialogue (the city, kinds of food and price words of the user's messages that
    the place matches), with the place's facts. The same places as ``IgnoringOracle``: only the words
    differ, so the paired language and action ratings must favour this rung."""

    name = "oracle-explains"

    def say(self, place: Restaurant, session: Session) -> str:
        asked = " ".join(t for r, t in session.dialogue if r == "user").lower()

        def stated(words: str) -> bool:
            return re.search(rf"(?<!\w){re.escape(words.lower())}(?!\w)", asked) is not None

        needs = [c for c in place.categories if stated(c)]
        if place.price and stated(PRICE_WORDS[place.price]):
            needs.append(PRICE_WORDS[place.price])
        if place.city and stated(place.city):
            needs.append(f"in {place.city}")
        facts = f"{', '.join(place.categories[:3]) or 'food'} in {place.city}" + (
            f", {PRICE_WORDS[place.price]} ({place.price})" if place.price else ""
        )
        rated = f" It is rated {place.stars:g} stars on Yelp." if place.stars else ""
        if needs:
            opening = f"You asked for something {', '.join(needs)}, so I recommend {place.name}: it serves "
        else:
            opening = f"You have not told me your needs yet, so I recommend a well-liked place, {place.name}: it serves "
        follow = (
            "" if needs else " Tell me what food, price or part of town you would like, and I will refine it."
        )
        return f"{opening}{facts}.{rated}{follow}"


RECOMMENDERS = {
    "base": BaseCRS,
    "agent": AgentCRS,
    "assistant": Assistant,
    "random": RandomCRS,
    "oracle": OracleCRS,
    "oracle-ignores": IgnoringOracle,
    "oracle-explains": ExplainingOracle,
}
ORACLES = ("oracle", "oracle-ignores", "oracle-explains")  # they read the goal's targets (personas: goals)
