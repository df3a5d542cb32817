"""Personas for the conversational simulator, sampled from dictionaries with prior distributions.

- **Basic information and preferences** come from RecLLMSim's tag dictionary
  (``user_profiling/desc_translated.json``: personality, occupation, interests, travel, dining,
  spending, other aspects) with priors *estimated from the data*: each tag's count among the 31 real
  people's profiles (their Chinese tags mapped through the dictionary), plus one for every tag of the
  dictionary (so a tag nobody chose can still be drawn; "Others" is left out). Gender and age come from
  the real people and the 100 profiles of the preference pool together. ``estimate_priors`` reports
  tags it could not map.
- **Environment** (place, time, company) and the **behaviour traits** (language pattern: information
  richness, formality, message length; action pattern: decisive or hesitant, exploratory or
  conservative) have no data: their priors are set by hand in the config (``priors``; docs/converse.md).
- **Conflicts**: after sampling, the LLM reads all of a persona's attributes and says whether two
  contradict each other and which to drop (a structured answer naming one of the persona's own values;
  ``resolve_conflicts``); every drop is logged on the persona (``resolutions``), an unusable answer
  leaves the persona as drawn and is counted.
- **Task context**: a RecLLMSim template (``task_context_en.xlsx``) with its slots filled at random;
  the Yelp setting's restaurant task is placed in a city of the catalogue instead of the template's
  Tsinghua University.

Every draw comes from the run's one generator.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from data_prep import recllmsim

ATTRIBUTES = recllmsim.PROFILE_KEYS[2:]  # the tag dictionary's attributes (all but gender and age)
LEAVE_OUT = {"Others", "No description"}


@dataclass
class Persona:
    id: int
    gender: str
    age: int
    occupation: str
    personality: list[str]
    interests: list[str]
    travel: list[str]  # travel habits
    spending: list[str]
    preferences: list[str]  # dining preferences (the Yelp setting recommends on these)
    dislikes: list[str]
    other: list[str]  # other aspects (the dictionary's last attribute)
    place: str
    time: str
    company: str
    language: dict[str, str]  # information_richness, formality, message_length -> level
    action: dict[str, str]  # decisiveness, exploration -> level
    task: str  # the task context
    task_type: str
    resolutions: list[dict] = field(default_factory=list)  # conflicts and how the LLM resolved them
    goal: dict | None = (
        None  # a catalogue task: a real Yelp user's goal and targets (agents/converse/goals.py)
    )
    adopted: list[dict] = field(default_factory=list)  # preferences adopted in a dialogue (excitation)

    def describe(self) -> str:
        lines = [
            f"You are a {self.age}-year-old {self.gender.lower()} {self.occupation.lower()}, "
            f"{', '.join(p.lower() for p in self.personality)}.",
            f"Interests: {', '.join(self.interests)}. Spending: {', '.join(self.spending)}.",
            f"Travel: {', '.join(self.travel) or 'no habits'}. Also: {', '.join(self.other) or 'nothing else'}.",
            f"Food you like: {', '.join(self.preferences)}."
            + (f" Food you dislike: {', '.join(self.dislikes)}." if self.dislikes else ""),
            f"Right now you are {self.place}, in the {self.time}, {self.company}.",
        ]
        if self.adopted:
            lines.append(f"You recently came to like: {', '.join(a['preference'] for a in self.adopted)}.")
        return "\n".join(lines)

    def style(self) -> str:
        """The language pattern in words, for the response prompt (a trait added by config is named as
        it is: "politeness: high")."""
        words = {
            "message_length": {
                "short": "Keep your message short.",
                "medium": "Write a message of ordinary length.",
                "long": "Write a long, full message.",
            },
            "formality": {
                "low": "Write casually.",
                "medium": "Write in a neutral tone.",
                "high": "Write formally.",
            },
            "information_richness": {
                "low": "Say little about what you need.",
                "medium": "Say some of what you need.",
                "high": "Say in detail what you need.",
            },
        }
        return " ".join(
            words.get(trait, {}).get(level, f"Your {trait.replace('_', ' ')}: {level}.")
            for trait, level in self.language.items()
        )

    def to_json(self) -> dict:
        return asdict(self)

    def goal_of(self):
        from agents.converse.goals import Goal

        return Goal(**self.goal) if self.goal else None


def estimate_priors(loaded, tags: dict[str, dict[str, str]], pool: list[dict]) -> tuple[dict, dict]:
    """Per attribute, English tag -> weight (count among the real people's profiles + 1), and gender and
    age samples (real people and the preference pool); with a report of tags that did not map."""
    people = {c.persona: c.profile for c in loaded.conversations if c.source == "human"}
    priors: dict[str, Counter] = {}
    unmapped: Counter = Counter()
    for attribute in ATTRIBUTES:
        counts = Counter({english: 1 for english in tags[attribute].values() if english not in LEAVE_OUT})
        for profile in people.values():
            values = profile[attribute] if isinstance(profile[attribute], list) else [profile[attribute]]
            for value in values:
                english = tags[attribute].get(value)
                if english is None:
                    unmapped[f"{attribute}:{value}"] += 1
                elif english not in LEAVE_OUT:
                    counts[english] += 1
        priors[attribute] = counts
    genders = [str(p["gender"]) for p in people.values()] + [p["Gender"] for p in pool if "Gender" in p]
    ages = [int(p["age"]) for p in people.values()] + [
        int(p["Age"]) for p in pool if str(p.get("Age", "")).isdigit()
    ]
    priors["gender"] = Counter(genders)
    priors["age"] = Counter(ages)
    report = {"people": len(people), "pool": len(pool), "unmapped_tags": dict(unmapped)}
    return {k: dict(v) for k, v in priors.items()}, report


def draw(weights: dict, rng: np.random.Generator, k: int = 1, exclude=()) -> list:
    options = [o for o in weights if o not in exclude]
    p = np.array([weights[o] for o in options], dtype=float)
    picked = rng.choice(len(options), size=min(k, len(options)), replace=False, p=p / p.sum())
    return [options[i] for i in picked]


_SLOT = re.compile(r"\[([A-Z]+)(?::(\{[^\]]*\}))?\]")


def fill_template(template: str, slots: dict[str, list[str]], rng: np.random.Generator, fixed=None) -> str:
    """A task-context template with every [SLOT] filled: each slot drawn once (so [TARGET] is the same
    everywhere), options may hold slots themselves, [SLOT:{json}] maps a drawn value to a phrase."""
    chosen = dict(fixed or {})

    def value(name: str) -> str:
        if name not in chosen:
            options = slots.get(name)
            if not options:
                raise ValueError(f"template slot [{name}] has no options")
            chosen[name] = options[int(rng.integers(len(options)))]
        return chosen[name]

    def replace(match: re.Match) -> str:
        name, mapping = match.group(1), match.group(2)
        if mapping:
            return json.loads(mapping)[value(name)]
        return value(name)

    text = template
    for _ in range(5):  # options nest at most a couple of levels
        text, n = _SLOT.subn(replace, text)
        if not n:
            return text
    raise ValueError(f"template slots nest too deep: {template!r}")


def sample_personas(
    n: int,
    priors: dict,
    contexts: dict,
    config,
    rng: np.random.Generator,
    task_types: list[str],
    cities=None,
    goals=None,
) -> list[Persona]:
    """n personas, each with a task drawn from ``task_types`` (conflicts not yet resolved). With
    ``goals`` (catalogue tasks, agents/converse/goals.py) persona i is goal i's real user: the dining
    preferences and dislikes are that user's categories before the cutoff and the task is placed in the
    goal's city; the rest is drawn as for any persona."""
    hand = config.priors
    personas = []
    for i in range(n):
        preferences = draw(priors["dining_preferences"], rng, hand.preferences)
        task_type = task_types[int(rng.integers(len(task_types)))]
        fixed = {"PLACE": f"downtown {cities[int(rng.integers(len(cities)))]}"} if cities else None
        goal = goals[i] if goals else None
        if goal:
            preferences = list(dict.fromkeys(goal.liked + goal.categories))[: max(hand.preferences, 1) + 1]
            fixed = {"PLACE": f"downtown {goal.city}"}
        template = contexts[task_type]
        personas.append(
            Persona(
                id=i,
                gender=draw(priors["gender"], rng)[0],
                age=int(draw(priors["age"], rng)[0]),
                occupation=draw(priors["occupation"], rng)[0],
                personality=draw(priors["personality"], rng, 2),
                interests=draw(priors["daily_interests"], rng, 2),
                travel=draw(priors["travel_habits"], rng, 1),
                other=draw(priors["other_aspects"], rng, 1),
                spending=draw(priors["spending_habits"], rng, 1),
                preferences=preferences,
                dislikes=list(goal.disliked)
                if goal
                else draw(priors["dining_preferences"], rng, hand.dislikes, exclude=preferences),
                place=draw(hand.place, rng)[0],
                time=draw(hand.time, rng)[0],
                company=draw(hand.company, rng)[0],
                language={trait: draw(weights, rng)[0] for trait, weights in hand.language.items()},
                action={
                    trait: draw(getattr(hand, trait), rng)[0] for trait in ("decisiveness", "exploration")
                },
                task=fill_template(template["prompt"], template["slots"], rng, fixed),
                task_type=task_type,
                goal=goal.to_json() if goal else None,
            )
        )
    return personas


# the attributes whose values a conflict may drop (lists; one occupation or age is not dropped)
DROPPABLE = ("personality", "interests", "travel", "preferences", "dislikes", "spending", "other")


def attribute_lines(persona: Persona) -> list[tuple[str, str]]:
    return [(a, v) for a in DROPPABLE for v in getattr(persona, a)]


def resolve_conflicts(personas: list[Persona], backend, rng, rounds: int = 3) -> dict:
    """Contradictions among a persona's attributes found by the LLM, over all of them: each round asks
    every open persona, in one batch, whether two of its attributes contradict each other and, if so,
    which one to drop (a structured answer: ``contradiction`` and ``drop``, one of the persona's own
    values). A persona leaves the loop when the LLM finds none, after ``rounds`` drops, or on an unusable
    answer (counted, the persona kept as it is). Every drop is logged on the persona (``resolutions``)."""
    from agents.llm import Constraint, Sampling

    counts: Counter = Counter(asked=0, dropped=0)
    sampling = Sampling(64, 0.0, 1.0, int(rng.integers(2**31 - 1)))
    open_ = [p for p in personas if len(attribute_lines(p)) > 1]
    for _ in range(rounds):
        if not open_:
            break
        conversations, constraints = [], []
        for p in open_:
            lines = attribute_lines(p)
            listing = "\n".join(f"- {a}: {v}" for a, v in lines)
            conversations.append([{"role": "user", "content": (
                f"A person is described by these attributes:\n{listing}\nDo two of them contradict each other "
                "(they could not both be true of one person)? If so, name the one to drop.")}])  # fmt: skip
            constraints.append(Constraint.json_object(
                contradiction={"type": "boolean"}, drop={"type": "string", "enum": [v for _, v in lines]}))  # fmt: skip
        answers = []
        for constraint in dict.fromkeys(constraints):  # one batch per distinct answer schema
            index = [k for k, c in enumerate(constraints) if c == constraint]
            got = backend.generate([conversations[k] for k in index], sampling, constraint)
            answers += [(k, constraint, a.text) for k, a in zip(index, got, strict=True)]
        counts["asked"] += len(open_)
        still = []
        for k, constraint, answer in sorted(answers, key=lambda x: x[0]):
            persona, value = open_[k], constraint.parse(answer)
            if value is None:
                counts["unusable_answers"] += 1
                continue
            if not value["contradiction"]:
                continue
            attribute = next(a for a, v in attribute_lines(persona) if v == value["drop"])
            getattr(persona, attribute).remove(value["drop"])
            persona.resolutions.append({"attribute": attribute, "dropped": value["drop"], "answer": answer})
            counts["dropped"] += 1
            if len(attribute_lines(persona)) > 1:
                still.append(persona)
        open_ = still
    return dict(counts)


def load_sources(root):
    """What sampling needs from RecLLMSim: priors (with their report) and the task contexts."""
    loaded = recllmsim.load(root)
    tags = recllmsim.load_tag_dictionary(root)
    pool, _ = recllmsim.load_preference_pool(root)
    priors, report = estimate_priors(loaded, tags, pool)
    return priors, report, recllmsim.load_task_contexts(root)
