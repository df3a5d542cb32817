"""A scripted, deterministic backend and encoder for the sandbox tests."""

import json

from agents.llm import Answer, Constraint
from agents.retrieval import hashed_bag_of_words


def embed(texts):
    """A deterministic stand-in for the sentence encoder."""
    return hashed_bag_of_words(texts, 32)


class Scripted:
    """Answers from rules on the prompt; ``places`` says where each agent goes; ``broken`` answers
    garbage for those step kinds."""

    def __init__(self, places, broken=()):
        self.places, self.broken, self.batches = places, set(broken), []

    def generate(self, conversations, sampling, constraint=None):
        self.batches.append(len(conversations))
        return [Answer(self.answer(c, constraint), constrained=True) for c in conversations]

    def answer(self, conversation, constraint: Constraint):
        name = conversation[0]["content"].removeprefix("You are ").split(";")[0].split(".")[0]
        text = conversation[-1]["content"]
        if constraint.kind == "choice":
            if "recommender" not in constraint.options:  # another choice (chat or post, a contact, stars)
                return constraint.options[0]
            return "not a place" if "place" in self.broken else self.places.get(name, "nothing")
        schema = json.loads(constraint.schema)
        keys = set(schema["properties"])
        if "summary" in keys:
            return json.dumps({"summary": text.split("\n")[-1][:200] or "noted", "importance": 8})
        if "action" in keys and "items" in keys:
            return (
                "{broken"
                if "recommender" in self.broken
                else json.dumps({"action": "watch", "items": [1], "query": "", "feeling": f"{name} liked it"})
            )
        if "action" in keys:
            return json.dumps({"action": "post", "contact": 1, "text": f"{name} says hello"})
        if "insight" in keys:
            return json.dumps({"insight": f"{text.splitlines()[-1][:60]} (an insight)"})
        return json.dumps({"say": f"{name} answers"})


class Recording(Scripted):
    """Scripted answers, every prompt kept; agents whose names end in an odd digit browse, the others
    socialise."""

    def __init__(self):
        super().__init__({})
        self.prompts = []

    def answer(self, conversation, constraint):
        self.prompts.append(conversation[0]["content"] + "\n" + conversation[-1]["content"])
        if constraint.kind == "choice":
            name = conversation[0]["content"].removeprefix("You are ").split(";")[0]
            return "recommender" if name.endswith(("1", "3", "5", "7", "9")) else "social"
        return super().answer(conversation, constraint)


class Scoring(Scripted):
    """Scripted answers, and log-probabilities for scored options by rule: ``prefer`` maps an option to
    its log-probability (a dict, others -5; or a function of the option), each option one token long;
    every scored prompt is kept."""

    def __init__(self, places=None, prefer=None, broken=()):
        super().__init__(places or {}, broken)
        self.prefer = prefer if callable(prefer) else (lambda o, table=dict(prefer or {}): table.get(o, -5.0))
        self.scored = []

    def score(self, conversations, options):
        self.scored.append((conversations, options))
        return [[(self.prefer(o), 1) for o in group] for group in options]


def page_titles(conversation) -> dict[str, str]:
    """A page prompt's films by their number: {"1": "Heat (1995)", ...} (the text up to the genres)."""
    text = conversation[-1]["content"]
    if "The recommender shows:\n" not in text:
        return {}
    lines = text.split("The recommender shows:\n")[1].split("\n\n")[0].splitlines()
    return {line.split(". ", 1)[0]: line.split(". ", 1)[1].rsplit(" [", 1)[0] for line in lines}


class PageScoring(Scoring):
    """Scores a page's numbers by the film each stands for (``prefer`` of the film's line, title first);
    other options as Scoring does."""

    def score(self, conversations, options):
        self.scored.append((conversations, options))
        out = []
        for conversation, group in zip(conversations, options, strict=True):
            films = page_titles(conversation)
            out.append([(self.prefer(films[o]) if o in films else self.prefer(o), 1) for o in group])
        return out
