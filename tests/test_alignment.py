"""Rating alignment: hold-outs in time order, nothing after the cutoff reaching a method, MAE and the
paired intervals by hand, the agent's unusable answers replaced and counted."""

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from agents.llm import Answer
from data_prep.movielens import Movie, MovieLens, Rating
from eval.sandbox import alignment as al


def tiny():
    movies = {i: Movie(i, f"Movie {i}", ["Drama"]) for i in range(1, 7)}
    ratings = [
        Rating(1, 1, 2.0, 10), Rating(1, 2, 4.0, 20), Rating(1, 3, 5.0, 30), Rating(1, 4, 1.0, 30),
        Rating(2, 1, 3.5, 5), Rating(2, 5, 0.5, 40),
        Rating(3, 6, 5.0, 1), Rating(3, 3, 5.0, 60),  # user 3 rates movie 3 after user 1's cutoff
    ]  # fmt: skip
    ratings.sort(key=lambda r: (r.ts, r.movie))
    return MovieLens(movies, ratings, [], Counter())


def test_cases_hold_out_the_latest_and_see_only_the_strictly_older():
    (case,) = al.make_cases(tiny(), [1], held=2)
    assert case["held"] == [(3, 5.0), (4, 1.0)] and case["cutoff"] == 30  # tie at 30 broken by movie id
    assert case["history"] == [(1, 2.0), (2, 4.0)]
    assert al.predict_user_mean([case], tiny()) == [[3.0, 3.0]]
    (lonely,) = al.make_cases(tiny(), [2], held=2)  # nothing before the cutoff: the global mean then,
    assert lonely["history"] == [] and lonely["cutoff"] == 5  # of the one rating older than t=5
    assert al.predict_user_mean([lonely], tiny()) == [[5.0, 5.0]]


def test_whole_stars_round_half_up_inside_one_to_five():
    cases = [{"history": [(1, 3.0), (2, 4.0)], "held": [(3, 4.0)], "cutoff": 99}]
    assert al.predict_user_mean_whole(cases, tiny()) == [[4.0]]  # 3.5 -> 4, not numpy's 4 by evenness
    cases = [{"history": [(1, 0.5)], "held": [(3, 4.0)], "cutoff": 99}]
    assert al.predict_user_mean_whole(cases, tiny()) == [[1.0]]


def test_scores_by_hand():
    cases = [{"held": [(1, 4.0), (2, 2.0)]}, {"held": [(3, 5.0)]}]
    result = al.score(cases, {"agent": [[4.0, 4.0], [3.0]], "user_mean": [[3.0, 3.0], [5.0]]})
    agent, mean = result["methods"]["agent"], result["methods"]["user_mean"]
    assert agent["mae"] == pytest.approx(4 / 3, abs=1e-4)  # errors 0, 2, 2
    assert agent["rmse"] == pytest.approx(np.sqrt(8 / 3), abs=1e-4)
    assert mean["mae"] == pytest.approx(2 / 3, abs=1e-4)  # errors 1, 1, 0
    # per user: agent MAE 1 and 2, user mean 1 and 0 -> differences 0 and -2
    low, high = mean["mae_minus_agent_ci95"]
    assert low <= -1 <= high and high <= 0
    assert agent["distribution"] == {3.0: 1, 4.0: 2} and result["real_distribution"] == {
        2.0: 1,
        4.0: 1,
        5.0: 1,
    }
    assert mean["wasserstein_to_real"] == pytest.approx(2 / 3, abs=1e-4)


class Rater:
    """Probabilities of 1-5 all on one digit per prompt, in order (None: none could be read)."""

    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def option_probs(self, conversations, options, samples=8, seed=0, prefix=""):
        self.asked.append((conversations, list(options)))
        out = []
        for digit in self.answers[: len(conversations)]:
            if digit is None:
                out.append(Answer("", probs_from="samples"))
                continue
            probs = {o: float(o == digit) for o in options}
            out.append(Answer(digit, probs=probs, expected=float(digit), probs_from="logprobs"))
        return out


def test_the_bare_llm_reads_its_probabilities_and_unreadable_ones_fall_back_counted():
    data = tiny()
    cases = al.make_cases(data, [1], held=2)
    backend = Rater(["5", None])
    counts = Counter()
    predictions = al.predict_llm(cases, data, backend, np.random.default_rng(0), counts)
    assert predictions == [[5.0, 3.0]]  # the second replaced by the whole-star user mean
    assert counts["agent_fallbacks"] == 1
    assert counts["probs_from:logprobs"] == 1 and counts["probs_from:samples"] == 1
    ((conversations, options),) = backend.asked
    assert options == al.STARS
    for conversation, held in zip(conversations, ["Movie 3", "Movie 4"], strict=True):
        prompt = "\n".join(m["content"] for m in conversation)
        memories = [line for line in prompt.splitlines() if line.lstrip("- ").startswith("I rated")]
        assert memories == [m for m in memories if "Movie 1" in m or "Movie 2" in m] and len(memories) == 2
        assert held in prompt.split("The movie:")[1]  # the question names the movie, the memories do not


def test_mf_trains_only_on_ratings_before_each_users_cutoff(monkeypatch):
    seen = []

    class Spy:
        def __init__(self, **kwargs):
            pass

        def fit(self, train):
            seen.append(sorted((train.to_raw_uid(u), train.to_raw_iid(i)) for u, i, _ in train.all_ratings()))

        def predict(self, user, item):  # says which user and film it was asked about
            return SimpleNamespace(est=item + user / 10, details={})

    import surprise

    monkeypatch.setattr(surprise, "SVD", Spy)
    config = SimpleNamespace(recommender=SimpleNamespace(factors=4), seed=0)
    cases = al.make_cases(tiny(), [1], held=2)
    assert al.predict_mf(cases, tiny(), config) == [[3.1, 4.1]]  # user 1's held films, in order
    assert seen == [[(1, 1), (1, 2), (2, 1), (3, 6)]]  # user 3's rating of movie 3 at t=60 is later


def test_the_agent_rates_with_the_star_model_as_of_the_cutoff_and_asks_no_llm_without_a_blend():
    from sandbox_fakes import embed

    from agents.sandbox.config import load_config

    data = tiny()
    cases = al.make_cases(data, [1], held=2)
    backend = Rater([])
    counts = Counter()
    config = load_config(None, ["temperature=0"])
    got = al.predict_agent(cases, data, config, backend, embed, np.random.default_rng(0), counts)
    # user 1's older ratings are 2.0 and 4.0: their median, 3.0, stands where nothing beat it on
    # validation; everyone's mean before 30 (3.625) or user 3's later 5.0 for film 3 would move it
    assert got == [[3.0, 3.0]] and backend.asked == []  # no validation rows: the model alone, no LLM call
    assert (
        counts["llm_validation_rows"] == 0
        and sum(v for k, v in counts.items() if k.startswith("source:")) == 2
    )


def test_a_run_writes_its_table_with_the_note_on_the_tuned_row(raw, tmp_path):
    config = "configs/sandbox/movielens.yaml"
    data = [f"data={raw / 'movielens_latest_small'}"]
    results = al.run(config, data, tmp_path, 5, 2, "2010-01-01", 5, ["user_mean", "user_mean_whole"])
    assert results["ratings"] == 25 and set(results["scores"]["methods"]) == {"user_mean", "user_mean_whole"}
    table = (tmp_path / "table.md").read_text()
    assert "| user_mean |" in table and al.NO_TUNED_ROW in table


def test_the_tuned_rows_refuse_an_adapter_trained_on_choices_only(raw, tmp_path):
    import json

    from agents.sandbox.config import load_config
    from eval.sandbox.cases import data_digest

    folder = raw / "movielens_latest_small"
    config = load_config("configs/sandbox/movielens.yaml", [f"data={folder}"])
    options = {"round_days": 1.0, "retrieve_top": 3, "short_term_capacity": 3, "recency_decay": 0.99}
    adapter = tmp_path / "choice-only"
    adapter.mkdir()
    (adapter / "training_data.json").write_text(json.dumps({"latest_target_ts": 0}))
    card = {"data": {"task": "sandbox_choice", "data_sha256": data_digest(folder), "options": options}}
    (adapter / "training_card.json").write_text(json.dumps(card))
    with pytest.raises(SystemExit, match="trained on choices only"):
        al.rating_adapter(str(adapter), 10**10, config)
    card["data"]["options"]["ratings"] = 500
    (adapter / "training_card.json").write_text(json.dumps(card))
    assert al.rating_adapter(str(adapter), 10**10, config) is not None
    with pytest.raises(SystemExit, match="need --adapter"):
        al.run(
            "configs/sandbox/movielens.yaml", [f"data={folder}"], tmp_path, 2, 0, "2010-01-01", 2, ["tuned"]
        )
