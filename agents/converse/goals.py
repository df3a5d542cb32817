"""Catalogue tasks from real Yelp users: a goal the simulated user pursues and the items that reach it.

A goal is one real user of the Yelp sample at one moment (a cutoff): their restaurant reviews before
the cutoff give the taste (categories of the places they rated 4 or 5, categories found only in places
they rated 1 or 2), and the places they really went to next and rated 4 or 5 are the targets (the place
at the cutoff and any liked place among their next ``horizon`` reviews, in the same city). What the user
asks for are the first target's slots: its city, its main categories and its price. Nothing from after
the cutoff reaches the persona but the goal's own slots; the targets are the ground truth a CRS is
scored against (iEvaLM-style success and recall).

    goals = yelp_goals(reviews, catalogue, n=20, rng=rng)
    fit = objective_fit(goal, restaurant)        # 5 for a target, else 1 + the goal's slots it matches
    act, slot = next_act(goal, stated, last_recommended)

``next_act`` is the agenda-based core (the classic user simulator): the goal decides the dialogue act
and its slot; the LLM or a template only writes it down.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from agents.runs import json_lines

LIKED, DISLIKED = 4.0, 2.0  # stars at or above: liked; at or below: disliked
SLOTS = ("city", "category", "price")


@dataclass
class Goal:
    user: str  # the real Yelp user
    cutoff: str  # the time of the first target's review: the history is strictly before it
    city: str
    categories: list[str]  # the first target's main categories (up to 2): what the user asks for
    price: str  # the first target's price ("$" to "$$$$"; "" when the catalogue does not say)
    liked: list[str]  # categories of the places rated 4-5 before the cutoff, most frequent first
    disliked: list[str]  # categories only of places rated 1-2 before the cutoff
    history: int  # restaurant reviews before the cutoff
    targets: list[str] = field(default_factory=list)  # catalogue ids, in the order they were visited

    def slot_text(self, slot: str) -> str:
        return {
            "city": f"in {self.city}",
            "category": " or ".join(self.categories) or "any food",
            "price": {"$": "cheap", "$$": "moderately priced", "$$$": "pricey", "$$$$": "very expensive"}.get(
                self.price, "any price"
            ),
        }[slot]

    def to_json(self) -> dict:
        return asdict(self)


def read_reviews(path: Path) -> list[dict]:
    """The review file's lines; a malformed line is an error naming it (the sample is small and whole)."""
    out = []
    for number, row in json_lines(path):
        try:
            out.append({k: row[k] for k in ("user_id", "item_id", "stars", "date")})
        except (KeyError, TypeError) as error:
            raise SystemExit(f"error: {path} line {number}: {error!r}") from None
    return out


def yelp_goals(
    reviews: list[dict],
    catalogue: list,
    n: int,
    rng: np.random.Generator,
    users: set[str] | None = None,
    min_history: int = 3,
    horizon: int = 3,
) -> list[Goal]:
    """``n`` goals, drawn round-robin over the users (each round in a shuffled order, a random cutoff
    per user, no cutoff twice) so that many users are represented. ``users``: only these (the sample's
    profiled users); a cutoff needs ``min_history`` restaurant reviews before it."""
    by_id = {r.id: r for r in catalogue}
    visits: dict[str, list[dict]] = defaultdict(list)
    for row in reviews:
        if row["item_id"] in by_id and (users is None or row["user_id"] in users):
            visits[row["user_id"]].append(row)
    candidates: dict[str, list[Goal]] = {}
    for user, rows in sorted(visits.items()):
        rows.sort(key=lambda r: (r["date"], r["item_id"]))
        mine = []
        for j in range(min_history, len(rows)):
            first = by_id[rows[j]["item_id"]]
            if rows[j]["stars"] < LIKED or rows[j - 1]["date"] >= rows[j]["date"]:
                continue  # a target is liked, and the history must be strictly before it
            before = rows[:j]
            liked = Counter(c for r in before if r["stars"] >= LIKED for c in by_id[r["item_id"]].categories)
            low = Counter(c for r in before if r["stars"] <= DISLIKED for c in by_id[r["item_id"]].categories)
            targets = [first.id] + [
                r["item_id"]
                for r in rows[j + 1 : j + 1 + horizon]
                if r["stars"] >= LIKED and by_id[r["item_id"]].city == first.city
            ]
            mine.append(
                Goal(
                    user=user,
                    cutoff=rows[j]["date"],
                    city=first.city,
                    categories=first.categories[:2],
                    price=first.price,
                    liked=[c for c, _ in liked.most_common(3)],
                    # never what the goal asks for: a target's own categories are not disliked
                    disliked=[
                        c for c, _ in low.most_common() if c not in liked and c not in first.categories
                    ][:2],
                    history=len(before),
                    targets=list(dict.fromkeys(targets)),
                )
            )
        if mine:
            candidates[user] = mine
    goals: list[Goal] = []
    while len(goals) < n and any(candidates.values()):
        for user in rng.permutation(sorted(u for u, c in candidates.items() if c)):
            if len(goals) == n:
                break
            pool = candidates[str(user)]
            goals.append(pool.pop(int(rng.integers(len(pool)))))
    if len(goals) < n:
        raise SystemExit(f"error: the reviews hold only {len(goals)} catalogue goals, {n} were asked for")
    return goals


def matched_slots(goal: Goal, restaurant) -> list[str]:
    out = []
    if restaurant.city == goal.city:
        out.append("city")
    if set(goal.categories) & set(restaurant.categories):
        out.append("category")
    if goal.price and restaurant.price == goal.price:
        out.append("price")
    return out


def objective_fit(goal: Goal, restaurant) -> int:
    """The objective recommendation quality, 1-5: 5 for a target; otherwise 1 plus the goal's slots the
    place matches (city, a category, the price); a place with a disliked category loses one (not below 1)."""
    if restaurant.id in goal.targets:
        return 5
    fit = 1 + len(matched_slots(goal, restaurant))
    if set(goal.disliked) & set(restaurant.categories):
        fit -= 1
    return max(1, fit)


def next_act(goal: Goal, stated: set[str], recommended: list | None) -> tuple[str, str | None]:
    """The agenda: the act (a simulator action) and the slot it is about, from the goal, the slots
    already stated and the places the last reply recommended (restaurants; None: nothing).

    - a target was recommended: accept (end);
    - a place was recommended that misses a slot: say which (give_feedback, the slot);
    - a goal slot not stated yet: state it (clarify_preference, the slot), the city first;
    - otherwise: ask for a recommendation."""
    if recommended:
        if any(r.id in goal.targets for r in recommended):
            return "end", None
        missing = [
            s for s in SLOTS if s not in matched_slots(goal, recommended[0]) and (s != "price" or goal.price)
        ]
        if missing:
            return "give_feedback", missing[0]
    for slot in SLOTS:
        if slot not in stated and (slot != "price" or goal.price):
            return "clarify_preference", slot
    return "request_recommendation", None


def template_message(goal: Goal, act: str, slot: str | None, first: bool) -> str:
    """The act written down plainly (text.user: template): every fact it states comes from the goal."""
    if act == "end":
        return "That sounds like exactly what I wanted, thank you. I will go there."
    if act == "give_up":
        return "I have not found what I was looking for, so I will look elsewhere. Thank you anyway."
    if act == "give_feedback":
        return f"That is not quite it: I am looking for something {goal.slot_text(slot)}."
    if act == "clarify_preference":
        opening = "Hi! I am looking for a place to eat. " if first else ""
        return f"{opening}I would like something {goal.slot_text(slot)}."
    return "Could you recommend a place?" if not first else "Hi! Could you recommend a place to eat?"
