"""A conversational recommender of your own as a Python class (docs/bring_your_own.md):

    python -m agents.converse run --config configs/converse/yelp.yaml --out runs/byo/keyword_crs \\
        --set "crs=[random, mine, oracle]" \\
        "plugins={mine: {transport: python, target: 'docs/examples/keyword_crs.py:KeywordCRS',
                         options: {catalogue: ../shared/data/raw/yelp_asc_sample/item_subset.json}}}"

The protocol (agents/converse/plugins.py): ``respond(dialogue)`` gets the whole dialogue so far and
returns the reply and the catalogue ids it recommends. This one scores each restaurant or food place by how many of
the user's words appear in its name and categories, and names the best one not yet recommended in this
dialogue. It imports nothing from this project.
"""

import json
import re

WORD = re.compile(r"[a-z]+")


class KeywordCRS:
    def __init__(self, catalogue):
        with open(catalogue, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
        # the simulator's catalogue holds the restaurants and food places: any other id would be refused
        self.places = [
            (row["item_id"], row["name"], set(WORD.findall(f"{row['name']} {row['categories']}".lower())))
            for row in rows
            if {"Restaurants", "Food"} & {c.strip() for c in (row.get("categories") or "").split(",")}
        ]

    def respond(self, dialogue):
        said = set(WORD.findall(" ".join(t["content"] for t in dialogue if t["role"] == "user").lower()))
        named = " ".join(t["content"] for t in dialogue if t["role"] == "assistant")
        fresh = [p for p in self.places if p[1] not in named]
        if not fresh:
            return {"reply": "I have nothing else to suggest.", "items": []}
        item_id, name, words = max(fresh, key=lambda p: len(p[2] & said))
        return {"reply": f"You could try {name}.", "items": [item_id]}
