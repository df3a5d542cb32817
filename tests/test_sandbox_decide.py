"""The sandbox's decisions: the backend's scores of given answers equal a plain forward pass per answer,
score mode chooses by score with the features' weights, the features reach the prompts of the
decisions they name, pmi removes an option's own prior, an adapter scores only the choice of a film."""

from collections import Counter

import numpy as np
import pytest
import torch
from sandbox_fakes import PageScoring, Recording, Scoring, Scripted, embed

from agents.llm import HFBackend, LLMConfig
from agents.sandbox.config import load_config
from agents.sandbox.decide import Decider, priors
from agents.sandbox.profiles import movielens_profiles
from agents.sandbox.world import PAGE_ACTIONS, PLACES, World
from data_prep import movielens
from data_prep.prompt import FEATURE_TEXT, build_sandbox_messages, render_prompt


@pytest.fixture(scope="module")
def ml(raw):
    return movielens.load(raw / "movielens_latest_small")


def test_scores_with_a_shared_prompt_cache_equal_one_forward_pass_per_answer(tiny_model):
    backend = HFBackend(LLMConfig(model=str(tiny_model), generation_batch_size=2))
    conversations = [
        [{"role": "user", "content": "Pick one film please"}],
        [
            {"role": "system", "content": "You are a long-winded person who likes films"},
            {"role": "user", "content": "Which?"},
        ],
        [{"role": "user", "content": "x"}],
    ]
    options = [["Heat (1995)", "Toy Story (1995)"], ["Alien", "Up", "The Matrix (1999)"], ["a"]]
    got = backend.score(conversations, options, max_rows=3)  # left-padded batches, several passes
    tokenizer, model = backend.tokenizer, backend.model
    for conversation, group, values in zip(conversations, options, got, strict=True):
        prompt = tokenizer(render_prompt(tokenizer, conversation), add_special_tokens=False)["input_ids"]
        for option, (logp, n) in zip(group, values, strict=True):
            answer = tokenizer(option + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                lp = torch.log_softmax(model(torch.tensor([prompt + answer])).logits[0].float(), -1)
            expected = sum(float(lp[len(prompt) + j - 1, answer[j]]) for j in range(len(answer)))
            assert n == len(answer) and logp == pytest.approx(expected, abs=1e-4)


def test_features_multiply_the_probabilities_of_the_options_they_name():
    assert priors(["Watcher"], "place", PLACES, 2.0).tolist() == [2, 1, 1]
    assert priors(["Chatter", "Poster"], "place", PLACES, 2.0).tolist() == [1, 4, 1]
    assert priors(["Explorer", "Critic"], "page", PAGE_ACTIONS, 3.0).tolist() == [1, 3, 3, 3]
    assert priors(["Watcher"], "contact", ["Ann", "Bo"], 2.0).tolist() == [1, 1]  # names nothing here


def decider(overrides, backend, seed=0):
    config = load_config(None, ["decision.mode=score", *overrides])
    return Decider(config, backend, np.random.default_rng(seed), Counter())


def test_score_mode_chooses_by_score_and_a_feature_tips_the_choice():
    backend = Scoring(prefer={"social": -1.0, "recommender": -1.5, "nothing": -9.0})
    prompts = [build_sandbox_messages("x", [], "Where?", "now")] * 2
    greedy = decider(["temperature=0", "features.weight=2"], backend)
    # log 2 = 0.69 outweighs the 0.5 the LLM prefers social by
    assert greedy.choose("place", ["A", "B"], prompts, PLACES, [["Watcher"], []]) == ["recommender", "social"]
    sampled = decider(["temperature=1", "features.weight=2"], backend)
    draws = [sampled.choose("place", ["A", "B"], prompts, PLACES, [["Watcher"], []]) for _ in range(3000)]
    share = [np.mean([d[k] == "recommender" for d in draws]) for k in (0, 1)]
    e = np.exp
    expected = [2 * e(-1.5) / (2 * e(-1.5) + e(-1) + e(-9)), e(-1.5) / (e(-1.5) + e(-1) + e(-9))]
    assert share == pytest.approx(expected, abs=0.03)  # the Watcher goes to the recommender more often


def test_pmi_removes_each_option_prior_once_per_instruction():
    def prefer(option):
        return {"Heat": -1.0, "Up": -2.0}[option]

    class Prior(Scoring):
        def score(self, conversations, options):
            self.scored.append((conversations, options))
            neutral = "You are a person." in conversations[0][0]["content"]
            return [
                [(prefer(o) + (0.5 if neutral and o == "Heat" else 0.0), 2) for o in group]
                for group in options
            ]

    backend = Prior()
    d = decider(["decision.normalisation=pmi"], backend)
    prompt = build_sandbox_messages("User 1", [], "Which film?", "now")
    first = d.all_scores("watch", [prompt], [["Heat", "Up"]])
    assert first["sum"][0].tolist() == [-1.0, -2.0] and first["mean"][0].tolist() == [-0.5, -1.0]
    assert first["pmi"][0].tolist() == [-1.0 - (-0.5), -2.0 - (-2.0)]  # Heat's own prior (-0.5) removed
    d.all_scores("watch", [prompt], [["Heat", "Up"]])
    assert len(backend.scored) == 3  # the neutral prompt was scored once, then cached
    assert d.scores("watch", [prompt], [["Heat", "Up"]])[0].tolist() == [-0.5, 0.0]


def test_an_adapter_scores_the_choice_of_a_film_and_the_base_model_everything_else(tiny_model, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    torch.manual_seed(0)
    lora = get_peft_model(
        model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    lora.save_pretrained(tmp_path / "adapter")
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(tmp_path / "adapter")  # as train.sft saves it
    tuned = HFBackend(LLMConfig(model=str(tiny_model), adapter=str(tmp_path / "adapter")))
    base = HFBackend(LLMConfig(model=str(tiny_model)))
    prompt = [build_sandbox_messages("User 1", [], "Which film?", "now")]
    d = decider([], tuned)
    with_adapter = d.scores("watch", prompt, [["Heat", "Up"]])[0]
    without = d.scores("place", prompt, [["Heat", "Up"]])[0]
    plain = decider([], base).scores("watch", prompt, [["Heat", "Up"]])[0]
    assert np.allclose(without, plain) and not np.allclose(with_adapter, plain)
    with tuned.adapter_off():  # nested blocks: the outer one keeps it off
        with tuned.adapter_off():
            pass
        assert np.allclose(d.scores("watch", prompt, [["Heat", "Up"]])[0], plain)
    everything = decider(["decision.adapter_scope=all"], tuned).scores("place", prompt, [["Heat", "Up"]])[0]
    assert np.allclose(everything, with_adapter)


def test_score_mode_needs_a_backend_that_scores():
    with pytest.raises(ValueError, match="decision.mode: score needs a backend that scores answers"):
        decider([], Scripted({}))


def world(ml, backend, overrides=(), n=5):
    config = load_config(None, ["recommender.kind=popularity", "activity.pareto_xmin=1", *overrides])
    rng = np.random.default_rng(config.seed)
    profiles = movielens_profiles(ml, n, ml.end, rng, config.features, config.min_history)
    names = [p.name for p in profiles]
    return World(config, profiles, ml, backend, embed, {n: set(names) - {n} for n in names}, rng)


def test_in_generate_mode_a_feature_is_named_only_in_the_decisions_it_bears_on(ml):
    backend = Recording()
    w = world(ml, backend, ["features.sample_share=1"])  # every agent a Chatter and a Poster too
    w.step()
    place = [p for p in backend.prompts if "What do you do now?" in p]
    page = [p for p in backend.prompts if "The recommender shows" in p]
    social = [p for p in backend.prompts if "Chat with one contact" in p]
    assert place and page and social
    assert all(FEATURE_TEXT["Chatter"] in p and FEATURE_TEXT["Poster"] in p for p in place)
    assert all(FEATURE_TEXT["Chatter"] not in p for p in page)
    assert all(FEATURE_TEXT["Watcher"] not in p and FEATURE_TEXT["Chatter"] in p for p in social)


@pytest.mark.slow
def test_a_score_mode_round_watches_the_best_scored_film_and_features_tip_the_place(ml):
    def favourite(option):  # a page's films by their line (title first), the other options by name
        places = {"recommender": -1.0, "social": -0.9, "watch": -0.2}
        return -0.1 if "(1995)" in option else places.get(option, -5.0)

    backend = PageScoring(prefer=favourite)
    overrides = ["decision.mode=score", "temperature=0", "features.weight=2", "features.sample_share=0"]
    w = world(ml, backend, [*overrides, "features.from_data=false"])
    events, stats = w.step()
    assert {e["action"] for e in events if e["action"].startswith("go:")} == {"go:social"}  # the LLM's pick
    for agent in w.agents.values():
        agent.profile.features = ["Watcher"]  # now the feature outweighs the LLM's 0.1
    events, stats = w.step()
    assert {e["action"] for e in events if e["action"].startswith("go:")} == {"go:recommender"}
    watches = [e for e in events if e["action"] == "watch"]
    pages = {e["agent"]: e["items"] for e in events if e["action"] == "browse"}
    assert len(watches) == len(w.agents) and stats["watches"] == len(watches)
    for event in watches:
        titles = [ml.movies[m].title for m in pages[event["agent"]]]
        best = next((t for t in titles if "(1995)" in t), titles[0])
        assert ml.movies[event["item"]].title == best
