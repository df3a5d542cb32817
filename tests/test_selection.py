"""How the MBR agents pick their review: chosen per group on validation tasks (eval.review.selection), the
nearest-centroid review always in the pool, the rule followed by the agent and fingerprinted."""

import json

import numpy as np
import pytest

from agents.retrieval import hashed_bag_of_words
from agents.review import agent as agent_module
from agents.review import simulate
from agents.review.agent import AgentConfig, ReviewAgent
from agents.review.select import CENTROID, SIMILAR, choose, read_rule
from data_prep import split
from data_prep.store import ReviewStore
from data_prep.tasks import read_targets, read_tasks
from eval.review import baselines, selection, suite


def test_the_centroid_stays_unless_an_option_beats_it_by_a_paired_margin():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.6, 0.9, 60)
    lucky = base + np.tile([0.2, -0.16], 30)  # the higher mean (+0.02), but a noisy gain
    steady = base + 0.01  # a small gain on every task
    chosen = selection.decide({CENTROID: base, "lucky": lucky, "steady": steady})
    assert lucky.mean() > steady.mean() and chosen["chosen"] == "steady"
    assert chosen["options"]["lucky"]["lower"] < 0 < chosen["options"]["steady"]["lower"]
    assert selection.decide({CENTROID: base, "lucky": lucky})["chosen"] == CENTROID
    few = {CENTROID: base[:9], "steady": steady[:9]}  # fewer than MIN_TASKS: the baseline
    assert (
        selection.decide(few)["chosen"] == CENTROID and selection.decide(few, minimum=5)["chosen"] == "steady"
    )
    # an option that differs from the centroid on a few tasks, all gains, has a tiny spread: the normal
    # bound alone passes it; the sign test on the tasks where it differs does not (2**-5 > 0.05 / 2)
    rare = base.copy()
    rare[:5] += 0.05
    sparse = selection.decide({CENTROID: base, "rare": rare, "steady": steady[:60] - 0.02})
    o = sparse["options"]["rare"]
    assert o["lower"] > 0 and (o["differ"], o["wins"]) == (5, 5) and o["sign_p"] == pytest.approx(2**-5)
    assert sparse["level"] == pytest.approx(0.025) and sparse["chosen"] == CENTROID
    often = base.copy()
    often[:12] += 0.05  # 2**-12 < 0.025: passes
    assert selection.decide({CENTROID: base, "often": often, "x": base - 0.01})["chosen"] == "often"


def test_the_model_free_choice_is_made_on_its_own_and_the_model_must_beat_it():
    rng = np.random.default_rng(1)
    base = rng.uniform(0.6, 0.9, 100)
    real = base + 0.01 + rng.normal(0, 0.03, 100)  # a real-review option, ahead by a clear margin
    # the model's text, no gain
    weak = {f"generated w{i}": base + rng.normal(0, 0.05, 100) for i in range(20)}
    free = {"retrieved w1": real, "retrieved w2": base + rng.normal(0, 0.05, 100)}
    scores = {CENTROID: base, **free, **weak}
    # one family over all 22 options would hold the real-review option to 0.05 / 22
    alone = selection.decide({CENTROID: base, **free})
    assert alone["chosen"] == "retrieved w1" and alone["options"]["retrieved w1"]["sign_p"] > 0.05 / 22
    assert selection.decide(scores)["chosen"] == CENTROID
    two = selection.ladder(scores, set(free))
    first, second = two["stages"]
    assert first["chosen"] == alone["chosen"] == two["chosen"] == second["against"] == "retrieved w1"
    assert second["level"] == pytest.approx(0.05 / 20)  # the model's options against stage 1's choice
    # a model option ahead of the real-review choice (not only of the centroid) takes over
    better = real + 0.02 + rng.normal(0, 0.01, 100)
    three = selection.ladder({**scores, "both w1": better, "both w2": base + 0.02}, set(free))
    assert three["chosen"] == "both w1" and three["stages"][0]["chosen"] == "retrieved w1"
    # ahead of the centroid but not of stage 1's choice: stage 1's choice stays
    assert selection.ladder({**scores, "both w2": base + 0.011}, set(free))["chosen"] == "retrieved w1"
    assert selection.is_model_free("retrieved", {"llm", "sample", "user", "item"})
    assert not selection.is_model_free("retrieved-vs-all", {"llm", "user", "item"})
    assert selection.is_model_free("retrieved-vs-all", {"user", "item"})


def test_without_generated_candidates_the_real_pools_compete_once():
    assert selection.distinct_pools({"user", "item"}) == ["retrieved"]
    assert selection.distinct_pools({"llm", "sample", "user", "item"}) == [
        "generated", "retrieved", "both", "retrieved-vs-all", "generated-vs-all", "answer"
    ]  # fmt: skip


def agent_for(yelp_store, tasks_dir, **config):
    store = ReviewStore.open(yelp_store, tasks=tasks_dir)
    agent_config = AgentConfig(kind="stats", selection="mbr", candidates_user=2, candidates_item=2,
                               pool="retrieved", **config)  # fmt: skip
    agent = ReviewAgent(agent_config, None, store, encoder=lambda t: hashed_bag_of_words(t, 64))
    targets = read_targets(tasks_dir)
    return agent, [{**t, "ts": targets[t["task_id"]]["ts"]} for t in read_tasks(tasks_dir)]


@pytest.mark.slow
def test_every_pool_holds_the_nearest_centroid_review_and_a_rule_is_followed_per_group(
    yelp_store, tmp_path, make_tasks, monkeypatch
):
    monkeypatch.setattr(agent_module, "load_llm", None)
    tasks_dir = make_tasks(yelp_store, tmp_path / "tasks", n=60, seed=0)
    rule = tmp_path / "rule.json"
    groups = {
        "new_item": {"pool": CENTROID},
        "item_with_history": {"pool": "retrieved", "sentiment_weight": 0},
    }
    rule.write_text(json.dumps({"groups": groups}))
    agent, tasks = agent_for(yelp_store, tasks_dir, selection_rule=str(rule))
    predictions = agent.predict(tasks)
    rows, _ = baselines.from_history(
        yelp_store, tasks_dir, "nearest-centroid", encoder=lambda t: hashed_bag_of_words(t, 64)
    )
    baseline = {r["task_id"]: r["review"] for r in rows}
    groups_seen = {p.group for p in predictions}
    assert groups_seen == {"new_item", "item_with_history"}  # this sample of 60 has both
    for task, p in zip(tasks, predictions, strict=True):
        (marked,) = [c for c in p.candidates if c.get("centroid")]
        assert marked["text"] == baseline[task["task_id"]]  # the baseline's review is in every pool
        new = not agent.store.has_reviews(item_id=task["item_id"], before=task["ts"])
        assert p.group == ("new_item" if new else "item_with_history")
        if new:
            assert p.review == baseline[task["task_id"]] and p.selection == "new_item: centroid"
        else:  # MBR over the retrieved reviews with weight 0
            sources = [c["source"] for c in p.candidates]
            vectors = agent.retriever.embed([c["text"] for c in p.candidates])
            vader = np.array([c["vader"] for c in p.candidates])
            assert p.chosen == choose(sources, vectors, vader, 0.0, 0.0, "retrieved")
    # similar: the user's review most similar to the item, what the stats agent writes without selection
    rule.write_text(json.dumps({"groups": {g: {"pool": SIMILAR} for g in groups}}))
    similar, _ = agent_for(yelp_store, tasks_dir, selection_rule=str(rule))
    plain = ReviewAgent(
        AgentConfig(kind="stats"), None, agent.store, encoder=lambda t: hashed_bag_of_words(t, 64)
    )
    chose = similar.predict(tasks)
    assert [p.review for p in chose] == [p.review for p in plain.predict(tasks)]
    assert all(p.selection.endswith(": similar") for p in chose)
    assert sum(p.review != baseline[p.task_id] for p in chose) > 10  # not the centroid's review
    without = AgentConfig(kind="stats", selection="mbr", pool="retrieved", selection_rule=str(rule))
    with pytest.raises(ValueError, match="candidates_user >= 1"):  # no user candidates: no such review
        ReviewAgent(without, None, agent.store, encoder=lambda t: hashed_bag_of_words(t, 64))
    bad = tmp_path / "bad.json"
    for broken in (
        {"groups": {"new_item": {"pool": CENTROID}}},
        {"groups": {**groups, "new_item": {"pool": "x"}}},
        {"groups": {**groups, "item_with_history": {"pool": "retrieved"}}},  # an MBR pool needs its weight
        {"groups": {**groups, "new_item": "centroid"}},
    ):
        bad.write_text(json.dumps(broken))
        with pytest.raises(ValueError, match="selection rule|pool"):
            read_rule(bad)
    with pytest.raises(ValueError, match="selection_rule is for selection: mbr"):
        ReviewAgent(AgentConfig(kind="stats", selection_rule=str(rule)), None, agent.store)


@pytest.mark.slow
def test_the_suite_chooses_the_rule_on_validation_and_the_run_is_fingerprinted_by_it(
    yelp_store, tmp_path, make_tasks
):
    tasks = make_tasks(yelp_store, tmp_path / "tasks", n=80, seed=0)
    val = tmp_path / "val"
    split.main(f"--data {yelp_store} --out {val} --validation-for {tasks} --min-history 2".split())
    out = tmp_path / "suite"
    table, agents, claims = suite.run_suite(
        yelp_store, tasks, out, adapter=None, kinds=("stats-mbr",), validation=val
    )
    report = json.loads((out / "validation" / "stats-mbr" / "rule.json").read_text())
    assert report["validation_tasks"] == len(read_tasks(val)) and report["left_out_adapter_trained"] == 0
    for group, chosen in report["groups"].items():
        v = report["validation"][group]
        (stage,) = v["stages"]  # without an LLM every option is model-free: one stage
        assert v["tasks"] > 0 and {SIMILAR, CENTROID} <= set(stage["options"])  # the stats agent's review too
        assert chosen["pool"] == (CENTROID if v["chosen"] == CENTROID else v["chosen"].split(" w")[0])
    rows = [json.loads(line) for line in (out / "sim" / "stats-mbr" / "predictions.jsonl").open()]
    nc = {json.loads(line)["task_id"]: json.loads(line)["review"] for line in (out / "baselines" / "nearest-centroid.jsonl").open()}  # fmt: skip
    kept_centroid = [row for row in rows if report["groups"][row["group"]]["pool"] == CENTROID]
    assert kept_centroid  # on this sample the rule keeps the baseline's review for some group
    for row in rows:
        assert row["selection"].startswith(row["group"] + ": " + report["groups"][row["group"]]["pool"])
    for row in kept_centroid:
        assert row["review"] == nc[row["task_id"]]  # the same review as the baseline, by construction
    assert (
        "reviews chosen by the rule chosen on" in agents
        and "| stats-mbr > nearest-centroid | overall |" in claims
    )
    # the rule decides the run: a changed rule refuses to resume the run made with the old one
    rule = out / "validation" / "stats-mbr" / "rule.json"
    argv = ["--config", "configs/review/stats-mbr.yaml", "--data", str(yelp_store), "--tasks", str(tasks)]
    # a rule names what it was chosen with: another visibility (or agent, LLM, adapter, store) refuses it
    with pytest.raises(SystemExit, match="chosen on validation with another"):
        simulate.main([*argv, "--out", str(tmp_path / "other"), "--selection_rule", str(rule),
                       "--visibility", "official"])  # fmt: skip
    # the same choices with other validation figures (chosen again after a change to the options):
    # the run resumes, nothing redone
    made = out / "sim" / "stats-mbr" / "predictions.jsonl"
    before = made.read_bytes()
    again = json.loads(rule.read_text())
    again["validation"]["new_item"]["tasks"] += 1
    for chosen in again["groups"].values():  # the same choice, spelt otherwise
        chosen["sentiment_weight"] = float(chosen.get("sentiment_weight", 0))
    rule.write_text(json.dumps(again))
    simulate.main([*argv, "--out", str(out / "sim" / "stats-mbr"), "--selection_rule", str(rule)])
    assert made.read_bytes() == before
    # which tasks draw samples under a rule is in the run's fingerprint, and only under a rule
    ran_with_rule = json.loads((out / "sim" / "stats-mbr" / "fingerprint.json").read_text())
    ran_without = json.loads((out / "validation" / "sim" / "stats-mbr" / "fingerprint.json").read_text())
    assert "rule_sampling" in json.dumps(ran_with_rule) and "rule_sampling" not in json.dumps(ran_without)
    edited = json.loads(rule.read_text())
    edited["groups"]["item_with_history"] = {"pool": "retrieved", "sentiment_weight": 3.0}  # never chosen
    rule.write_text(json.dumps(edited))
    with pytest.raises(SystemExit, match="run started from other inputs; changed: .*selection_rule"):
        simulate.main([*argv, "--out", str(out / "sim" / "stats-mbr"), "--selection_rule", str(rule)])
    # validation tasks the adapter trained on are left out; folders not made for this are refused
    run = out / "validation" / "sim" / "stats-mbr"
    summary = json.loads((run / "summary.json").read_text())
    trained = [t["review_id"] for t in list(read_targets(val).values())[:5]]
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "training_data.json").write_text(json.dumps({"train_review_ids": trained}))
    (run / "summary.json").write_text(json.dumps({**summary, "llm": {"adapter": str(tmp_path / "adapter")}}))
    assert selection.choose_rule(run, yelp_store, val)["left_out_adapter_trained"] == 5
    (tmp_path / "adapter" / "training_data.json").unlink()  # what it trained on is unknown: refused
    with pytest.raises(SystemExit, match="no training_data.json"):
        selection.choose_rule(run, yelp_store, val)
    (run / "summary.json").write_text(json.dumps(summary))
    predictions = (run / "predictions.jsonl").read_text().splitlines()
    (run / "predictions.jsonl").write_text("\n".join(predictions[:-1]) + "\n")  # an unfinished run
    with pytest.raises(SystemExit, match=f"predicted {len(predictions) - 1} of the {len(predictions)}"):
        selection.choose_rule(run, yelp_store, val)
    (run / "predictions.jsonl").write_text("\n".join(predictions) + "\n")
    with pytest.raises(SystemExit, match="was not run on"):
        selection.choose_rule(run, yelp_store, tasks)
    with pytest.raises(SystemExit, match="not a validation folder"):  # a rule chosen on the scored tasks
        selection.choose_rule(out / "sim" / "stats-mbr", yelp_store, tasks)
    with pytest.raises(SystemExit, match="not a validation folder drawn for"):
        suite.run_suite(yelp_store, val, tmp_path / "x", adapter=None, kinds=("stats-mbr",), validation=val)
