"""The generation test: the same pages for every method, each page new to the user, hits and recall by
hand, and the simulator's agent walking the pages: it picks by score, rates, remembers each film, and
reflects every reflect_every rounds."""

import numpy as np
import pytest
from sandbox_fakes import PageScoring, embed

from agents.sandbox.config import load_config
from data_prep import movielens
from eval.sandbox import generation as g
from eval.sandbox.cases import AgentRow

FAST = [
    "recommender.kind=popularity",
    "recommender.factors=4",
    "recommender.iterations=2",
    "recommender.rec_random_k=1",
]


@pytest.fixture(scope="module")
def ml(raw):
    return movielens.load(raw / "movielens_latest_small")


@pytest.fixture(scope="module")
def cases(ml):
    config = load_config(None, FAST)
    users = [414, 599, 68]
    out = g.make_cases(ml, users, 4)
    g.make_pages(ml, out, config, 4, seed=0)
    return out


@pytest.mark.slow
def test_pages_are_new_to_the_user_and_the_same_for_every_method(ml, cases):
    config = load_config(None, FAST)
    again = g.make_cases(ml, [414, 599, 68], 4)
    g.make_pages(ml, again, config, 4, seed=0)
    assert [c["pages"] for c in again] == [c["pages"] for c in cases]  # seeded: every method sees these
    for case in cases:
        ratings = ml.by_user()[case["user"]]
        assert case["next"] == [r.movie for r in ratings[-4:]] and case["cutoff"] == ratings[-4].ts
        shown = [m for p in case["pages"] for m in p]
        before = {r.movie for r in ratings if r.ts < case["cutoff"]}
        assert len(shown) == len(set(shown)) == 4 * config.recommender.page_size and not set(shown) & before
        assert set(shown) <= set(movielens.existing_films(ml, case["cutoff"]))  # no film released later
    for walk in (g.walk_random, g.walk_popularity, g.walk_mf):
        picks = walk(cases, data=ml, rng=np.random.default_rng(0))
        assert all(
            len(p) == 4 and all(m in page for m, page in zip(p, c["pages"], strict=True))
            for p, c in zip(picks, cases, strict=True)
        )
    popularity = ml.popularity()
    first = g.walk_popularity(cases, ml)[0][0]
    assert all(
        popularity.count(first, cases[0]["cutoff"]) >= popularity.count(m, cases[0]["cutoff"])
        for m in cases[0]["pages"][0]
    )


def test_recall_hit_rate_and_the_ceiling_by_hand():
    cases = [
        {"next": [1, 2, 3, 4], "pages": [[1, 9], [8, 7], [2, 6], [5, 0]]},
        {"next": [5, 6, 7, 8], "pages": [[1, 2]] * 4},
    ]
    result = g.score(cases, [[1, 7, 2, 5], [1, 1, 2, 2]], steps=4)
    assert result["recall"]["mean"] == pytest.approx((2 / 4 + 0) / 2) and result["hit_rate"]["mean"] == 0.5
    assert g.ceiling(cases) == pytest.approx((2 / 4 + 0) / 2)


def test_what_each_memory_part_adds_by_hand():
    row = lambda recall, walks: {"recall_per_user": recall, "walks": walks}  # noqa: E731
    results = {
        "methods": {
            "tuned": row([0.2, 0.1, 0.0, 0.1], [[1], [2], [3], [4]]),
            "tuned/no-reflection": row([0.1, 0.1, 0.0, 0.0], [[9], [2], [8], [7]]),
            "tuned/no-long-term": row([0.2, 0.1, 0.0, 0.1], [[1], [2], [5], [4]]),
            "popularity": row([0.0] * 4, [[0]] * 4),
        }
    }
    out = {a["claim"]: a for a in g.ablations(results, "tuned")}
    assert set(out) == {"tuned/no-reflection", "tuned/no-long-term"}  # not the other methods
    assert out["tuned/no-reflection"]["difference"] == pytest.approx(0.05)  # (0.1 + 0 + 0 + 0.1) / 4
    assert (
        out["tuned/no-reflection"]["walks_changed"] == 3 and out["tuned/no-long-term"]["walks_changed"] == 1
    )
    assert out["tuned/no-long-term"]["difference"] == 0 and out["tuned/no-long-term"]["confidence"] == 0.975
    table = g.table({**results, "claims": [], "left_out": {}, "ablations": list(out.values()),
                                                   "steps": 1, "after": "x", "ceiling_recall": 0.5,
                                                   "recommender": {"page_size": 5, "kind": "mf"},
                                                   "methods": {k: {**v, "users": 4, "recall": {"mean": 0, "ci95": [0, 0]},
                                                               "hit_rate": {"mean": 0, "ci95": [0, 0]}} for k, v in results["methods"].items()}})  # fmt: skip
    rows = {
        line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| tuned/")
    }
    assert "| what the memory part adds (full minus ablated, recall) | difference |" in table
    assert rows["tuned/no-reflection"].startswith("| tuned/no-reflection | +0.050 | [")
    assert rows["tuned/no-reflection"].endswith(" | 3 of 4 |") and rows["tuned/no-long-term"].endswith(
        " | 1 of 4 |"
    )


def test_the_agent_walks_the_pages_picking_rating_and_remembering_each_film(ml, cases):
    truth = {ml.movies[m].text(tags_before=c["cutoff"]) for c in cases for m in c["next"]}
    backend = PageScoring(prefer=lambda line: -0.1 if line in truth else -5.0)
    row = AgentRow(
        "agent-score",
        ["decision.mode=score", "memory.reflect_every=2"],
        False,
        None,
        FAST,
        ml,
        backend,
        embed,
        0,
    )
    walks = g.walk_agent(row, cases, 4)
    for case, walk in zip(cases, walks, strict=True):
        for page, pick in zip(case["pages"], walk, strict=True):
            best = next((m for m in page if m in case["next"]), page[0])
            assert pick == best  # the best-scored film, the first of ties
    assert g.score(cases, walks, 4)["recall"]["mean"] == pytest.approx(g.ceiling(cases))
    assert row.counts["memory:reflections"] == 2 * len(cases)  # after rounds 2 and 4
    agent = row.built[next(iter(row.built))][0][0]
    assert [m for m, _, _ in agent.rated] == walks[0] and all(0.5 <= s <= 5 for _, s, _ in agent.rated)
    remembered = [  # a record, or the enhancer of a record as alike (which it is then kept as)
        t
        for r in agent.memory.short + agent.memory.long
        if r.kind != "history"
        for t in [r.text, *r.enhancers]
    ]
    assert any(ml.movies[walks[0][-1]].title in t for t in remembered)  # the last film is in memory
    prompts = [c for c, _ in backend.scored]
    last = "\n".join(m["content"] for m in prompts[-1][0])
    remembered = last.split("# What you remember")[1].split("# Now")[0]
    assert "It is " in last and ml.movies[walks[0][-2]].title in remembered  # a later page recalls a watch


@pytest.mark.slow
def test_a_run_writes_its_table_and_a_rerun_keeps_each_method(raw, tmp_path, capsys):
    config = "configs/sandbox/movielens.yaml"
    data = [f"data={raw / 'movielens_latest_small'}"]
    args = (config, data, tmp_path, 4, 2, "2010-01-01", 2, ["random", "popularity"])
    results = g.run(*args)
    assert set(results["methods"]) == {"random", "popularity"}
    assert all(r["users"] == 4 and len(r["walks"]) == 4 for r in results["methods"].values())
    assert all(len(w) == 2 for r in results["methods"].values() for w in r["walks"])
    table = (tmp_path / "table.md").read_text()
    assert "| popularity |" in table and "| tuned | left out: needs --adapter | |" in table
    capsys.readouterr()
    again = g.run(*args)
    assert "random: done earlier, kept" in capsys.readouterr().out
    assert again["methods"] == results["methods"]
