"""A conversational recommender served over the simulator's HTTP JSON protocol: the example to copy when
you put your own CRS behind a URL (agents/converse/plugins.py has the protocol).

    python -m agents.converse.http_example --port 8000          # serves POST http://127.0.0.1:8000/respond
    python -m agents.converse run --config configs/converse/yelp.yaml --out RUN \\
        --set "crs=[random, web, oracle]" "plugins={web: {transport: http, target: 'http://127.0.0.1:8000/respond'}}"

It keeps no state between calls (the whole dialogue comes with each one): it ranks the catalogue's
restaurants by BM25 against everything the user said, skips the places it already recommended in this
dialogue (it finds them in its own earlier replies), and names the best one with its id in ``items``.
No LLM: a cheap, deterministic middle rung for the known-quality ladder. Binds to 127.0.0.1 unless told.
"""

from __future__ import annotations

import argparse

from fastapi import FastAPI
from pydantic import BaseModel

from agents.converse.crs import load_restaurants, naming
from agents.retrieval import BM25, top_indices


class Turn(BaseModel):
    role: str
    content: str


class Dialogue(BaseModel):
    dialogue: list[Turn]


def make_app(catalogue_path: str) -> FastAPI:
    catalogue = load_restaurants(catalogue_path)
    index = BM25([r.text() for r in catalogue])
    app = FastAPI(title="BM25 restaurant CRS (the simulator's HTTP protocol)")

    @app.post("/respond")
    def respond(body: Dialogue) -> dict:
        said = " ".join(t.content for t in body.dialogue if t.role == "user")
        earlier = " ".join(t.content for t in body.dialogue if t.role == "assistant")
        scores = index.scores(said)
        for k in top_indices(scores, len(catalogue)):
            place = catalogue[k]
            if naming(place) not in earlier:  # not recommended before in this dialogue
                return {"reply": naming(place), "items": [place.id]}
        return {"reply": "I have no other place to suggest.", "items": []}

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalogue", default="../shared/data/raw/yelp_asc_sample/item_subset.json")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args(argv)
    uvicorn.run(make_app(args.catalogue), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
