"""The fidelity report by hand, the nearest-centroid baseline, MBR selection, and W&B logging (offline)."""

import json

import numpy as np
import pytest

from agents.llm import Answer, LLMConfig
from agents.retrieval import hashed_bag_of_words
from agents.review import agent as agent_module
from agents.review.agent import AgentConfig, ReviewAgent
from agents.review.select import SentimentByStars, mbr_index, reselect
from data_prep.store import ReviewStore
from data_prep.tasks import read_groundtruth, read_targets, read_tasks
from eval import tracking
from eval.review import baselines, score
from eval.review.fidelity import fidelity


def test_fidelity_figures_match_a_hand_computation():
    pred = ["good food", "good food", "Bad  service here"]
    real = ["good food and more", "awful", "bad service", "nice"]
    f = fidelity([5, 5, 1], pred, [5, 4, 1, 3], real, store_texts=["bad service here", "other"])
    # stars: W1 between {1,5,5} and {1,3,4,5}, the area between the CDFs (1/3 on [1,5) against
    # 1/4, 1/2, 3/4 on [1,3), [3,4), [4,5)): 2 * 1/12 + 1/6 + 5/12 = 0.75
    assert f["star_wasserstein"] == pytest.approx(2 / 12 + 1 / 6 + 5 / 12, abs=1e-4)
    # lengths {2,2,3} vs {4,1,2,1}: the largest CDF gap is at 1 word (0 vs 1/2) or 2 (2/3 vs 3/4) -> 1/2
    assert f["length_ks"] == pytest.approx(0.5)
    assert f["distinct_1"] == pytest.approx(5 / 7, abs=1e-4)  # good food good food bad service here: 5 of 7
    assert f["distinct_2"] == pytest.approx(
        3 / 4, abs=1e-4
    )  # (good food) twice, (bad service), (service here)
    # vocabularies {good, food, bad, service, here} and {good, food, and, more, awful, bad, service, nice}
    assert f["vocabulary_overlap"] == pytest.approx(4 / 9, abs=1e-4)
    assert f["repeated_share"] == pytest.approx(2 / 3, abs=1e-4)  # "good food" twice
    assert f["copied_share"] == pytest.approx(
        1 / 3, abs=1e-4
    )  # "Bad  service here" is a store review, case and spaces aside
    assert fidelity([5], ["x"], [5], ["x"])["copied_share"] is None  # no store: unknown, not 0


def test_nearest_centroid_picks_the_item_review_nearest_the_users_reviews():
    history = [{"text": "tacos salsa", "stars": 5.0}, {"text": "tacos tacos", "stars": 2.0},
               {"text": "salsa verde", "stars": 4.0}]  # fmt: skip
    pool = [{"text": "coffee shop"}, {"text": "salsa tacos here"}, {"text": "tacos"}]
    row, counts = {}, {}
    baselines.nearest_centroid([(row, history, pool)], lambda t: hashed_bag_of_words(t, 64), counts)
    vectors = hashed_bag_of_words([r["text"] for r in history + pool], 64)
    centroid = vectors[:3].mean(axis=0)
    expected = pool[int(np.argmax(vectors[3:] @ centroid))]["text"]
    assert row == {"stars": 4.0, "review": expected} and expected != "coffee shop"  # the median stars
    lonely = {}
    baselines.nearest_centroid([(lonely, history, [])], lambda t: hashed_bag_of_words(t, 64), counts)
    assert lonely["review"] in {r["text"] for r in history} and counts["no_item_review"] == 1


def test_nearest_centroid_baseline_never_uses_a_later_review(yelp_store, tmp_path, make_tasks):
    tasks = make_tasks(yelp_store, tmp_path / "tasks", n=15, seed=3)
    encoder = lambda t: hashed_bag_of_words(t, 64)  # noqa: E731
    rows, _ = baselines.from_history(yelp_store, tasks, "nearest-centroid", encoder=encoder)
    store = ReviewStore.open(yelp_store, tasks=tasks)
    targets = read_targets(tasks)
    for row in rows:
        if row.get("fallback"):
            continue
        before = targets[row["task_id"]]["ts"]
        older = store.get_reviews(item_id=row["item_id"], before=before) + store.get_reviews(
            user_id=row["user_id"], before=before
        )
        assert row["review"] in {r["text"] for r in older}
        assert row["review"] != read_groundtruth(tasks, row["task_id"])["review"]


def test_mbr_picks_the_candidate_the_others_agree_with_and_weighs_sentiment():
    e = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]])  # unit rows; the middle one agrees with both
    assert mbr_index(e, np.zeros(3), 0.0, 1.0) == 1
    # topic risk, the mean of (1 - cos) / 2 over the others: candidate 0 (0.2 + 1) / 4 = 0.3,
    # candidate 1 (0.2 + 0.4) / 4 = 0.15, candidate 2 (1 + 0.4) / 4 = 0.35
    sentiments = np.array([0.9, -0.9, 0.9])  # the middle one has the wrong sentiment for a target of 0.9
    # risks: 0.5 * 0.3 = 0.15; 0.5 * 0.15 + 0.25 * 1.8 / 2 = 0.3; 0.5 * 0.35 = 0.175 -> candidate 0
    assert mbr_index(e, sentiments, 0.9, 1.0) == 0
    assert mbr_index(e, sentiments, 0.9, 0.0) == 1  # sentiment off: agreement alone
    assert mbr_index(e[:1], sentiments[:1], 0.0, 1.0) == 0
    # choosing only among rows 0 and 2, each still judged against all three: row 0 (risk 0.15 vs 0.175)
    assert mbr_index(e, sentiments, 0.9, 1.0, choose=[0, 2]) == 0
    assert mbr_index(e, np.zeros(3), 0.0, 1.0, choose=[2]) == 2
    with pytest.raises(ValueError, match="at least one candidate"):
        mbr_index(np.zeros((0, 2)), np.zeros(0), 0.0, 1.0)


def test_expected_sentiment_uses_only_older_reviews_of_those_stars():
    by_stars = SentimentByStars([(10, 5.0, 0.8), (20, 5.0, 0.4), (30, 1.0, -0.6), (40, 5.0, -1.0)])
    assert by_stars.expected(5, 25) == pytest.approx(0.6)  # the two 5-star reviews before 25
    assert by_stars.expected(4.6, None) == pytest.approx((0.8 + 0.4 - 1.0) / 3)  # rounds to 5; all of them
    assert by_stars.expected(2, 35) == pytest.approx(-0.6)  # no 2-star review: the nearest value with some
    assert by_stars.expected(3, 5) == 0.0  # nothing older at all


class SamplingLLM:
    """The greedy answer, then distinct sampled reviews: each text says which call and row made it."""

    def __init__(self):
        self.calls, self.rows = [], []

    def generate(self, conversations, sampling, constraint=None):
        self.calls.append(sampling.temperature)
        self.rows.append(len(conversations))
        kind = "greedy" if sampling.temperature == 0 else "sampled"
        return [Answer(f"stars: 4\nreview: {kind} text number {i}") for i in range(len(conversations))]


@pytest.mark.slow
@pytest.mark.parametrize("pool", ["generated", "retrieved", "both", "retrieved-vs-all", "answer"])
def test_mbr_agent_keeps_its_pool_and_chooses_only_from_the_configured_sources(
    pool, yelp_store, tmp_path, make_tasks, monkeypatch
):
    tasks_dir = make_tasks(yelp_store, tmp_path / "tasks", n=6, seed=2)
    monkeypatch.setattr(agent_module, "load_llm", lambda config: SamplingLLM())
    config = AgentConfig(kind="retrieval-llm", selection="mbr", samples=3, candidates_user=2, candidates_item=2,
                         pool=pool)  # fmt: skip
    store = ReviewStore.open(yelp_store, tasks=tasks_dir)
    agent = ReviewAgent(config, LLMConfig(), store, encoder=lambda t: hashed_bag_of_words(t, 64))
    targets = read_targets(tasks_dir)
    tasks = [{**t, "ts": targets[t["task_id"]]["ts"]} for t in read_tasks(tasks_dir)]
    predictions = agent.predict(tasks)
    allowed = {
        "generated": {"llm", "sample"},
        "retrieved": {"user", "item"},
        "both": {"llm", "sample", "user", "item"},
        "retrieved-vs-all": {"user", "item"},
        "answer": {"llm"},  # the agent without selection: its greedy answer, always
    }
    for task, p in zip(tasks, predictions, strict=True):
        sources = [c["source"] for c in p.candidates]
        assert sources[:4] == ["llm", "sample", "sample", "sample"]
        k = tasks.index(task)  # each task gets its own samples: rows 3k .. 3k+2 of the sampling call
        assert [c["text"] for c in p.candidates[1:4]] == [
            f"sampled text number {3 * k + j}" for j in range(3)
        ]
        assert p.review == p.candidates[p.chosen]["text"]
        assert p.counts["llm_answers"] == 1 and p.counts["samples_cut_short"] == 0  # the answer's counts kept
        older = {r["text"] for r in store.get_reviews(user_id=task["user_id"], before=task["ts"])}
        older |= {r["text"] for r in store.get_reviews(item_id=task["item_id"], before=task["ts"])}
        assert all(c["text"] in older for c in p.candidates if c["source"] in ("user", "item"))
        # every user here has older reviews (make_tasks), so every pool has real candidates to choose
        assert not p.counts["empty_pool"] and p.candidates[p.chosen]["source"] in allowed[pool]
        if pool == "answer":
            assert p.chosen == 0
    assert agent.llm.calls == [0.0, 0.8]  # one greedy pass, one sampling pass per batch
    # re-choosing offline from the kept pools (eval.review.selection) gives the agent's own choices
    rows = [
        {"task_id": p.task_id, "stars": p.stars, "review": p.review, "candidates": p.candidates}
        for p in predictions
    ]
    texts = sorted({c["text"] for r in rows for c in r["candidates"]})
    vectors = dict(zip(texts, agent.retriever.embed(texts), strict=True))
    targets = [agent.sentiment.expected(p.stars, t["ts"]) for p, t in zip(predictions, tasks, strict=True)]
    again = reselect(rows, vectors, targets, pool, config.sentiment_weight)
    assert [r["chosen"] for r in again] == [p.chosen for p in predictions]


@pytest.mark.slow
def test_a_retrieved_pool_with_nothing_older_keeps_the_llms_answer_and_counts_it(
    yelp_store, tmp_path, make_tasks, monkeypatch
):
    tasks_dir = make_tasks(yelp_store, tmp_path / "tasks", n=4, seed=2)
    monkeypatch.setattr(agent_module, "load_llm", lambda config: SamplingLLM())
    config = AgentConfig(kind="retrieval-llm", selection="mbr", samples=0, candidates_user=2, candidates_item=2,
                         pool="retrieved")  # fmt: skip
    store = ReviewStore.open(yelp_store, tasks=tasks_dir)
    agent = ReviewAgent(config, LLMConfig(), store, encoder=lambda t: hashed_bag_of_words(t, 64))
    targets = read_targets(tasks_dir)
    tasks = [{**t, "ts": targets[t["task_id"]]["ts"]} for t in read_tasks(tasks_dir)]
    first = min(ts for _, ts in store.visible_texts())
    early = [{**tasks[0], "ts": first}, tasks[1]]  # at the store's first moment nothing is older
    lonely, usual = agent.predict(early)
    assert [c["source"] for c in lonely.candidates] == ["llm"] and lonely.counts["empty_pool"] == 1
    assert lonely.chosen == 0 and lonely.review == "greedy text number 0"
    assert not usual.counts["empty_pool"] and usual.candidates[usual.chosen]["source"] in {"user", "item"}


@pytest.mark.slow
def test_under_a_rule_only_the_tasks_whose_choice_uses_samples_draw_them(
    yelp_store, tmp_path, make_tasks, monkeypatch
):
    tasks_dir = make_tasks(yelp_store, tmp_path / "tasks", n=60, seed=0)  # both groups (test_selection)
    monkeypatch.setattr(agent_module, "load_llm", lambda config: SamplingLLM())
    store = ReviewStore.open(yelp_store, tasks=tasks_dir)
    targets = read_targets(tasks_dir)
    tasks = [{**t, "ts": targets[t["task_id"]]["ts"]} for t in read_tasks(tasks_dir)]
    rule = tmp_path / "rule.json"

    def run(groups, every_task=False):
        rule.write_text(json.dumps({"groups": groups}))
        config = AgentConfig(kind="retrieval-llm", selection="mbr", samples=3, candidates_user=2,
                             candidates_item=2, batch_size=60, selection_rule=str(rule))  # fmt: skip
        agent = ReviewAgent(config, LLMConfig(), store, encoder=lambda t: hashed_bag_of_words(t, 64))
        if every_task:  # as before: samples for every task, whatever its group's choice
            agent.wants_samples = lambda ctx: True
        return agent, agent.predict(tasks)

    mixed = {"new_item": {"pool": "centroid"}, "item_with_history": {"pool": "both", "sentiment_weight": 1}}
    agent, predictions = run(mixed)
    warm = [p for p in predictions if p.group == "item_with_history"]
    assert 0 < len(warm) < len(predictions)
    assert agent.llm.rows == [60, 3 * len(warm)]  # one greedy pass; samples for the warm tasks only
    for p in predictions:
        drawn = [c for c in p.candidates if c["source"] == "sample"]
        if p.group == "new_item":
            assert (
                not drawn and p.counts["samples_not_needed"] == 3 and p.candidates[p.chosen].get("centroid")
            )
        else:
            assert len(drawn) == 3 and not p.counts["samples_not_needed"]
    # a choice that uses no samples anywhere: no sampling pass, and the same predictions as with them
    centroid = {g: {"pool": "centroid"} for g in mixed}
    agent, lean = run(centroid)
    assert agent.llm.calls == [0.0] and all(p.counts["samples_not_needed"] == 3 for p in lean)
    _, full = run(centroid, every_task=True)
    assert all(any(c["source"] == "sample" for c in p.candidates) for p in full)
    assert [(p.stars, p.review) for p in lean] == [(p.stars, p.review) for p in full]


@pytest.mark.slow
def test_stats_mbr_chooses_among_retrieved_reviews_without_an_llm(
    yelp_store, tmp_path, make_tasks, monkeypatch
):
    monkeypatch.setattr(agent_module, "load_llm", None)  # calling it would fail
    tasks_dir = make_tasks(yelp_store, tmp_path / "tasks", n=6, seed=2)
    config = AgentConfig(
        kind="stats", selection="mbr", candidates_user=2, candidates_item=2, pool="retrieved"
    )
    store = ReviewStore.open(yelp_store, tasks=tasks_dir)
    agent = ReviewAgent(config, None, store, encoder=lambda t: hashed_bag_of_words(t, 64))
    targets = read_targets(tasks_dir)
    tasks = [{**t, "ts": targets[t["task_id"]]["ts"]} for t in read_tasks(tasks_dir)]
    for task, p in zip(tasks, agent.predict(tasks), strict=True):
        assert {c["source"] for c in p.candidates} <= {
            "user",
            "item",
            "fallback",
        } and p.review == p.candidates[p.chosen]["text"]
        older = {r["text"] for r in store.get_reviews(user_id=task["user_id"], before=task["ts"])}
        older |= {r["text"] for r in store.get_reviews(item_id=task["item_id"], before=task["ts"])}
        assert p.review in older
    with pytest.raises(ValueError, match="no LLM"):
        ReviewAgent(
            AgentConfig(kind="stats", selection="mbr", pool="both"), None, store, encoder=hashed_bag_of_words
        )


@pytest.mark.slow
def test_review_eval_logs_to_wandb_offline_into_the_adapters_group(
    yelp_store, tmp_path, make_tasks, monkeypatch, offline_scorers
):
    monkeypatch.setenv("WANDB_SILENT", "true")
    tasks = make_tasks(yelp_store, tmp_path / "tasks", n=8, seed=4)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "training_card.json").write_text(json.dumps({"wandb": {"project": "p1", "group": "sft-abc"}}))
    predictions = tmp_path / "pred.jsonl"
    rows = [{"task_id": t["task_id"], "stars": 4, "review": "Good place."} for t in read_tasks(tasks)]
    predictions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "pred.summary.json").write_text(
        json.dumps({"visibility": "time-aware", "llm": {"adapter": str(adapter)}})
    )
    assert tracking.target(tracking.adapter_of(predictions)) == {"project": "p1", "group": "sft-abc"}
    out = tmp_path / "eval"
    results = score.main(["--tasks", str(tasks), "--predictions", str(predictions), "--out", str(out),
                           "--data", str(yelp_store), "--wandb", "offline", "--device", "cpu"])  # fmt: skip
    assert results["fidelity"]["repeated_share"] == 1.0 and results["fidelity"]["copied_share"] is not None
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert (out / "fidelity.png").read_bytes()[:4] == b"\x89PNG"
    table = score.main(
        ["--compare", str(out / "results.json"), "--names", "x", "--out", str(tmp_path / "cmp")]
    )
    assert "| x | 8 |" in table and "100.0%" in table  # repeated share shown
