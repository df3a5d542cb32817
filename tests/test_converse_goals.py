"""Catalogue tasks from real Yelp users (agents/converse/goals.py): goals built strictly from the past,
the agenda that decides the user's acts, the objective fit, and the known-quality ladder (a random CRS
and an oracle that recommends the targets) told apart by a run of the simulator itself."""

import argparse
import json

import numpy as np
import pytest
from converse_fakes import Scripted

from agents.converse.crs import Restaurant, Session, load_restaurants
from agents.converse.goals import Goal, next_act, objective_fit, read_reviews, template_message, yelp_goals
from agents.converse.run import run


@pytest.fixture(scope="module")
def yelp(raw):
    root = raw / "yelp_asc_sample"
    users = {json.loads(line)["user_id"] for line in open(root / "user_subset.json")}
    return load_restaurants(root / "item_subset.json"), read_reviews(root / "review_subset.json"), users


def test_goals_come_from_a_real_users_past_and_their_real_next_visits(yelp):
    catalogue, reviews, users = yelp
    by_id = {r.id: r for r in catalogue}
    goals = yelp_goals(reviews, catalogue, 40, np.random.default_rng(0), users)
    assert (
        len(goals) == 40 and len({g.user for g in goals}) == 38
    )  # round-robin: every user before a second goal
    for goal in goals:
        mine = sorted((r for r in reviews if r["user_id"] == goal.user and r["item_id"] in by_id),
                      key=lambda r: (r["date"], r["item_id"]))  # fmt: skip
        before = [r for r in mine if r["date"] < goal.cutoff]
        assert len(before) == goal.history >= 3
        first = by_id[goal.targets[0]]
        assert any(r["item_id"] == first.id and r["date"] == goal.cutoff and r["stars"] >= 4 for r in mine)
        assert all(by_id[t].city == goal.city for t in goal.targets)  # the same city
        assert goal.categories == first.categories[:2] and goal.price == first.price
        liked = {c for r in before if r["stars"] >= 4 for c in by_id[r["item_id"]].categories}
        assert set(goal.liked) <= liked  # taste: only the past
        assert not set(goal.disliked) & liked
        later = [r for r in mine if r["date"] > goal.cutoff][:3]  # the next 3 reviews: liked ones, same city
        expected = [r["item_id"] for r in later if r["stars"] >= 4 and by_id[r["item_id"]].city == goal.city]
        assert goal.targets == list(dict.fromkeys([first.id, *expected]))
        assert not set(goal.disliked) & set(goal.categories)  # never dislikes what it asks for
    with pytest.raises(SystemExit, match="only"):
        yelp_goals(reviews, catalogue, 100000, np.random.default_rng(0), users)


def place(id_, city="Tampa", categories=("Mexican",), price="$"):
    return Restaurant(id_, id_.title(), city, list(categories), price, 4.0)


GOAL = Goal(user="u", cutoff="2019-01-01", city="Tampa", categories=["Mexican"], price="$", liked=["Mexican"],
            disliked=["Sushi Bars"], history=5, targets=["t1", "t2"])  # fmt: skip


def test_objective_fit_by_hand():
    assert objective_fit(GOAL, place("t2", city="Reno", categories=["Thai"])) == 5  # a target
    assert objective_fit(GOAL, place("x")) == 4  # city, category and price: 1 + 3
    assert objective_fit(GOAL, place("x", price="$$")) == 3
    assert objective_fit(GOAL, place("x", city="Reno", categories=["Thai"], price="$$")) == 1
    assert objective_fit(GOAL, place("x", categories=["Sushi Bars"], price="$$")) == 1  # 1 + city - dislike


def test_the_agenda_states_the_goal_then_asks_then_judges_what_came():
    assert next_act(GOAL, set(), None) == ("clarify_preference", "city")
    assert next_act(GOAL, {"city"}, None) == ("clarify_preference", "category")
    assert next_act(GOAL, {"city", "category", "price"}, None) == ("request_recommendation", None)
    assert next_act(GOAL, {"city"}, [place("t1")]) == ("end", None)
    assert next_act(GOAL, {"city"}, [place("x", city="Reno")]) == ("give_feedback", "city")
    assert next_act(GOAL, {"city"}, [place("x", price="$$$")]) == ("give_feedback", "price")
    said = template_message(GOAL, "give_feedback", "price", first=False)
    assert "cheap" in said and template_message(GOAL, "clarify_preference", "city", True).endswith(
        "in Tampa."
    )


def args(raw, out, *extra):
    settings = [f"data={raw / 'recllmsim'}", "dialogues=12", "max_turns=5", "personas=goals", *extra]
    return argparse.Namespace(config=None, out=str(out), set=settings, overwrite=False)


def test_the_ladder_random_below_oracle_through_the_simulator(raw, tmp_path):
    from eval.converse import evaluate

    out = tmp_path / "run"
    summary = run(args(raw, out, "crs=[random, oracle]", "user_text=template"), Scripted(), Scripted())
    assert summary["crs"]["oracle"]["ended"] == {"accepted": 12}
    dialogues = [json.loads(line) for line in (out / "dialogues.jsonl").read_text().splitlines()]
    oracle = [d for d in dialogues if d["crs"] == "oracle"]
    assert all(d["success"] and d["success_turn"] == 1 and d["turns"] == 2 for d in oracle)
    personas = json.loads((out / "personas.json").read_text())["personas"]
    catalogue = {r.id: r for r in load_restaurants(raw / "yelp_asc_sample" / "item_subset.json")}
    for d in oracle:  # the user's words state the goal's slots and never name a target
        goal = personas[d["persona"]]["goal"]
        said = " ".join(text for role, text in d["transcript"] if role == "user")
        assert goal["city"] in d["transcript"][0][1]
        assert not any(catalogue[t].name in said for t in goal["targets"])
    results = evaluate(out, raw / "recllmsim", tmp_path / "eval")
    goals = results["goals"]
    assert goals["per_crs"]["oracle"]["success"]["mean"] == 1.0
    assert goals["per_crs"]["oracle"]["objective_fit"]["mean"] == 5.0
    assert goals["per_crs"]["random"]["success"]["mean"] < 0.5
    paired = goals["paired"]["random - oracle: success"]
    assert paired["ci95"][1] < 0  # random below oracle, the interval clear of zero
    assert "| oracle | 1.00" in (tmp_path / "eval" / "table.md").read_text()
    turns = [json.loads(line) for line in (out / "turns.jsonl").read_text().splitlines()]
    assert all(t["written_by"] == "template" for t in turns)
    rated = [(t["rating"], t["fit"]) for t in turns if t.get("rating") and t["rating"].get("llm_objective")]
    # the objective part is the measured fit of the recommended place, never the LLM's own score
    assert rated and all(r["objective"] == fit for r, fit in rated)
    assert any(r["llm_objective"] != fit for r, fit in rated)  # where they differ, the measure stood


def test_the_built_in_recommenders_name_what_they_recommend(raw):
    from agents.converse.crs import AgentCRS, BaseCRS

    catalogue = load_restaurants(raw / "yelp_asc_sample" / "item_subset.json")
    for cls in (BaseCRS, AgentCRS):
        reply = cls(Scripted(plan="recommend"), catalogue).respond([Session()], ["I want noodles"])[0]
        assert reply.recommended
        name = {r.id: r.name for r in catalogue}[reply.recommended[0]]
        assert name in reply.text  # "Try the first place." alone would not say which


def test_template_replies_state_the_recommenders_own_moves(raw):
    from agents.converse.crs import ASK, AgentCRS, BaseCRS, naming

    catalogue = load_restaurants(raw / "yelp_asc_sample" / "item_subset.json")
    by_id = {r.id: r for r in catalogue}
    base = BaseCRS(Scripted(), catalogue, text="template").respond([Session()], ["noodles please"])[0]
    assert base.text == naming(by_id[base.recommended[0]])  # the place the LLM chose, named plainly
    asker = AgentCRS(Scripted(plan="ask"), catalogue, text="template").respond([Session()], ["hi"])[0]
    assert asker.text == ASK and asker.recommended == []
    backend = Scripted(plan="recommend")
    picker = AgentCRS(backend, catalogue, text="template").respond([Session()], ["I like noodles"])[0]
    assert picker.text == naming(by_id[picker.recommended[0]]) and "crs:say" not in backend.kinds


def test_goal_settings_are_checked():
    from agents.converse.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="oracle"):
        load_config(None, ["crs=[oracle]"])
    with pytest.raises(ConfigError, match="catalogue"):
        load_config(None, ["setting=recllmsim", "crs=[assistant]", "personas=goals"])


def test_each_paired_value_lands_under_its_own_column():
    from eval.converse import per_crs_lines

    cell = {"mean": 0.5, "ci95": [0.1, 0.9], "dialogues": 4}
    section = {
        "per_crs": {"oracle": {"success": cell, "hit@1": cell}},
        "paired": {
            "random - oracle: hit@1": {"mean": -1.0, "ci95": [-1.0, -1.0], "dialogues": 4},
            "random - oracle: success": {"mean": -0.5, "ci95": None, "dialogues": 4},
        },
    }
    lines = per_crs_lines(section, ["success", "hit@1"], "recommender")
    row = next(line for line in lines if line.startswith("| paired random - oracle"))
    assert row.split(" | ")[1:] == ["-0.50 (n=4)", "-1.00 [-1.00, -1.00] (n=4) |"]
    assert lines[0].count("|") == row.count("|")  # as many columns as the header
