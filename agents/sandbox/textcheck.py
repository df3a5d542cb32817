"""Cheap checks of what the sandbox's LLM writes in an agent's name, one per kind of text.

Each check says whether one text does what it claims; the world counts them per round (World.statistics:
``text_checks``) beside the same check of the template that could stand in for the text, so a reader
sees where the model does worse than a fixed sentence.

- ``feeling`` (generate mode: how the agent felt about a film it watched): its VADER sentiment agrees
  with the stars given (at least 3.5 stars: compound >= -0.05; at most 2.5: compound <= 0.05; 3 stars
  agrees with anything). Template: agents.sandbox.world.verdict(stars).
- ``search`` (a query the agent typed): one of the films the search returns shares a genre with the
  agent's interests. Template: the agent's first interest as the query.
- ``interview`` (an answer to an interviewer): it names at least one film the agent watched (its real
  history or the simulation) and none it did not. Template: its latest films, named.
- ``summary``, ``insight``, ``reflection`` (what the memory writes): grounded in the memories it was made
  from: it shares a content word with them and names no film they do not name. Template: the first
  source memory itself.

Films are named by their title without the year (also with a trailing article moved to the front),
case aside, whole words, titles of at least 5 letters (shorter ones, such as "Up", match ordinary
words); words that are part of a longer title named there do not name the shorter one.
"""

from __future__ import annotations

import re

from agents.text import words

# words too common to show that a text is about its sources
_STOP_WORDS = (
    "the and for with that this from have has had was were are you your his her its they them their "
    "about into than then there what which when where who will would could should been being just very "
    "some more most much many other over also only like really movie movies film films watch watched "
    "one two because after before again these those such"
)
STOP = frozenset(_STOP_WORDS.split())
MIN_TITLE = 5


def content_words(text: str) -> set[str]:
    return {w for w in words(text) if len(w) >= 3 and w not in STOP and not w.isdigit()}


def bare_titles(title: str) -> set[str]:
    """The ways a film is named: 'Matrix, The (1999)' -> {'the matrix', 'matrix the'}, words only."""
    title = re.sub(r"\s*\(\d{4}\)\s*$", "", title).strip()
    names = {" ".join(words(title))}
    head, comma, article = title.rpartition(", ")
    if comma and article in ("The", "A", "An"):
        names.add(" ".join(words(f"{article} {head}")))
    return {n for n in names if len(n.replace(" ", "")) >= MIN_TITLE}


class Titles:
    """Each film (id -> title) whose bare title is long enough to name it, as a whole-words pattern,
    found by its first word (one dictionary look-up per word of a text, not a pattern per film)."""

    def __init__(self, titles: dict[int, str]):
        self.by_first: dict[str, list[tuple[int, re.Pattern]]] = {}
        for movie, title in sorted(titles.items()):
            for name in bare_titles(title):
                pattern = re.compile(rf"\b{re.escape(name)}\b")
                self.by_first.setdefault(name.split()[0], []).append((movie, pattern))

    def candidates(self, said: str) -> list[tuple[int, re.Pattern]]:
        return [entry for word in set(said.split()) for entry in self.by_first.get(word, ())]


def title_index(titles: dict[int, str]) -> Titles:
    return Titles(titles)


def films_named(text: str, index: Titles) -> set[int]:
    """The films of ``index`` (title_index) whose title occurs in ``text``, except where the words are
    part of a longer title that occurs there ("Enemy" inside "Enemy of the State")."""
    said = " ".join(words(text))
    found = [
        (m.start(), m.end(), movie)
        for movie, pattern in index.candidates(said)
        for m in pattern.finditer(said)
    ]
    inside = {
        (a, b, movie) for a, b, movie in found for c, d, _ in found if c <= a and b <= d and (d - c) > (b - a)
    }
    return {movie for a, b, movie in found if (a, b, movie) not in inside}


def feeling_agrees(compound: float, stars: float) -> bool:
    if stars >= 3.5:
        return compound >= -0.05
    if stars <= 2.5:
        return compound <= 0.05
    return True


def search_on_taste(results: list[int], genres: dict[int, list[str]], interests: list[str]) -> bool:
    wanted = {g.lower() for g in interests}
    return any(wanted & {g.lower() for g in genres.get(m, [])} for m in results)


def interview_truthful(answer: str, watched: set[int], index: Titles) -> bool:
    named = films_named(answer, index)
    return bool(named) and named <= watched


def grounded(text: str, sources: list[str], index: Titles) -> bool:
    joined = "\n".join(sources)
    if not content_words(text) & content_words(joined):
        return False
    return films_named(text, index) <= films_named(joined, index)
