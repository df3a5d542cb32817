"""The runnable examples of docs/bring_your_own.md, run as the page runs them: an AgentSociety agent
file, a recommender and a CRS, each named by path and importing nothing from this project."""

import argparse
import json
from collections import Counter

import numpy as np
import pytest
from converse_fakes import Scripted
from sandbox_fakes import Recording, embed

from agents.llm import Answer
from agents.review import official, simulate
from data_prep.paths import REPO_ROOT
from data_prep.store import ReviewStore
from data_prep.tasks import read_targets

EXAMPLES = REPO_ROOT / "docs" / "examples"


def test_the_examples_import_nothing_from_this_project():
    for path in EXAMPLES.glob("*.py"):
        text = path.read_text()
        assert not any(
            f"from {p}" in text or f"import {p}" in text for p in ("agents", "eval", "data_prep", "train")
        )


class Written:
    def generate(self, conversations, sampling, constraint=None):
        return [Answer("Good value, I would come back.") for _ in conversations]


def test_the_agentsociety_example_runs_with_the_users_older_stars(
    yelp_store, make_tasks, tmp_path, monkeypatch
):
    monkeypatch.setattr(official, "load_llm", lambda config: Written())
    tasks = make_tasks(yelp_store, tmp_path / "tasks", n=8, seed=4)
    argv = ["--agent", f"{EXAMPLES / 'agentsociety_agent.py'}:HistoryAgent", "--data", str(yelp_store)]
    summary = simulate.main(
        [*argv, "--tasks", str(tasks), "--out", str(tmp_path / "run"), "--retrieval", "bm25"]
    )
    assert summary["answers_by_source"] == {"agent": 8}
    store, targets = ReviewStore.open(yelp_store, tasks=tasks), read_targets(tasks)
    for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines():
        row = json.loads(line)
        older = [
            r["stars"]
            for r in store.get_reviews(user_id=row["user_id"], before=targets[row["task_id"]]["ts"])
        ]
        assert (
            row["stars"] == round(sum(older) / len(older))
            and row["review"] == "Good value, I would come back."
        )


@pytest.mark.slow
def test_the_cooccurrence_example_serves_pages_in_a_sandbox_run(raw, tmp_path):
    from agents.sandbox.run import run

    target = f"{EXAMPLES / 'cooccurrence_recommender.py'}:CoOccurrence"
    settings = [f"data={raw / 'movielens_latest_small'}", "activity.pareto_xmin=1", "agents=4",
                f"recommender.kind={target}", "recommender.options={neighbours: 20}"]  # fmt: skip
    namespace = argparse.Namespace(config=None, out=str(tmp_path), rounds=2, agents=None, human=None,
                                   overwrite=False, set=settings)  # fmt: skip
    summary = run(namespace, Recording(), embed)
    assert not [k for k in summary["counts"] if k.startswith("recommender_refused")]
    assert summary["recommender_plugin"]["target"] == target
    rows = [json.loads(line) for line in (tmp_path / "interactions.jsonl").read_text().splitlines()]
    assert any(r["action"] == "browse" and r["items"] for r in rows)


def test_the_cooccurrence_example_recommends_what_co_watchers_watched():
    from agents.sandbox.config import RecommenderConfig
    from agents.sandbox.recommender import Feed

    config = RecommenderConfig(kind=f"{EXAMPLES / 'cooccurrence_recommender.py'}:CoOccurrence", page_size=2)
    counts = Counter()
    feed = Feed(config, list(range(1, 10)), np.random.default_rng(0), counts)
    feed.train([(1, 1), (1, 2), (2, 1), (2, 3), (3, 9), (3, 9), (4, 9)])
    assert feed.page(1, {1, 2})[0] == [3, 9] and not counts  # user 2 watched 1 and 3; then the popular 9


def test_the_keyword_crs_example_takes_part_in_a_goal_run(raw, tmp_path):
    from agents.converse.run import run

    spec = json.dumps({"transport": "python", "target": f"{EXAMPLES / 'keyword_crs.py'}:KeywordCRS",
                       "options": {"catalogue": str(raw / "yelp_asc_sample" / "item_subset.json")}})  # fmt: skip
    settings = [f"data={raw / 'recllmsim'}", f"catalogue={raw / 'yelp_asc_sample' / 'item_subset.json'}",
                "dialogues=6", "max_turns=3", "personas=goals", "user_text=template", "crs=[random, mine]",
                f"plugins={{mine: {spec}}}"]  # fmt: skip
    summary = run(argparse.Namespace(config=None, out=str(tmp_path), set=settings, overwrite=False),
                  Scripted(), Scripted())  # fmt: skip
    assert summary["crs"]["mine"]["dialogues"] == 6
    assert not [k for k in summary["counts"] if k.startswith(("crs_errors", "crs_refused_items"))]
    dialogues = [json.loads(line) for line in (tmp_path / "dialogues.jsonl").read_text().splitlines()]
    assert all(d["recommended"] for d in dialogues if d["crs"] == "mine")


@pytest.mark.parametrize("name", ["agentsociety_agent.py", "cooccurrence_recommender.py", "keyword_crs.py"])
def test_each_example_is_on_the_page(name):
    assert f"docs/examples/{name}" in (REPO_ROOT / "docs" / "bring_your_own.md").read_text()
