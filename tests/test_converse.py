"""The conversational user simulator with a scripted backend: profile sampling and conflict
resolution, preference excitation, the rating -> action -> response order, each refinement tool's
judger and refiner, the end-of-conversation rules, replay, and a resumable run against both
recommenders."""

import argparse
import json
import math
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest
from converse_fakes import Scripted

from agents.converse import profiles
from agents.converse.config import ConfigError, load_config
from agents.converse.crs import AgentCRS, BaseCRS, Session, load_restaurants
from agents.converse.run import run
from agents.converse.simulator import JUDGEMENT, SCORES, User, UserSimulator, words_per_message
from agents.llm import Answer
from data_prep import recllmsim


@pytest.fixture(scope="module")
def sources(raw):
    return profiles.load_sources(raw / "recllmsim")


def config(*overrides):
    return load_config(None, list(overrides))


def persona(**changes):
    base = profiles.Persona(
        id=0, gender="Female", age=30, occupation="Engineer", personality=["Calm"], interests=["Reading"],
        spending=["Frugal"], preferences=["Seafood", "Japanese cuisine"], dislikes=["Fast food"],
        travel=["Road trips"], other=["Keeps a journal"],
        place="at home", time="evening", company="alone",
        language={"information_richness": "medium", "formality": "low", "message_length": "short"},
        action={"decisiveness": "decisive", "exploration": "exploratory"},
        task="Choose a restaurant for dinner.", task_type="choosing restaurant",
    )  # fmt: skip
    return replace(base, **changes)


def test_priors_come_from_the_data_and_sampling_follows_the_seed(sources, raw):
    priors, report, contexts = sources
    assert report["people"] == 31 and report["pool"] == 100
    # each tag: its count among the 31 real people's profiles, plus one
    from data_prep import recllmsim

    loaded = recllmsim.load(raw / "recllmsim")
    people = {c.persona: c.profile for c in loaded.conversations if c.source == "human"}
    students = sum(1 for p in people.values() if p["occupation"] == "学生")
    assert priors["occupation"]["Student"] == students + 1 and students > 0
    assert "Others" not in priors["occupation"]
    assert sum(priors["gender"].values()) == 131  # 31 people + 100 pool profiles
    one = profiles.sample_personas(
        5, priors, contexts, config(), np.random.default_rng(3), ["preparing gifts"]
    )
    two = profiles.sample_personas(
        5, priors, contexts, config(), np.random.default_rng(3), ["preparing gifts"]
    )
    assert [p.to_json() for p in one] == [p.to_json() for p in two]
    for p in one:
        assert not set(p.preferences) & set(p.dislikes) and "[" not in p.task
        assert set(p.language) == {"information_richness", "formality", "message_length"}


def test_template_slots_are_drawn_once_and_mapped():
    slots = {
        "TARGET": ["teacher", "nephew"],
        "REASON": [
            '[TARGET:{"teacher": "Teacher\'s Day", "nephew": "Children\'s Day"}] is near; visit your [TARGET]'
        ],
    }
    for seed in range(6):
        text = profiles.fill_template("Recently, [REASON].", slots, np.random.default_rng(seed))
        assert text in (
            "Recently, Teacher's Day is near; visit your teacher.",
            "Recently, Children's Day is near; visit your nephew.",
        )


def test_conflicts_are_found_by_the_llm_over_all_attributes_and_logged():
    from converse_fakes import Scripted as Fake

    # the LLM names two contradictions, one after the other, among any attributes: both dropped
    one = [
        persona(preferences=["Vegan", "Seafood"], interests=["Hiking", "Staying in"], travel=["Road trips"])
    ]
    backend = Fake(drop=["Seafood", "Staying in"])
    counts = profiles.resolve_conflicts(one, backend, np.random.default_rng(0))
    assert one[0].preferences == ["Vegan"] and one[0].interests == ["Hiking"]
    assert [(r["attribute"], r["dropped"]) for r in one[0].resolutions] == [
        ("preferences", "Seafood"), ("interests", "Staying in")]  # fmt: skip
    assert counts == {"asked": 3, "dropped": 2}  # the third round finds none
    prompt = backend.calls[0][1]
    assert all(v in prompt for v in ["Vegan", "Seafood", "Hiking", "Road trips", "Calm", "Frugal"])
    # an unusable answer leaves the persona as drawn, counted; a persona with no contradiction is untouched
    garbled = [persona(preferences=["Vegan", "Seafood"])]
    counts = profiles.resolve_conflicts(garbled, Fake(drop=None), np.random.default_rng(0))
    assert garbled[0].preferences == ["Vegan", "Seafood"] and counts["unusable_answers"] == 1
    calm = [persona()]
    assert profiles.resolve_conflicts(calm, Fake(), np.random.default_rng(0)) == {"asked": 1, "dropped": 0}
    assert calm[0].resolutions == []


class Reply:
    def __init__(self, text="Try Sushi Den.", recommended=("x",)):
        self.text, self.recommended = text, list(recommended) if recommended is not None else None


def test_persona_facts_style_tendencies_and_satisfaction_reach_the_prompts_that_carry_them():
    from agents.converse.simulator import TENDENCY, satisfaction_words

    backend = Scripted()
    simulator = UserSimulator(config("refinement.enabled=false"), backend, np.random.default_rng(0))
    who = persona(action={"decisiveness": "hesitant", "exploration": "conservative"},
                  language={"information_richness": "high", "formality": "high", "message_length": "long"})  # fmt: skip
    user = User(who)
    simulator.step([user], [None])
    simulator.step([user], [Reply("Try Umami Noodle Bar.")])
    prompts = {}
    for kind, prompt in backend.calls:
        prompts.setdefault(kind, []).append(prompt)
    assert set(prompts) == {"action", "response", "rating"}
    for kind, texts in prompts.items():  # who the user is and what they want: in every decision
        assert all(who.describe() in t and f"Your task: {who.task}" in t for t in texts), kind
    assert "Try Umami Noodle Bar." in prompts["rating"][0]
    for text in prompts["action"]:
        assert TENDENCY["hesitant"] in text and TENDENCY["conservative"] in text
        assert TENDENCY["decisive"] not in text and TENDENCY["exploratory"] not in text
    assert all(who.style() in t for t in prompts["response"]) and "Write formally." in who.style()
    for kind in ("action", "response"):  # before any reply, then after one rated 4
        assert satisfaction_words(None) in prompts[kind][0] and satisfaction_words(4.0) in prompts[kind][1]
    assert satisfaction_words(4.0) != satisfaction_words(None)


def test_tendencies_and_dislikes_change_the_decisions_through_the_prompt():
    from converse_fakes import Reading

    def talk(who, reply):
        simulator = UserSimulator(
            config("refinement.enabled=false", "max_turns=5", "rating.read=json"),
            Reading(),
            np.random.default_rng(0),
        )
        user = User(who)
        simulator.step([user], [None])
        while not user.ended:
            simulator.step([user], [Reply(reply)])
        return user

    quick = talk(
        persona(action={"decisiveness": "decisive", "exploration": "exploratory"}), "Try the sushi bar."
    )
    slow = talk(
        persona(action={"decisiveness": "hesitant", "exploration": "exploratory"}), "Try the sushi bar."
    )
    assert (quick.ended, quick.turn) == ("chosen", 2) and (slow.ended, slow.turn) == ("max_turns", 5)
    burger = talk(
        persona(action={"decisiveness": "decisive", "exploration": "exploratory"}), "Try the Fast food stand."
    )
    assert burger.scores[0] < quick.scores[0]  # the persona's dislike reached the rating
    assert burger.ended != "chosen"


def test_a_turn_rates_then_acts_then_responds_then_refines():
    backend = Scripted(actions=[["request_recommendation"], ["give_feedback"]], judged="high")
    simulator = UserSimulator(
        config("refinement.enabled=true", "rating.read=json"), backend, np.random.default_rng(0)
    )
    user = User(persona())
    first = simulator.step([user], [None])[0]
    assert "rating" not in first and first["actions"] == ["request_recommendation"]
    assert backend.kinds[:2] == ["action", "response"]  # nothing to rate before the recommender speaks
    backend.kinds.clear()
    log = simulator.step([user], [Reply()])[0]
    assert backend.kinds[:3] == ["rating", "action", "response"]
    rating = log["rating"]
    assert rating["recommended"] and rating["objective"] == 4 and rating["modifier"] == 0.0
    assert log["actions"] == ["give_feedback"] and log["intent"] == "evaluate"
    assert [d[0] for d in user.dialogue] == ["user", "assistant", "user"] and user.scores == [4.0]


def test_recommendation_quality_gets_the_traits_modifier_and_stays_inside_one_to_five():
    novel = {"rationale": "new", "language_quality": 5, "action_quality": 5, "recommended": True,
             "recommendation_quality": 5, "new_preference": "Ramen", "fit": 2}  # fmt: skip
    simulator = UserSimulator(config("rating.read=json"), Scripted(rating=novel), np.random.default_rng(0))
    explorer = persona(action={"decisiveness": "decisive", "exploration": "exploratory"})
    rating = simulator.step([User(explorer)], [Reply()])[0]["rating"]
    assert (rating["objective"], rating["modifier"], rating["recommendation_quality"]) == (5, 0.5, 5.0)
    assert simulator.counts["recommendation_quality_bounded"] == 1
    doubter = persona(action={"decisiveness": "hesitant", "exploration": "conservative"})
    rating = simulator.step([User(doubter)], [Reply()])[0]["rating"]
    assert (rating["modifier"], rating["recommendation_quality"]) == (-1.0, 4.0)
    rating = simulator.step([User(doubter)], [Reply(recommended=[])])[0]["rating"]
    assert rating["recommendation_quality"] is None  # nothing recommended: not rated


def test_a_well_fitting_new_suggestion_may_become_a_preference():
    good = {"rationale": "r", "language_quality": 4, "action_quality": 4, "recommended": True,
            "recommendation_quality": 5, "new_preference": "Korean BBQ", "fit": 5}  # fmt: skip
    simulator = UserSimulator(
        config("rating.excitation_probability=1"), Scripted(rating=good), np.random.default_rng(0)
    )
    user = User(persona())
    log = simulator.step([user], [Reply()])[0]
    assert log["adopted"] == {"preference": "Korean BBQ", "turn": 1, "fit": 5}
    assert user.persona.adopted == [log["adopted"]] and "Korean BBQ" in user.persona.describe()
    weak = dict(good, fit=3)
    simulator = UserSimulator(
        config("rating.excitation_probability=1"), Scripted(rating=weak), np.random.default_rng(0)
    )
    assert "adopted" not in simulator.step([User(persona())], [Reply()])[0]
    never = UserSimulator(
        config("rating.excitation_probability=0"), Scripted(rating=good), np.random.default_rng(0)
    )
    assert "adopted" not in never.step([User(persona())], [Reply()])[0]


def test_the_rule_judger_and_the_llm_judger_each_lead_to_a_logged_rewrite():
    assert words_per_message("One two three. Four five six seven!") == 7
    backend = Scripted(judged="medium")
    simulator = UserSimulator(config(), backend, np.random.default_rng(0))
    writer = persona(
        language={"information_richness": "medium", "formality": "low", "message_length": "long"}
    )
    log = simulator.step([User(writer)], [None])[0]
    tools = {r["tool"]: r for r in log["refinements"]}
    # the response has 11 words: "short" (under the default 58), the persona writes long messages
    assert tools["message length"]["judged"] == "short" and tools["message length"]["target"] == "long"
    assert tools["message length"]["after"] == "Rewritten. Short."
    assert tools["formality"]["judged"] == "medium" and "after" in tools["formality"]  # persona: low
    assert (
        tools["information richness"]["judged"] == "medium" and "after" not in tools["information richness"]
    )
    assert log["message"] == "Rewritten. Short." and backend.kinds.count("refine") == 2
    # the logged level is the final message's: the rewrite is judged again by every tool
    assert tools["message length"]["final"] == "short" and tools["formality"]["final"] == "medium"
    assert backend.kinds.count("judge") == 4  # formality and richness, before and after


def test_long_turns_are_shown_whole_or_cut_by_tokens_and_counted():
    from transformers import AutoTokenizer

    from data_prep.offline_models import resolve_model

    backend = Scripted()
    backend.tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m-instruct-offline"))
    long_reply = "word " * 700  # about 700 tokens: far past the old 600-character cut
    dialogue = [("user", "hi"), ("assistant", long_reply), ("user", "and?"), ("assistant", long_reply)]
    whole = UserSimulator(config("transcript_tokens=2000"), backend, np.random.default_rng(0))
    text = whole.transcript(dialogue)
    assert text.count("word") == 1400 and "…" not in text and not whole.counts["turns_cut"]
    tight = UserSimulator(config("transcript_tokens=800"), backend, np.random.default_rng(0))
    text = tight.transcript(dialogue)
    lines = text.splitlines()  # the newest reply whole; "and?" fits; the older reply cut; "hi" left out
    assert lines[-1].count("word") == 700 and lines[-2] == "You: and?" and lines[0].endswith("…")
    assert 0 < lines[0].count("word") < 700 and "hi" not in text
    assert tight.counts["turns_cut"] == 1 and tight.counts["turns_left_out"] == 1
    newest = UserSimulator(config("transcript_tokens=64"), backend, np.random.default_rng(0))
    assert newest.transcript(dialogue).count("word") == 700  # the message being rated: never cut


def test_a_planning_request_is_the_datas_planning_intent():
    from agents.converse.simulator import ACTION_INTENT, FIRST_ACTION

    backend = Scripted(actions=[["ask_plan"]])
    log = UserSimulator(config(), backend, np.random.default_rng(0)).step([User(persona())], [None])[0]
    assert log["actions"] == ["ask_plan"] and log["intent"] == ACTION_INTENT["ask_plan"] == "plan"
    assert "ask_plan" in FIRST_ACTION.schema


def test_a_tool_added_by_config_refines_its_own_trait():
    extra = config(
        "priors.language={politeness: {low: 1, high: 1}}",
        'refinement.tools=[{name: politeness, trait: politeness, question: "How polite is it?"}]',
    )
    backend = Scripted(judged="low")
    simulator = UserSimulator(extra, backend, np.random.default_rng(0))
    log = simulator.step([User(persona(language={"politeness": "high"}))], [None])[0]
    assert log["refinements"] == [
        {"tool": "politeness", "judged": "low", "target": "high", "before": log["refinements"][0]["before"],
         "after": "Rewritten. Short.", "final": "low"}
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="not in priors.language"):
        config("refinement.tools=[{name: tone, trait: tone, question: q}]")


def test_the_end_of_conversation_rules():
    chosen = UserSimulator(
        config(), Scripted(actions=[["request_recommendation"], ["end"]]), np.random.default_rng(0)
    )
    user = User(persona())
    chosen.step([user], [None])
    backend = chosen.backend
    backend.kinds.clear()
    log = chosen.step([user], [Reply()])[0]
    assert user.ended == "chosen" and log["ended"] == "chosen"
    assert (
        "refine" not in backend.kinds and "judge" not in backend.kinds
    )  # no refinement of a closing message
    capped = UserSimulator(config("max_turns=2"), Scripted(), np.random.default_rng(0))
    user = User(persona())
    capped.step([user], [None])
    assert user.ended is None
    capped.step([user], [Reply()])
    assert user.ended == "max_turns" and user.turn == 2
    awful = {"rationale": "bad", "language_quality": 1, "action_quality": 1, "recommended": False,
             "recommendation_quality": 1, "new_preference": "", "fit": 1}  # fmt: skip
    impatient = UserSimulator(config("max_turns=10"), Scripted(rating=awful), np.random.default_rng(0))
    user = User(persona())  # decisive: patience 2
    impatient.step([user], [None])
    impatient.step([user], [Reply()])
    assert user.ended is None
    log = impatient.step([user], [Reply()])[0]
    assert user.ended == "impatient" and log["actions"] == ["end"]


def test_unusable_answers_fall_back_and_are_counted():
    simulator = UserSimulator(
        config("rating.read=json"), Scripted(rating="garbage"), np.random.default_rng(0)
    )
    log = simulator.step([User(persona())], [Reply()])[0]
    assert log["rating"] is None and simulator.counts["fallback:rating"] == 1


def test_replay_rates_every_assistant_turn_and_leaves_the_dialogue_alone():
    turns = [("user", "Ideas?"), ("assistant", "A book."), ("user", "Other?"), ("assistant", "A scarf.")]
    recorded = {"about": "You are a teacher.", "task": "A gift.", "turns": list(turns)}
    backend = Scripted()
    ratings = UserSimulator(config("rating.read=json"), backend, np.random.default_rng(0)).replay(
        [recorded, recorded]
    )
    assert [len(r) for r in ratings] == [2, 2] and recorded["turns"] == turns
    assert all(r["modifier"] == 0.0 for rs in ratings for r in rs)  # no persona traits in replay
    assert backend.kinds == ["rating"] * 4  # nothing but ratings


@pytest.mark.parametrize("read", ["greedy", "expected"])
def test_a_rating_read_from_probabilities_writes_its_judgement_first(read):
    """rating.read greedy / expected: the judgement is written first (its schema in the written order:
    the rationale before anything else), then each score is read from the probabilities, asked after it."""
    turns = [("user", "Ideas?"), ("assistant", "A book.")]
    recorded = {"about": "You are a teacher.", "task": "A gift.", "turns": turns}
    backend = Scripted()
    simulator = UserSimulator(config(f"rating.read={read}"), backend, np.random.default_rng(0))
    ((rating,),) = simulator.replay([recorded])
    assert backend.kinds == ["rating", *(f"score:{k}" for k in SCORES)]
    judgement = next(c for k, c in backend.calls if k == "rating")
    assert "Rate the assistant" in judgement
    assert list(JUDGEMENT.json_schema()["properties"])[0] == "rationale"
    assert (rating["language_quality"], rating["action_quality"], rating["fit"]) == (4, 4, 3)
    assert rating["recommendation_quality"] == 4 and simulator.counts["rating_probs_from:logprobs"] == 4
    assert simulator.counts["fallback:rating"] == 0


def test_prompts_show_the_configured_number_of_last_turns():
    class Recording(Scripted):
        def answer(self, conversation, constraint):
            self.prompts = getattr(self, "prompts", []) + [conversation[-1]["content"]]
            return super().answer(conversation, constraint)

    turns = [
        ("user", "first ask"),
        ("assistant", "first reply"),
        ("user", "second ask"),
        ("assistant", "second reply"),
    ]

    def last_rating_prompt(shown: int) -> str:  # the rating of the second assistant turn
        backend = Recording()
        UserSimulator(config(f"transcript_turns={shown}"), backend, np.random.default_rng(0)).replay(
            [{"about": "You are a teacher.", "task": "A gift.", "turns": turns}]
        )
        return next(p for p in reversed(backend.prompts) if "Rate the assistant" in p)

    two, four = last_rating_prompt(2), last_rating_prompt(4)
    assert "second ask" in two and "second reply" in two and "first" not in two
    assert "first ask" in four and "first reply" in four and "second reply" in four


def test_both_recommenders_recommend_from_the_catalogue(raw):
    catalogue = load_restaurants(raw / "yelp_asc_sample" / "item_subset.json")
    assert len(catalogue) > 300 and all(r.categories is not None for r in catalogue)
    base = BaseCRS(Scripted(), catalogue)
    reply = base.respond([Session()], ["I want sushi"])[0]
    assert reply.recommended and base.by_id[reply.recommended[0]]  # the first of the shown matches
    agent = AgentCRS(Scripted(plan="recommend"), catalogue)
    session = Session()
    first = agent.respond([session], ["I love noodles"])[0]
    assert session.likes == ["noodles"] and first.plan == "recommend" and first.recommended
    second = agent.respond([session], ["Another one?"])[0]
    assert second.recommended and second.recommended != first.recommended  # never the same place twice
    asker = AgentCRS(Scripted(plan="answer"), catalogue)
    assert asker.respond([Session()], ["hi"])[0].plan == "recommend"  # nothing to answer about yet


def args(raw, out, *extra, overwrite=False):
    settings = [f"data={raw / 'recllmsim'}", f"catalogue={raw / 'yelp_asc_sample' / 'item_subset.json'}",
                "dialogues=10", "max_turns=3", *extra]  # fmt: skip
    return argparse.Namespace(config=None, out=str(out), set=settings, overwrite=overwrite)


def lines(path):
    return path.read_text().splitlines()


@pytest.mark.slow
def test_a_run_talks_to_both_recommenders_resumes_and_refuses_other_inputs(raw, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    summary = run(args(raw, straight), Scripted(), Scripted())
    assert set(summary["crs"]) == {"base", "agent"} and summary["crs"]["base"]["dialogues"] == 10
    assert summary["crs"]["agent"]["ended"] == {"max_turns": 10}
    personas = json.loads((straight / "personas.json").read_text())
    assert len(personas["personas"]) == 10 and "priors" in personas["report"]
    turns = [json.loads(line) for line in lines(straight / "turns.jsonl")]
    assert {t["crs"] for t in turns} == {"base", "agent"} and all("refinements" in t for t in turns)
    # stopped after the first chunk, then resumed
    stopped = tmp_path / "stopped"
    from agents.converse import run as runner

    real = runner.converse
    calls = []

    def dies_on_the_second_chunk(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(runner, "converse", dies_on_the_second_chunk)
    with pytest.raises(SystemExit):
        run(args(raw, stopped), Scripted(), Scripted())
    monkeypatch.setattr(runner, "converse", real)
    assert len(lines(stopped / "dialogues.jsonl")) == 8  # the first chunk, whole
    resumed = run(args(raw, stopped), Scripted(), Scripted())
    assert lines(stopped / "dialogues.jsonl") == lines(straight / "dialogues.jsonl")
    assert lines(stopped / "turns.jsonl") == lines(straight / "turns.jsonl")
    assert resumed["counts"] == summary["counts"]
    # a kill while the second chunk's lines were being written: one whole line, then half of one
    cut = tmp_path / "cut"
    run(args(raw, cut), Scripted(), Scripted())
    kept = lines(cut / "dialogues.jsonl")
    (cut / "dialogues.jsonl").write_text("\n".join(kept[:9]) + "\n" + kept[9][:40])
    again = run(args(raw, cut), Scripted(), Scripted())
    assert lines(cut / "dialogues.jsonl") == lines(straight / "dialogues.jsonl")
    assert (
        lines(cut / "turns.jsonl") == lines(straight / "turns.jsonl") and again["counts"] == summary["counts"]
    )
    with pytest.raises(SystemExit, match="max_turns"):
        run(args(raw, stopped, "max_turns=4"), Scripted(), Scripted())


@pytest.mark.slow
def test_the_evaluation_of_a_run_by_hand(raw, tmp_path):
    from eval import converse as ev

    yelp = tmp_path / "yelp"
    run(args(raw, yelp), Scripted(), Scripted())
    results = ev.evaluate(yelp, raw / "recllmsim", tmp_path / "eval-yelp")
    base = results["ratings"]["per_crs"]["base"]
    assert base["language_quality"] == {"mean": 4.0, "ci95": [4.0, 4.0], "dialogues": 10}
    assert results["ratings"]["paired"]["base - agent: language_quality"]["mean"] == 0.0
    assert (
        "another domain" in results["realism"]["note"]
        and "another domain" in results["identification"]["note"]
    )
    folder = tmp_path / "run"  # RecLLMSim's own tasks: compared with RecLLMSim's users
    run(args(raw, folder, "setting=recllmsim", "crs=[assistant]"), Scripted(), Scripted())
    results = ev.evaluate(folder, raw / "recllmsim", tmp_path / "eval")
    realism = results["realism"]
    assert realism["simulated"]["user_turns"]["mean"] == 3.0  # max_turns=3, never ended earlier
    llm = realism["against"]["RecLLMSim LLM users"]
    # every simulated turn asked for a recommendation: the distance is the LLM users' share of other intents
    share = llm["intents"]["recommend"] / sum(llm["intents"].values())
    assert llm["tv_intents"] == round(1 - share, 3)
    people = realism["against"]["real people"]
    assert (
        people["words_per_user_turn_en"].startswith("not comparable")
        and people["chars_per_user_turn_zh"]["n"] > 1000
    )
    words = results["controllability"]["words_by_message_length_setting"]
    assert sum(v["n"] for v in words.values()) == 30  # 10 dialogues x 3 turns
    assert (tmp_path / "eval" / "lengths.png").stat().st_size > 0
    assert (tmp_path / "eval" / "traits.png").stat().st_size > 0
    ident = results["identification"]
    reference = ident["reference: RecLLMSim LLM users (Chinese) -> real people"]
    assert reference["train"] == 1856 and reference["test"] == 291
    loaded = recllmsim.load(raw / "recllmsim").conversations
    llm_genders = Counter(ev.gender_of(c) for c in loaded if c.source == "llm" and ev.gender_of(c))
    people = [ev.gender_of(c) for c in loaded if c.source == "human" and ev.gender_of(c)]
    majority = llm_genders.most_common(1)[0][0]  # the training side's majority, scored on the people
    assert reference["majority_accuracy"] == round(people.count(majority) / len(people), 3)
    simulated = ident["simulated -> RecLLMSim LLM users (English)"]
    assert simulated["train"] == 10 and simulated["test"] == 1856


def test_every_shipped_converse_config_and_the_converse_recipe_load():
    from data_prep.paths import REPO_ROOT
    from train.sft import parse

    configs = sorted((REPO_ROOT / "configs" / "converse").glob("*.yaml"))
    assert len(configs) == 2
    for path in configs:
        config = load_config(path)
        assert config.crs and config.llm.model
    recipe, training_args, model_args = parse(
        ["--config", str(REPO_ROOT / "configs/sft/smollm2_converse_cpu.yaml")]
    )
    assert recipe.pairs == "runs/pairs/recllmsim" and model_args.use_peft and training_args.use_cpu


@pytest.mark.parametrize(
    "change",
    [{"language_quality": "good"}, {"fit": None}, {"recommended": "false"}, {"action_quality": 9}],
)
def test_a_rating_of_the_wrong_type_or_range_is_a_counted_fallback(change):
    bad = {"rationale": "r", "language_quality": 4, "action_quality": 4, "recommended": True,
           "recommendation_quality": 4, "new_preference": "", "fit": 3, **change}  # fmt: skip
    simulator = UserSimulator(config("rating.read=json"), Scripted(rating=bad), np.random.default_rng(0))
    log = simulator.step([User(persona())], [Reply()])[0]
    assert log["rating"] is None and simulator.counts["fallback:rating"] == 1


def test_a_null_message_is_a_counted_fallback_not_the_text_none():
    class NullMessage(Scripted):
        def answer(self, conversation, constraint):
            if constraint is not None and constraint.kind == "json" and '"message"' in constraint.schema:
                return json.dumps({"message": None})
            return super().answer(conversation, constraint)

    simulator = UserSimulator(config("refinement.enabled=false"), NullMessage(), np.random.default_rng(0))
    log = simulator.step([User(persona())], [None])[0]
    assert log["message"] == "Could you suggest something?" and simulator.counts["fallback:response"] == 1


def test_a_blank_or_partial_dislike_does_not_block_the_catalogue(raw):
    class Blank(Scripted):
        def answer(self, conversation, constraint):
            if constraint is not None and constraint.kind == "json" and '"dislikes"' in constraint.schema:
                return json.dumps({"likes": ["noodles"], "dislikes": ["", "tea"]})
            return super().answer(conversation, constraint)

    catalogue = load_restaurants(raw / "yelp_asc_sample" / "item_subset.json")
    session = Session()
    reply = AgentCRS(Blank(plan="recommend"), catalogue).respond([session], ["no tea please"])[0]
    assert session.dislikes == ["tea"] and reply.recommended and not reply.nothing_found
    place = {r.id: r for r in catalogue}[reply.recommended[0]]
    assert "tea" not in place.text().lower().replace("steak", "")  # whole words: "steak" is not "tea"


def test_recommenders_must_fit_the_setting():
    with pytest.raises(ConfigError, match="crs"):
        config("setting=recllmsim")  # the default [base, agent] need the Yelp catalogue
    assert config("setting=recllmsim", "crs=[assistant]").crs == ["assistant"]


def test_identification_transfer_by_hand():
    from eval.converse import transfer

    train = ["he plays football", "football again", "he watches football"] + ["she knits", "knitting wool"]
    labels = ["Male"] * 3 + ["Female"] * 2
    result = transfer(
        train,
        labels,
        ["football", "knits", "knitting", "football"],
        ["Male", "Female", "Female", "Female"],
        "word",
    )
    # the last test text says football but is labelled Female: 3 of 4 right; majority (Male) gets 1 of 4
    assert result["accuracy"] == 0.75 and result["majority_accuracy"] == 0.25
    assert result["macro_f1"] == round((2 * 1 * 0.5 / 1.5 + 2 * (2 / 3) * 1 / (5 / 3)) / 2, 3)


@pytest.mark.slow
def test_clustered_correlations_by_hand():
    from eval.converse import clustered_correlation

    result = clustered_correlation(
        [1, 2, 3, 4, 5, 6], [2, 4, 6, 8, 10, 12], ["a", "a", "b", "b", "c", "c"], np.random.default_rng(0)
    )
    assert result["spearman"] == 1.0 and result["pearson"] == 1.0 and result["clusters"] == 3
    assert result["spearman_ci95"] == [1.0, 1.0]
    opposite = clustered_correlation(
        [1, 2, 3, 4], [4, 3, 2, 1], ["a", "b", "c", "d"], np.random.default_rng(0)
    )
    assert opposite["spearman"] == -1.0
    assert "note" in clustered_correlation([1, 1, 1], [1, 2, 3], ["a", "b", "c"], np.random.default_rng(0))


def test_holm_by_hand():
    from eval.converse import holm

    table = holm(
        {"a": {"spearman_p": 0.01}, "b": {"spearman_p": 0.04}, "c": {"spearman_p": 0.03}, "d": {"note": "-"}}
    )
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1, made monotone: 0.03, 0.06, 0.06
    assert [table[k]["spearman_p_holm"] for k in "acb"] == pytest.approx([0.03, 0.06, 0.06])
    assert "spearman_p_holm" not in table["d"]


@pytest.mark.slow
def test_replay_correlates_with_the_recorded_ratings_clustered_by_persona(raw, tmp_path):
    """A backend that knows each real person's Detail answer rates every assistant turn from it: the
    replayed correlation must come out +1 for a rating rising with it and -1 for one falling."""
    from data_prep import recllmsim
    from eval.converse import QUESTIONNAIRE, replay_check

    def key(text):  # the start of an assistant message, as the prompt shows it (cut or not)
        return " ".join(text.split())[:150]

    detail = {}
    for c in recllmsim.load(raw / "recllmsim").conversations:
        if c.source == "human" and c.questionnaire.get("Detail") in QUESTIONNAIRE["Detail"]:
            level = QUESTIONNAIRE["Detail"][c.questionnaire["Detail"]]
            for t in c.turns:
                if t.role == "assistant":
                    detail.setdefault(key(t.content), set()).add(level)
    detail = {
        k: v.pop() for k, v in detail.items() if len(v) == 1
    }  # an opening shared by two people: unknown

    class KnowsDetail(Scripted):
        def answer(self, conversation, constraint):
            if constraint is not None and constraint.kind == "json" and '"rationale"' in constraint.schema:
                last = conversation[-1]["content"].split("\nAssistant: ")[-1].split("\nRate the assistant")[0]
                level = detail.get(key(last))
                if level is None:  # not a turn this test can place: an unusable answer (counted)
                    return "{}"
                return json.dumps(
                    dict(self.rating, language_quality=1 + 2 * level, action_quality=5 - 2 * level)
                )
            return super().answer(conversation, constraint)

    result = replay_check(raw / "recllmsim", config("rating.read=json"), tmp_path, "human", 40, KnowsDetail())
    rising, falling = (
        result["correlations"][f"{k} ~ Detail"] for k in ("language_quality", "action_quality")
    )
    assert rising["n"] >= 30 and rising["clusters"] > 1  # most of the 40 placed; several people
    assert rising["spearman"] == 1.0 and falling["spearman"] == -1.0
    assert rising["spearman_ci95"] is None or rising["spearman_ci95"] == [1.0, 1.0]
    assert set(k.split(" ~ ")[1] for k in result["correlations"]) == {
        "Detail",
        "Availability",
        "Diversity",
        "Memorization",
    }


@pytest.mark.slow
def test_consistency_compares_two_backbones_on_the_same_conversations(tmp_path):
    from eval.converse import consistency

    def replay(values, model):
        files = [f"c{i}.json" for i in range(len(values))]
        ratings = {f: {"language_quality": v, "action_quality": v, "recommendation_quality": None}
                   for f, v in zip(files, values, strict=True)}  # fmt: skip
        return {"model": model, "adapter": None, "ratings": ratings, "persona": {f: f for f in files}}

    (tmp_path / "a.json").write_text(json.dumps(replay([1, 2, 3, 4, 5], "base")))
    (tmp_path / "b.json").write_text(json.dumps(replay([2, 3, 4, 5, 5.5], "tuned")))
    result = consistency(tmp_path / "a.json", tmp_path / "b.json")
    assert result["conversations"] == 5 and result["correlations"]["language_quality"]["spearman"] == 1.0
    assert result["correlations"]["recommendation_quality"]["n"] == 0  # nothing rated: no figure


def test_no_interval_when_resamples_keep_hitting_a_constant_rating():
    from eval.converse import clustered_correlation

    y = [1] * 19 + [0]  # a recorded rating nearly always the same, as RecLLMSim's Memorization
    result = clustered_correlation(list(range(20)), y, [str(i) for i in range(20)], np.random.default_rng(0))
    assert result["spearman_ci95"] is None and "constant" in result["note"] and result["spearman"] < 0


@pytest.mark.slow
@pytest.mark.parametrize("read", ["json", "expected"])
def test_the_simulator_fills_the_peoples_questionnaire_and_is_scored_per_item(raw, tmp_path, read):
    """A backend that knows each person's real answers gives them back, in one JSON object or as the
    probabilities of each item's numbered options: every item's correlation is +1; one that answers the
    opposite gets -1 (Holm-corrected p-values on the table of four)."""
    from data_prep.prompt import QUESTIONNAIRE_ITEMS
    from eval.converse import QUESTIONNAIRE, replay_check

    def key(text):
        return " ".join(text.split())[:150]

    answers = {}
    for c in recllmsim.load(raw / "recllmsim").conversations:
        if c.source == "human":
            for t in c.turns:
                if t.role == "assistant":
                    answers.setdefault(key(t.content), []).append(c.questionnaire)
    answers = {k: v[0] for k, v in answers.items() if all(x == v[0] for x in v)}

    class Knows(Scripted):
        def __init__(self, flip):
            super().__init__()
            self.flip = flip

        def answer(self, conversation, constraint):
            props = (
                json.loads(constraint.schema)["properties"]
                if constraint and constraint.kind == "json"
                else {}
            )
            if set(props) != set(QUESTIONNAIRE_ITEMS):
                return super().answer(conversation, constraint)
            lines = [
                line for line in conversation[-1]["content"].splitlines() if line.startswith("Assistant: ")
            ]
            real = answers.get(key(lines[-1].removeprefix("Assistant: "))) if lines else None
            if real is None:
                return "{}"
            out = {}
            for name, (_, options) in QUESTIONNAIRE_ITEMS.items():
                value = {"是": "yes", "否": "no", "简略": "brief", "一般": "average", "详细": "detailed",
                         "不可用": "not usable", "有一定参考": "some reference", "很有用": "very useful",
                         "结果单一": "single", "结果多样": "diverse"}[real[name]]  # fmt: skip
                order = list(options)
                out[name] = order[len(order) - 1 - order.index(value)] if self.flip else value
            return json.dumps(out)

        def score(self, *args, **kwargs):  # as hf: every item's lines scored in one call (option_probs)
            raise AssertionError("the simulator calls option_probs, not score")

        def option_probs(self, conversations, options, samples=8, seed=0, prefix=""):
            """Every item's lines ("Detail: 0", ...): a quarter of the probability on each item's real
            answer (its opposite when flipped)."""
            assert options == [
                f"{n}: {v}" for n, (_, o) in QUESTIONNAIRE_ITEMS.items() for v in sorted(o.values())
            ]
            out = []
            for conversation in conversations:
                text = conversation[-1]["content"]
                assert all(
                    f"{v}: {o}" in text
                    for _, (_, scale) in QUESTIONNAIRE_ITEMS.items()
                    for o, v in scale.items()
                )
                lines = [line for line in text.splitlines() if line.startswith("Assistant: ")]
                real = answers.get(key(lines[-1].removeprefix("Assistant: "))) if lines else None
                if real is None:
                    out.append(Answer("", probs=None, probs_from="unavailable"))
                    continue
                chosen = set()
                for name, (_, scale) in QUESTIONNAIRE_ITEMS.items():
                    level = QUESTIONNAIRE[name][real[name]]
                    chosen.add(f"{name}: {len(scale) - 1 - level if self.flip else level}")
                probs = {o: 0.25 if o in chosen else 0.0 for o in options}
                out.append(Answer(min(chosen), probs=probs, probs_from="logprobs"))
            return out

    settings = config("rating.read=json", f"questionnaire_read={read}")
    same = replay_check(raw / "recllmsim", settings, tmp_path / "a", "human", 40, Knows(False))
    assert same["unusable_questionnaires"] < 40
    varied = [n for n, r in same["questionnaire"].items() if "spearman" in r]
    assert {"Detail", "Diversity"} <= set(varied)
    assert all(same["questionnaire"][n]["spearman"] == 1.0 for n in varied)
    assert all(
        same["questionnaire"][n]["simulated_mean"] == same["questionnaire"][n]["real_mean"] for n in varied
    )
    assert all("spearman_p_holm" in same["questionnaire"][n] for n in varied)
    flipped = replay_check(raw / "recllmsim", settings, tmp_path / "b", "human", 40, Knows(True))
    assert all(flipped["questionnaire"][n]["spearman"] == -1.0 for n in varied)
    assert same["questionnaire_read"] == read and same["shown"]["conversations"] == 40


class Words:
    """A tokenizer of whitespace-separated words (what converse_transcript needs: call and decode)."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}

    def decode(self, ids):
        return " ".join(ids)


def test_the_questionnaire_is_read_from_probabilities_item_by_item_and_says_what_it_showed():
    """Each item is read as the expected place over its numbered options after the answer's beginning
    "{item}: " (greedy: the most likely one), its lines normalised among themselves; the JSON reading
    writes at the judgement's temperature (0), not the run's 0.7; an answer without probabilities is
    unusable (counted); and each answer says how much of its conversation the prompt showed."""
    from data_prep.prompt import QUESTIONNAIRE_ITEMS

    class Split(Scripted):
        """Each item's probability split between its lowest and highest line; none for one person."""

        def score(self, *args, **kwargs):  # as hf: every item's lines scored in one call (option_probs)
            raise AssertionError("the simulator calls option_probs, not score")

        def option_probs(self, conversations, options, samples=8, seed=0, prefix=""):
            out = []
            for conversation in conversations:
                if "Nobody" in conversation[-1]["content"]:
                    out.append(Answer("", probs=None, probs_from="unavailable"))
                    continue
                ends = set()  # each item's lowest and highest line
                for name, (_, scale) in QUESTIONNAIRE_ITEMS.items():
                    ends |= {f"{name}: 0", f"{name}: {len(scale) - 1}"}
                probs = {o: 0.125 if o in ends else 0.0 for o in options}
                out.append(Answer(options[0], probs=probs, probs_from="logprobs"))
            return out

        def generate(self, conversations, sampling, constraint=None):
            self.temperatures = [*getattr(self, "temperatures", []), sampling.temperature]
            return super().generate(conversations, sampling, constraint)

    turns = [("user" if k % 2 == 0 else "assistant", f"turn {k} " + "word " * 20) for k in range(10)]
    people = [
        {"about": "You are Ann.", "task": "Plan a trip.", "turns": turns},
        {"about": "Nobody.", "task": "Plan a trip.", "turns": turns[:2]},
    ]
    expected = UserSimulator(config("transcript_turns=6"), Split(), np.random.default_rng(0))
    answers = expected.questionnaire(people)
    assert answers[0].answer == {name: (len(o) - 1) / 2 for name, (_, o) in QUESTIONNAIRE_ITEMS.items()}
    assert answers[1].answer is None and expected.counts["fallback:questionnaire"] == 1
    assert expected.counts["llm_calls:questionnaire"] == 2  # one call per conversation, every item in it
    assert (answers[0].shown.turns, answers[0].shown.of_turns, answers[0].shown.whole) == (6, 10, False)
    assert answers[1].shown.whole and answers[1].shown.tokens is None  # no tokenizer: tokens unmeasured
    greedy = UserSimulator(config("questionnaire_read=greedy"), Split(), np.random.default_rng(0))
    assert greedy.questionnaire(people[:1])[0].answer == {name: 0 for name in QUESTIONNAIRE_ITEMS}

    measured = UserSimulator(
        config("transcript_turns=10", "transcript_tokens=64"), Split(), np.random.default_rng(0)
    )
    measured.tokenizer = Words()
    shown = measured.questionnaire(people[:1])[0].shown
    # each turn is 23 words: the newest two fit 64 whole, the third is cut to the 18 left, the rest left out
    assert (shown.turns, shown.cut, shown.tokens, shown.of_tokens) == (3, 1, 64, 230)

    assert answers[0].read_from == "logprobs"

    # a backend that scores no lines reads each item's digit after "{item}: " (four calls)
    per_item = Scripted()
    read = UserSimulator(config(), per_item, np.random.default_rng(0)).questionnaire(people[:1])[0]
    assert read.answer == {name: 0.0 for name in QUESTIONNAIRE_ITEMS} and read.read_from == "logprobs"
    assert per_item.kinds == [f"questionnaire:{name}: " for name in QUESTIONNAIRE_ITEMS]

    class NoProbs(Scripted):  # a server that gives no log-probabilities and cannot continue an answer
        option_probs = None

    unread = UserSimulator(config(), NoProbs(), np.random.default_rng(0))
    answer = unread.questionnaire(people[:1])[0]
    # labelled, and unusable (counted, not read as zeros): questionnaire_read=json serves such a backend
    assert answer.read_from == "unavailable" and answer.answer is None
    assert unread.counts["fallback:questionnaire"] == 1
    from agents.llm import continues_answers  # so the replay refuses it before it starts

    assert not continues_answers(NoProbs()) and continues_answers(Scripted())

    written = Split()
    json_read = UserSimulator(
        config("questionnaire_read=json", "temperature=0.7"), written, np.random.default_rng(0)
    )
    assert json_read.questionnaire(people[:1])[0].read_from == "json"
    assert written.temperatures == [0.0]


def test_what_the_questionnaire_showed_is_summarised_over_conversations():
    """Whole conversations are counted, shares of turns and tokens go into quartiles, and a row from a
    file written before it was recorded is counted apart, not as a conversation shown nothing."""
    from eval.converse.replay import shown_summary

    rows = [
        {"turns": 6, "of_turns": 12, "cut": 0, "tokens": 300, "of_tokens": 900},
        {"turns": 4, "of_turns": 4, "cut": 0, "tokens": 200, "of_tokens": 200},
        {"turns": 4, "of_turns": 4, "cut": 1, "tokens": 150, "of_tokens": 400},
        {"turns": 2, "of_turns": 8, "cut": 1, "tokens": None, "of_tokens": None},
        None,
    ]
    summary = shown_summary(rows)
    assert (summary["conversations"], summary["whole"], summary["unrecorded"]) == (4, 1, 1)
    assert summary["turns_share_quartiles"] == [0.438, 0.75, 1.0]  # shares 0.5, 1, 1, 0.25
    assert summary["tokens_share_quartiles"] == [0.354, 0.375, 0.688]  # 1/3, 1, 0.375: three measured


@pytest.mark.slow
def test_a_stopped_questionnaire_replay_resumes_without_redoing_and_refuses_other_settings(raw, tmp_path):
    """The people's questionnaire over their conversations is an hour-long run here: it is kept batch by
    batch, a kill loses only the batch in progress, and a rerun with another backbone setting refuses."""
    from data_prep.prompt import QUESTIONNAIRE_ITEMS
    from eval.converse import replay_check

    class Answers(Scripted):
        """Every item's answer from the prompt's length (deterministic); dies on batch ``die_at``."""

        def __init__(self, die_at=None):
            super().__init__()
            self.die_at, self.batches = die_at, 0

        def generate(self, conversations, sampling, constraint=None):
            props = (
                json.loads(constraint.schema)["properties"]
                if constraint and constraint.kind == "json"
                else {}
            )
            if set(props) == set(QUESTIONNAIRE_ITEMS):
                self.batches += 1
                if self.batches == self.die_at:
                    raise KeyboardInterrupt  # as if the job were stopped mid-batch
                return [
                    Answer(
                        json.dumps(
                            {
                                n: list(o)[len(c[-1]["content"]) % len(o)]
                                for n, (_, o) in QUESTIONNAIRE_ITEMS.items()
                            }
                        )
                    )
                    for c in conversations
                ]
            return super().generate(conversations, sampling, constraint)

    settings = config("temperature=0", "questionnaire_read=json")
    whole = replay_check(
        raw / "recllmsim", settings, tmp_path / "whole", "human", 70, Answers(), turn_ratings=False
    )
    with pytest.raises(KeyboardInterrupt):
        replay_check(
            raw / "recllmsim", settings, tmp_path / "cut", "human", 70, Answers(die_at=2), turn_ratings=False
        )
    kept = (tmp_path / "cut" / "questionnaire_answers.jsonl").read_text().splitlines()
    assert len(kept) == 32  # the first batch was kept
    resumed_backend = Answers()
    resumed = replay_check(
        raw / "recllmsim", settings, tmp_path / "cut", "human", 70, resumed_backend, turn_ratings=False
    )
    assert resumed_backend.batches == 2  # 38 left: batches of 32 and 6, the first 32 not asked again
    for name, row in whole["questionnaire"].items():  # the same answers (intervals draw their own resamples)
        assert {k: resumed["questionnaire"][name][k] for k in ("n", "spearman", "simulated_mean")} == {
            k: row[k] for k in ("n", "spearman", "simulated_mean")
        }

    def answers(folder):
        return sorted((tmp_path / folder / "questionnaire_answers.jsonl").read_text().splitlines())

    assert answers("cut") == answers("whole")
    lines = [
        json.loads(line)
        for line in (tmp_path / "cut" / "questionnaire_answers.jsonl").read_text().splitlines()
    ]
    assert len(lines) == len({row["file"] for row in lines}) == 70
    with pytest.raises(SystemExit, match="transcript_tokens"):
        replay_check(raw / "recllmsim", config("temperature=0", "questionnaire_read=json", "transcript_tokens=512"),
                     tmp_path / "cut", "human", 70, Answers(), turn_ratings=False)  # fmt: skip
    with pytest.raises(SystemExit, match="questionnaire_read"):  # answers read otherwise are not mixed in
        replay_check(raw / "recllmsim", config("temperature=0"), tmp_path / "cut", "human", 70, Answers(),
                     turn_ratings=False)  # fmt: skip


@pytest.mark.slow
def test_agreement_pairs_two_backbones_on_the_conversations_both_answered(raw, tmp_path):
    """A backbone that gives the people's own answers against one that answers from a coin: per item the
    first agrees perfectly, and the paired difference (coin - perfect) has an interval below zero; an
    answer for a conversation the data does not have is refused, not scored."""
    from eval.converse import QUESTIONNAIRE, agreement, agreement_table

    people = [c for c in recllmsim.load(raw / "recllmsim").conversations if c.source == "human"][:120]
    coin = np.random.default_rng(1)
    for name, answer in {
        "perfect": lambda c: {k: QUESTIONNAIRE[k].get(c.questionnaire.get(k), 0) for k in QUESTIONNAIRE},
        "coin": lambda c: {k: int(coin.integers(len(QUESTIONNAIRE[k]))) for k in QUESTIONNAIRE},
    }.items():
        (tmp_path / name).mkdir()
        lines = [json.dumps({"file": c.file, "answer": answer(c)}, ensure_ascii=False) for c in people]
        (tmp_path / name / "questionnaire_answers.jsonl").write_text("\n".join(lines) + "\n")
    result = agreement([tmp_path / "perfect", tmp_path / "coin"], raw / "recllmsim", resamples=300)
    varied = [n for n, rows in result["items"].items() if "spearman" in rows[0]]
    assert len(varied) >= 3 and all(result["items"][n][0]["spearman"] == 1.0 for n in varied)
    for n in varied:
        d = result["differences"][f"{n}: {tmp_path / 'coin'} - {tmp_path / 'perfect'}"]
        assert d["n"] == 120 and d["ci95"][1] < 0 and d["p_holm"] < 0.05
    table = agreement_table(result)
    assert "paired difference" in table
    # these answer files predate the reading's record and what was shown: the table says so
    assert result["read"] == ["json, sampled (older run)"] * 2 and "not recorded" in table
    (tmp_path / "stray").mkdir()
    (tmp_path / "stray" / "questionnaire_answers.jsonl").write_text(
        '{"file": "nowhere.json", "answer": null}\n'
    )
    with pytest.raises(ValueError, match="no real-person conversation"):
        agreement([tmp_path / "stray"], raw / "recllmsim")
    with pytest.raises(SystemExit, match="no questionnaire_answers"):
        agreement([tmp_path / "nowhere"], raw / "recllmsim")


def test_ladders_pair_two_backbones_gaps_over_the_same_goals(tmp_path):
    """A backbone whose own score rises from random to oracle by about 2 on every goal against one whose
    score hardly moves: the gap difference is about +2 with an interval above zero; a rating neither
    gave is '–'; runs that gave other goals to the same persona ids are refused."""
    from eval.converse import ladders, ladders_table

    def run(name, oracle_score, jitter, fallbacks, target="t"):
        folder = tmp_path / name
        folder.mkdir()
        turns, dialogues = [], []
        for persona in range(10):
            for crs, score in (
                ("random", 1.0),
                ("oracle", oracle_score + jitter * (persona % 3)),
                ("base", 3.0),
            ):
                rating = {"language_quality": 2.0, "action_quality": None, "recommendation_quality": score,
                          "llm_objective": score}  # fmt: skip
                turns.append({"crs": crs, "persona": persona, "dialogue": persona, "rating": rating})
                dialogues.append({"crs": crs, "persona": persona, "targets": [f"{target}{persona}"]})
        (folder / "turns.jsonl").write_text("".join(json.dumps(t) + "\n" for t in turns))
        (folder / "dialogues.jsonl").write_text("".join(json.dumps(d) + "\n" for d in dialogues))
        counts = {"fallback:rating": fallbacks, "llm_calls:rating": 40}
        (folder / "summary.json").write_text(json.dumps({"counts": counts}))
        return folder

    result = ladders(run("base", 1.0, 0.1, 7), run("tuned", 3.0, 0.3, 2))
    d = result["difference"]["llm_objective"]
    assert d["goals"] == 10 and d["mean"] == pytest.approx(2.18) and d["ci95"][0] > 1.9 and d["p_holm"] < 0.05
    assert (
        result["difference"]["language_quality"]["mean"] == 0
        and "p" not in result["difference"]["language_quality"]
    )
    assert result["difference"]["action_quality"]["goals"] == 0
    assert result["unusable_ratings"][str(tmp_path / "base")] == {"unusable": 7, "rating_calls": 40}
    table = ladders_table(result)
    assert "| action_quality | – | – |" in table and "7 of 40" in table
    with pytest.raises(SystemExit, match="other goals"):
        ladders(tmp_path / "base", run("elsewhere", 3.0, 0.3, 2, target="u"))


def test_a_rating_is_judged_at_temperature_0_before_its_scores_and_the_prompt_states_the_scale():
    from agents.converse.simulator import decoding

    class Heat(Scripted):
        def generate(self, conversations, sampling, constraint=None):
            self.heat = getattr(self, "heat", []) + [(sampling.temperature, constraint)]
            return super().generate(conversations, sampling, constraint)

    backend = Heat()
    simulator = UserSimulator(config("refinement.enabled=false"), backend, np.random.default_rng(0))
    user = User(persona())
    simulator.step([user], [None])
    simulator.step([user], [Reply("Try Umami Noodle Bar.")])
    judged = [t for t, c in backend.heat if c is not None and c.kind == "json" and '"rationale"' in c.schema]
    others = [
        t for t, c in backend.heat if not (c is not None and c.kind == "json" and '"rationale"' in c.schema)
    ]
    assert judged == [0.0] and others and set(others) == {0.7}  # the run's temperature for the rest
    assert decoding(simulator.config)["rating"]["temperature"] == 0.0
    at = backend.kinds.index("rating")  # the judgement, then each score read after it
    assert simulator.config.rating.read == "expected" and backend.kinds[at + 1 : at + 5] == [
        f"score:{k}" for k in SCORES
    ]
    rating_prompt = next(p for k, p in backend.calls if k == "rating")
    assert "1 (very poor" in rating_prompt and "5 (excellent" in rating_prompt


@pytest.mark.slow  # 4.1 s here
def test_the_replay_runs_on_an_openai_compatible_server(raw, tmp_path, monkeypatch):
    """eval.converse's replay with llm.backend=openai (a stronger model's way in), against a stand-in
    server on loopback: the judgement comes as a JSON schema answer, each score from the first token's
    top_logprobs; the key travels from the environment."""
    import threading
    from http.server import ThreadingHTTPServer

    from openai_fakes import ChatHandler, chat_completion

    from eval.converse import replay_check

    asked = []

    class Served(ChatHandler):
        def do_POST(self):  # noqa: N802
            body = self.body()
            asked.append((self.headers.get("Authorization"), body))
            reply = chat_completion(body["model"], "")
            choice = reply["choices"][0]
            if body.get("logprobs"):  # a score: "4" most likely, "3" next
                top = [
                    {"token": "4", "logprob": -0.2, "bytes": None},
                    {"token": "3", "logprob": -1.8, "bytes": None},
                ]
                choice["message"]["content"] = "4"
                choice["logprobs"] = {"content": [{**top[0], "top_logprobs": top}]}
            else:  # the judgement, filled from its schema
                schema = body["response_format"]["json_schema"]["schema"]["properties"]
                kinds = {"string": "a reply that answers", "boolean": False, "integer": 3}
                choice["message"]["content"] = json.dumps({k: kinds[v["type"]] for k, v in schema.items()})
            self.send_json(reply)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Served)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("REPLAY_KEY", "sk-replay")
    try:
        served = config("llm.backend=openai", f"llm.base_url=http://127.0.0.1:{server.server_port}/v1",
                        "llm.model=stronger", "llm.api_key_env=REPLAY_KEY")  # fmt: skip
        result = replay_check(raw / "recllmsim", served, tmp_path, "llm", 2)
    finally:
        server.shutdown()
    assert result["unusable_ratings"] == 0 and result["model"] == "stronger"
    scores = [b for _, b in asked if b.get("logprobs")]
    assert scores and all(b["top_logprobs"] == 20 and b["max_tokens"] == 1 for b in scores)
    assert {a for a, _ in asked} == {"Bearer sk-replay"}
    expected = (4 * math.exp(-0.2) + 3 * math.exp(-1.8)) / (math.exp(-0.2) + math.exp(-1.8))
    ratings = json.loads((tmp_path / "replay_llm.json").read_text())
    assert ratings["conversations"] == 2
    means = list(ratings["ratings"].values())  # each conversation's mean over its assistant turns
    assert len(means) == 2 and all(m["language_quality"] == pytest.approx(expected) for m in means)


def test_the_peoples_questionnaire_replays_on_an_openai_compatible_server(raw, tmp_path, monkeypatch):
    """--replay human --questionnaire-only with llm.backend=openai against a stand-in server on loopback.
    A vLLM server (decoding_fields=vllm) continues each item's beginning "{item}: " and its digit is read
    from top_logprobs; a standard server is refused before any request unless questionnaire_read=json,
    which reads the items from one schema answer."""
    import threading
    from http.server import ThreadingHTTPServer

    from openai_fakes import ChatHandler, chat_completion

    from data_prep.prompt import QUESTIONNAIRE_ITEMS
    from eval.converse import replay_check

    asked = []

    class Served(ChatHandler):
        def do_POST(self):  # noqa: N802
            body = self.body()
            asked.append(body)
            reply = chat_completion(body["model"], "")
            choice = reply["choices"][0]
            if body.get("logprobs"):  # an item's digit: "1" most likely, "0" next
                top = [
                    {"token": "1", "logprob": -0.2, "bytes": None},
                    {"token": "0", "logprob": -1.8, "bytes": None},
                ]
                choice["message"]["content"] = "1"
                choice["logprobs"] = {"content": [{**top[0], "top_logprobs": top}]}
            else:  # a JSON answer: each item's first option (a judgement's fields, were one asked)
                schema = body["response_format"]["json_schema"]["schema"]["properties"]
                kinds = {"string": "a reply", "boolean": False, "integer": 3}
                content = {k: v["enum"][0] if "enum" in v else kinds[v["type"]] for k, v in schema.items()}
                choice["message"]["content"] = json.dumps(content)
            self.send_json(reply)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Served)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("REPLAY_KEY", "sk-replay")
    url = f"llm.base_url=http://127.0.0.1:{server.server_port}/v1"

    def replay(out, *settings, turns=False):
        served = config(
            "llm.backend=openai", url, "llm.model=stronger", "llm.api_key_env=REPLAY_KEY", *settings
        )
        return replay_check(raw / "recllmsim", served, tmp_path / out, "human", 2, turn_ratings=turns)

    try:
        with pytest.raises(ValueError, match="decoding_fields=vllm"):
            replay("standard", turns=True)
        assert asked == []  # refused before the turn ratings' requests, not after them
        vllm = replay("vllm", "llm.decoding_fields=vllm")
        continued = list(asked)
        asked.clear()
        by_json = replay("json", "questionnaire_read=json")
    finally:
        server.shutdown()
    assert vllm["unusable_questionnaires"] == 0 and vllm["questionnaire_read_from"] == {"top_logprobs": 2}
    assert len(continued) == 2 * len(QUESTIONNAIRE_ITEMS)  # one call per item and conversation
    beginnings = Counter((b["messages"][-1]["role"], b["messages"][-1]["content"]) for b in continued)
    assert beginnings == {("assistant", f"{name}: "): 2 for name in QUESTIONNAIRE_ITEMS}
    assert all(b["continue_final_message"] and not b["add_generation_prompt"] for b in continued)
    expected = math.exp(-0.2) / (math.exp(-0.2) + math.exp(-1.8))  # digit 1 against digit 0
    rows = {
        out: [
            json.loads(line)
            for line in (tmp_path / out / "questionnaire_answers.jsonl").read_text().splitlines()
        ]
        for out in ("vllm", "json")
    }
    assert len(rows["vllm"]) == len(rows["json"]) == 2
    assert all(
        r["answer"][name] == pytest.approx(expected) for r in rows["vllm"] for name in QUESTIONNAIRE_ITEMS
    )
    first = {name: options[next(iter(options))] for name, (_, options) in QUESTIONNAIRE_ITEMS.items()}
    assert all(r["answer"] == first for r in rows["json"])  # each item's first option, on its scale
    assert by_json["unusable_questionnaires"] == 0 and by_json["questionnaire_read_from"] == {"json": 2}
    assert len(asked) == 2 and all("response_format" in b for b in asked)


def test_the_questionnaires_reading_is_not_an_input_of_a_dialogue_run(raw):
    """Dialogue runs never ask the questionnaire: its reading must not stop them from resuming."""
    from agents.converse.run import run_inputs

    data = f"data={raw / 'recllmsim'}"
    assert run_inputs(config(data)) == run_inputs(config(data, "questionnaire_read=json"))
    assert run_inputs(config(data)) != run_inputs(config(data, "transcript_turns=3"))
