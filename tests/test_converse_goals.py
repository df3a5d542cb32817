"""Catalogue tasks from real Yelp users (agents/converse/goals.py): goals built strictly from the past,
the agenda that decides the user's acts, the objective fit, and the known-quality ladder (a random CRS
and an oracle that recommends the targets) told apart by a run of the simulator itself."""

import argparse
import json
from pathlib import Path

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
    from agents.converse.simulator import TurnLog

    # every key a run writes is one TurnLog documents; the agenda's slot and the ratings are among them
    assert set().union(*turns) <= set(TurnLog.__annotations__) and {"slot", "rating", "fit"} <= set().union(
        *turns
    )
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


def test_the_language_and_action_rungs_give_the_oracles_places_in_other_words(raw):
    from agents.converse.crs import ExplainingOracle, IgnoringOracle, OracleCRS

    catalogue = load_restaurants(raw / "yelp_asc_sample" / "item_subset.json")
    target = next(r for r in catalogue if r.price and r.categories and r.stars)
    said = [f"Hi! I am looking for a place to eat. I would like something in {target.city}.",
            f"I would like something {target.categories[0]}."]  # fmt: skip
    replies = {}
    for cls in (OracleCRS, IgnoringOracle, ExplainingOracle):
        session = Session(targets=[target.id])
        crs = cls(None, catalogue)
        replies[cls.name] = [crs.respond([session], [text])[0] for text in said]
    for name, answers in replies.items():  # the same place every time: only the words differ
        assert [a.recommended for a in answers] == [[target.id], [target.id]], name
    ignoring = replies["oracle-ignores"][-1].text
    assert target.city not in ignoring and target.categories[0] not in ignoring  # nothing the user said
    explaining = replies["oracle-explains"]
    assert f"something in {target.city}" in explaining[0].text  # the need stated so far, then the next one
    assert f"something {target.categories[0]}, in {target.city}" in explaining[1].text
    assert target.name in explaining[1].text and f"{target.stars:g} stars" in explaining[1].text


def test_names_in_a_reply_are_matched_to_the_catalogue_longest_first_and_chains_by_city():
    from agents.converse.crs import NameMatcher

    catalogue = [place("a", city="Tampa"), place("b", city="Reno"), place("c", city="Reno"),
                 place("d", city="Reno"), place("e")]  # fmt: skip
    catalogue[0].name = catalogue[1].name = "Taco Spot"  # a chain in two cities
    catalogue[2].name = "Taco Spot Cantina"  # a longer name holding the chain's
    catalogue[3].name, catalogue[4].name = "Go", "Sushi  Den"
    catalogue.append(place("f"))
    catalogue[5].name = "Time"  # a place named with a common word
    match = NameMatcher(catalogue)
    assert match("Try Taco Spot Cantina or Sushi Den.") == (["c", "e"], [])
    assert match("Try the Taco Spot.") == ([], ["Taco Spot"])  # which city's: ambiguous, counted
    assert match("Try the Taco Spot.", context="I would like something in Reno.") == (["b"], [])
    assert match("Go there, or Go Taco Spotless.") == ([], [])  # too short a name; whole words only
    assert match("Time to eat! It is that time of year: try Time tonight.") == (
        ["f"],
        [],
    )  # not "time", not a sentence's first word
    assert match("try sushi den") == ([], [])  # the name as the catalogue writes it


def test_a_text_only_crs_is_scored_by_the_places_it_names(raw, tmp_path):
    """A python plug-in that answers in words only (it asks, then names one place): the named place is
    matched, scored against the goal, counted, and the agenda answers it as it answers an id."""
    from eval.converse import evaluate

    catalogue = load_restaurants(raw / "yelp_asc_sample" / "item_subset.json")
    named = next(r for r in catalogue if r.name == "Taqueria Pico De Gallo")  # one place of that name
    out = tmp_path / "run"
    spec = json.dumps(
        {
            "transport": "python",
            "target": f"{Path(__file__).parent / 'crs_plugins.py'}:AsksThenNames",
            "options": {"name": named.name},
        }
    )
    summary = run(args(raw, out, "crs=[words]", f"plugins={{words: {spec}}}", "dialogues=4", "user_text=template"),
                  Scripted(), Scripted())  # fmt: skip
    dialogues = [json.loads(line) for line in (out / "dialogues.jsonl").read_text().splitlines()]
    assert all(d["unscored"] is None and d["success"] is not None for d in dialogues)
    assert all(d["recommended"][0] == named.id for d in dialogues)
    turns = [json.loads(line) for line in (out / "turns.jsonl").read_text().splitlines()]
    replies = [t["reply"] for t in turns if t["reply"]]
    assert all(r["matched_by"] == "names" for r in replies)
    matched = sum(bool(r["recommended"]) for r in replies)
    assert summary["counts"]["crs_names_matched:words"] == matched > 0
    assert summary["counts"]["crs_names_unmatched:words"] == len(replies) - matched > 0
    for d in dialogues:  # after the named place the user's next act answers it: accepted or feedback
        goal = json.loads((out / "personas.json").read_text())["personas"][d["persona"]]["goal"]
        after = d["transcript"][4][1]  # user, assistant (asks), user, assistant (names), user
        if named.id in goal["targets"]:
            assert d["ended"] == "accepted"
        else:
            assert after.startswith("That is not quite it"), after
    evaluate(out, raw / "recllmsim", tmp_path / "eval")
    row = next(line for line in (tmp_path / "eval" / "table.md").read_text().splitlines()
               if line.startswith("| words | 4 |"))  # fmt: skip
    assert row.rstrip(" |").endswith(f"{matched} / {len(replies) - matched} / 0")


@pytest.mark.slow
def test_ratings_off_asks_no_rating_and_keeps_the_objective_figures(raw, tmp_path, monkeypatch):
    from eval.converse import evaluate

    rungs = "crs=[random, oracle-ignores, oracle]"
    on, off = Scripted(), Scripted()
    rated = run(args(raw, tmp_path / "on", rungs, "user_text=template"), on, Scripted())
    bare = run(
        args(raw, tmp_path / "off", rungs, "user_text=template", "rating.enabled=false"), off, Scripted()
    )
    assert (
        "rating" in on.kinds
        and "rating" not in off.kinds
        and not any(k.startswith("score") for k in off.kinds)
    )
    assert all(row["rated_turns"] == 0 and row["unrated_turns"] == 0 for row in bare["crs"].values())
    for name in ("random", "oracle-ignores", "oracle"):  # the course of each dialogue is the same
        assert bare["crs"][name]["ended"] == rated["crs"][name]["ended"]
    dialogues = {
        folder: [(d["crs"], d["recommended"], d["success"], d["ended"])
                 for d in map(json.loads, (tmp_path / folder / "dialogues.jsonl").read_text().splitlines())]
        for folder in ("on", "off")
    }  # fmt: skip
    assert dialogues["on"] == dialogues["off"]
    results = evaluate(tmp_path / "off", raw / "recllmsim", tmp_path / "eval")
    table = (tmp_path / "eval" / "table.md").read_text()
    assert (
        table.startswith("Ratings: off") and results["goals"]["per_crs"]["oracle"]["success"]["mean"] == 1.0
    )
    from agents.converse import run as runner

    seen = []
    monkeypatch.setattr(runner, "run", seen.append)
    runner.main(
        ["--config", "configs/converse/yelp.yaml", "--out", "x", "--set", "dialogues=3", "--ratings", "off"]
    )
    assert seen[0].set == ["dialogues=3", "rating.enabled=False"]


@pytest.mark.slow
def test_a_crs_added_later_runs_alone_and_the_others_dialogues_stay(raw, tmp_path, monkeypatch):
    from agents.converse import run as runner

    both = tmp_path / "both"
    run(args(raw, both, "crs=[oracle, random]"), Scripted(), Scripted())
    grown = tmp_path / "grown"
    run(args(raw, grown, "crs=[random]"), Scripted(), Scripted())
    first = (grown / "dialogues.jsonl").read_text()
    served = []
    real = runner.converse
    monkeypatch.setattr(runner, "converse", lambda name, *a: served.append(name) or real(name, *a))
    summary = run(args(raw, grown, "crs=[random, oracle]"), Scripted(), Scripted())
    assert set(served) == {"oracle"} and (grown / "dialogues.jsonl").read_text().startswith(first)
    assert summary["crs"]["oracle"]["dialogues"] == summary["crs"]["random"]["dialogues"] == 12

    def rows(folder):  # each recommender's dialogues, whatever the order it was run in
        return sorted(map(json.loads, (folder / "dialogues.jsonl").read_text().splitlines()),
                      key=lambda d: (d["crs"], d["dialogue"]))  # fmt: skip

    strip = [{k: v for k, v in d.items() if k != "chunk_counts"} for d in rows(both)]
    assert strip == [{k: v for k, v in d.items() if k != "chunk_counts"} for d in rows(grown)]
    served.clear()
    alone = run(args(raw, grown, "crs=[oracle]"), Scripted(), Scripted())  # one left out: nothing to do
    assert served == [] and set(alone["crs"]) == {"oracle"}
    assert rows(grown) == rows(both)  # the left-out recommender's dialogues are still there
    # a recommender whose own settings changed is refused by name; the shared ones by theirs
    run(args(raw, grown, "crs=[random, base]", "crs_text=template"), Scripted(), Scripted())
    with pytest.raises(SystemExit, match=r"crs\.base\.crs_text"):
        run(args(raw, grown, "crs=[random, base]", "crs_text=llm"), Scripted(), Scripted())
    with pytest.raises(SystemExit, match=r"config\.max_turns"):
        run(args(raw, grown, "crs=[random]", "max_turns=4"), Scripted(), Scripted())


def test_a_goal_persona_loses_patience_with_poor_places_not_with_poor_ratings(raw, tmp_path):
    """The quit rule reads the measured fit for a goal (rating.patience_from: fit): awful ratings of
    well-fitting places do not end the dialogue; the ratings rule ends it; poor places end it either way."""
    from agents.converse.config import load_config
    from agents.converse.crs import Reply
    from agents.converse.profiles import Persona
    from agents.converse.simulator import User, UserSimulator

    saved = tmp_path / "run"
    run(args(raw, saved, "crs=[random]", "dialogues=1", "rating.enabled=false"), Scripted(), Scripted())
    persona = Persona(**json.loads((saved / "personas.json").read_text())["personas"][0])
    persona.action["decisiveness"] = "decisive"  # patience 2
    goal = persona.goal_of()
    catalogue = load_restaurants(raw / "yelp_asc_sample" / "item_subset.json")
    close = next(r for r in catalogue if objective_fit(goal, r) == 3 and r.id not in goal.targets)
    far = next(r for r in catalogue if objective_fit(goal, r) == 1)
    awful = {"rationale": "bad", "language_quality": 1, "action_quality": 1, "recommended": True,
             "recommendation_quality": 1, "new_preference": "", "fit": 1}  # fmt: skip
    great = {**awful, "language_quality": 5, "action_quality": 5, "recommendation_quality": 5}

    def ending(place, rating, rule):
        config = load_config(
            None, ["max_turns=9", "personas=goals", "user_text=template", f"rating.patience_from={rule}"]
        )
        simulator = UserSimulator(config, Scripted(rating=rating), np.random.default_rng(0), catalogue)
        user = User(persona)
        simulator.step([user], [None])
        for _ in range(3):
            simulator.step([user], [Reply(f"Try {place.name}.", [place.id])])
        return user.ended

    assert ending(close, awful, "fit") is None  # fit 3 of 5: not unhappy, whatever the ratings say
    assert ending(close, awful, "ratings") == "impatient"
    assert ending(far, great, "fit") == "impatient"
    # a CRS whose places are not known (no ids, no name matched): no fit to read, so the ratings decide
    config = load_config(None, ["max_turns=9", "personas=goals", "user_text=template"])
    simulator = UserSimulator(config, Scripted(rating=awful), np.random.default_rng(0), catalogue)
    user = User(persona)
    simulator.step([user], [None])
    for _ in range(3):
        simulator.step([user], [Reply("Try a place I know.", None)])
    assert user.fits == [] and user.ended == "impatient"
