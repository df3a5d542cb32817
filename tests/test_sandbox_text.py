"""What a person reads in the sandbox: chats and posts measured per round (distinct-2, messages stuck in
a loop), the template that states the film and the stars when the model cannot write, chats that are
about what the agents watched, and the decoding controls against loops reaching the backend."""

import json

import numpy as np
import pytest
from sandbox_fakes import Scripted, embed

from agents.llm import HFBackend, LLMConfig, Sampling
from agents.sandbox.config import load_config
from agents.sandbox.profiles import movielens_profiles
from agents.sandbox.world import World, template_message
from data_prep import movielens
from eval.review.fidelity import repeats_ngram, words


@pytest.fixture(scope="module")
def ml(raw):
    return movielens.load(raw / "movielens_latest_small")


class Looping(Scripted):
    """Everyone socialises and chats with their first contact; every message repeats itself."""

    def __init__(self, places=None):
        super().__init__(places or {})
        self.asked = []

    def answer(self, conversation, constraint):
        self.asked.append((conversation[-1]["content"], constraint))
        if constraint.kind == "choice":
            return "social" if "social" in constraint.options else constraint.options[0]
        if "action" in constraint.schema:
            return '{"action": "chat", "contact": 1, "text": "I am looking at you, but it is a lie. I am looking at you, but it is a lie."}'
        if '"say"' in constraint.schema:
            return '{"say": "Nice. Nice. Nice."}'
        return super().answer(conversation, constraint)


def world(ml, backend, overrides=()):
    config = load_config(None, ["recommender.kind=popularity", "activity.pareto_xmin=1", *overrides])
    rng = np.random.default_rng(config.seed)
    profiles = movielens_profiles(ml, 4, ml.end, rng, config.features, config.min_history)
    names = [p.name for p in profiles]
    return World(config, profiles, ml, backend, embed, {n: set(names) - {n} for n in names}, rng)


@pytest.mark.slow
def test_each_round_measures_its_messages_and_finds_the_loops(ml):
    w = world(ml, Looping({}))
    events, stats = w.step()
    messages = [m for e in events if e["action"] == "chat" for m in e["messages"]]
    assert stats["chats"] == 4 and stats["messages"] == len(messages) == 4 * 4  # opening + three turns
    assert stats["messages_repeating_4gram"] == pytest.approx(
        0.25
    )  # every opening loops; "Nice." thrice does not
    assert 0 < stats["messages_distinct_2"] < 0.5 and stats["messages_by"] == "llm"
    assert repeats_ngram(words("a b c d a b c d")) and not repeats_ngram(words("a b c d e"))


def test_the_template_states_each_speakers_latest_film_and_stars(ml):
    backend = Looping({})
    w = world(ml, backend, ["text.messages=template"])
    events, stats = w.step()
    chats = [e for e in events if e["action"] == "chat"]
    assert chats and stats["messages_by"] == "template" and stats["messages_repeating_4gram"] == 0
    for chat in chats:
        speakers = [line.split(": ", 1)[0] for line in chat["text"].splitlines()]
        for k, (speaker, message) in enumerate(zip(speakers, chat["messages"], strict=True)):
            films = w.agents[speaker].recent(ml.movies)
            title, stars = films[-1 - speakers[:k].count(speaker)]  # each reply moves to an earlier film
            assert title in message and f"{stars:g} out of 5" in message
        assert len(set(chat["messages"])) == len(chat["messages"])  # no speaker repeats its line
    assert w.counts["template_messages"] == sum(len(c["messages"]) for c in chats)
    contact = [(p, c) for p, c in backend.asked if "Which contact do you chat with?" in p]
    assert len(contact) == len(chats)  # the contact is a question of its own, answered among the names
    for prompt, constraint in contact:
        assert constraint.kind == "choice" and all(name in prompt for name in constraint.options)
    assert not any("say" in str(c) for c in backend.batches)  # no LLM call wrote a message
    assert template_message("post", []) == "Nothing watched lately."
    assert template_message("reply", [("A", 4.0)], nth=1) == "That is all I have watched lately."


def test_an_llm_chat_prompt_carries_the_speakers_own_films(ml):
    from sandbox_fakes import Recording

    backend = Recording()
    w = world(ml, backend, ["activity.pareto_xmin=1"])
    w.step()
    w.step()
    social = [p for p in backend.prompts if "Chat with one contact" in p or "Reply to" in p]
    assert social
    for prompt in social:
        name = prompt.removeprefix("You are ").split(";")[0]
        title, stars = w.agents[name].recent(ml.movies)[-1]
        assert "Films you watched lately: " in prompt and f"{title} ({stars:g} of 5)" in prompt


def test_the_decoding_controls_reach_the_hf_backends_generate(tiny_model, monkeypatch):
    backend = HFBackend(LLMConfig(model=str(tiny_model)))
    seen = []
    original = backend.model.generate

    def spy(**kwargs):
        seen.append(kwargs)
        return original(**kwargs)

    monkeypatch.setattr(backend.model, "generate", spy)
    backend.generate(
        [[{"role": "user", "content": "hi"}]], Sampling(4, repetition_penalty=1.3, no_repeat_ngram_size=3)
    )
    backend.generate([[{"role": "user", "content": "hi"}]], Sampling(4))
    assert seen[0]["repetition_penalty"] == 1.3 and seen[0]["no_repeat_ngram_size"] == 3
    assert seen[1]["repetition_penalty"] == 1.0 and seen[1]["no_repeat_ngram_size"] == 0  # explicit
    assert set(backend.decoding_controls) == {"repetition_penalty", "no_repeat_ngram_size"}


@pytest.mark.slow
def test_the_sandbox_config_sets_the_controls_and_the_summary_says_which_applied(raw, tmp_path):
    import argparse

    from agents.sandbox.run import run

    class NoControls(Looping):
        decoding_controls = ()

    backend = NoControls({})
    sampled = []
    generate = backend.generate
    backend.generate = lambda c, s, k=None: sampled.append(s) or generate(c, s, k)
    args = argparse.Namespace(
        config=None, out=str(tmp_path / "run"), rounds=1, agents=3, human=None, overwrite=False,
        set=[f"data={raw / 'movielens_latest_small'}", "recommender.kind=popularity", "activity.pareto_xmin=1", "text.repetition_penalty=1.3"],
    )  # fmt: skip
    summary = run(args, backend, embed)
    assert summary["decoding_controls"] == {"applied": [], "not_available": ["repetition_penalty"]}
    # not asked of a backend that cannot apply it (a real one refuses), and recorded per kind of call
    assert sampled and all(s.repetition_penalty == 1.0 for s in sampled)
    assert summary["decoding"] and all(d["repetition_penalty"] == 1.0 for d in summary["decoding"].values())


def test_the_text_checks_by_hand():
    from agents.sandbox import textcheck as tc

    index = tc.title_index(
        {1: "Matrix, The (1999)", 2: "Casino (1995)", 3: "Up (2009)", 4: "Toy Story (1995)"}
    )
    assert tc.films_named("I loved the Matrix and TOY STORY; casino, up", index) == {
        1,
        2,
        4,
    }  # "up" too short
    assert tc.films_named("casinos at night", index) == set()  # whole words only
    longer = tc.title_index({5: "Enemy (2013)", 6: "Enemy of the State (1998)"})
    assert tc.films_named("Enemy of the State, then Enemy", longer) == {5, 6}
    assert tc.films_named("I watched Enemy of the State", longer) == {6}  # not "Enemy" inside it
    assert (
        tc.feeling_agrees(-0.6, 4.5) is False and tc.feeling_agrees(0.6, 4.5) and tc.feeling_agrees(-0.6, 3)
    )
    assert tc.feeling_agrees(-0.6, 2.0) and not tc.feeling_agrees(0.6, 2.0)
    genres = {1: ["Action", "Sci-Fi"], 4: ["Animation"]}
    assert tc.search_on_taste([4, 1], genres, ["sci-fi"]) and not tc.search_on_taste([4], genres, ["Sci-Fi"])
    assert not tc.search_on_taste([], genres, ["Sci-Fi"])  # nothing found: off taste
    assert tc.interview_truthful("Casino was great", {2, 4}, index)
    assert not tc.interview_truthful("Casino and The Matrix", {2}, index)  # names one it did not watch
    assert not tc.interview_truthful("I like films", {2}, index)  # names none
    memories = ["I watched Casino (1995), 4 of 5, a tense crime story", "Robbery films keep me awake"]
    assert tc.grounded("I like tense crime stories such as Casino", memories, index)
    assert not tc.grounded("I like Toy Story and crime", memories, index)  # a film no memory names
    assert not tc.grounded("Nothing in common here", memories, index)


class Critic(Scripted):
    """Every agent browses, watches the first film with a bitter feeling, or searches for nonsense."""

    def __init__(self, search=False):
        super().__init__({})
        self.search, self.said = search, None

    def answer(self, conversation, constraint):
        if constraint.kind == "choice" and "recommender" in constraint.options:
            return "recommender"
        if constraint.kind != "choice" and "items" in json.loads(constraint.schema)["properties"]:
            if self.search:  # the schema asks for 1 to page_size numbers whatever the action
                return json.dumps({"action": "search", "items": [1], "query": "zzqx", "feeling": ""})
            return json.dumps({"action": "watch", "items": [1], "query": "", "feeling": "I hated it, awful"})
        if self.said is not None and constraint.kind != "choice" and "say" in constraint.schema:
            return json.dumps({"say": self.said})
        return super().answer(conversation, constraint)


def test_each_round_checks_what_the_llm_wrote_beside_its_template(ml):
    w = world(ml, Critic())
    events, stats = w.step()
    stars = [e["stars"] for e in events if e["action"] == "watch"]
    checks = stats["text_checks"]
    # a bitter feeling agrees only with at most 3 stars; the template (verdict(stars)) always agrees
    assert stars and checks["feeling"]["texts"] == len(stars)
    assert checks["feeling"]["passed"] == pytest.approx(np.mean([s < 3.5 for s in stars]), abs=1e-4)
    assert checks["feeling"]["template_passed"] == 1.0 and checks["feeling"]["passed"] < 1.0
    # the scripted summary is the observation's own last line: grounded in it
    assert checks["summary"]["passed"] == 1.0 and checks["summary"]["texts"] > 0
    assert w.step()[1]["text_checks"].keys() >= {"feeling"}  # each round reports its own texts


@pytest.mark.slow
def test_a_search_off_the_agents_taste_fails_and_the_template_can_stand_in(ml):
    w = world(ml, Critic(search=True))
    _, stats = w.step()
    check = stats["text_checks"]["search"]
    assert check["by"] == "llm" and check["passed"] == 0.0  # "zzqx" finds nothing
    assert check["template_passed"] > 0  # the agents' first interests find films of their genres
    w = world(ml, Critic(search=True), ["text.search=template"])
    events, stats = w.step()
    searches = [e for e in events if e["action"] == "search"]
    assert searches and all(e["text"] == w.agents[e["agent"]].profile.interests[0] for e in searches)
    assert stats["text_checks"]["search"]["by"] == "template"


def test_an_interview_answer_is_checked_against_the_films_the_agent_watched(ml):
    backend = Critic()
    w = world(ml, backend)
    name = next(iter(w.agents))
    agent = w.agents[name]
    watched = ml.movies[agent.profile.history[-1][0]].title  # as the catalogue writes it, year and all
    never = next(m.title for i, m in ml.movies.items() if i not in agent.seen() and len(m.title) > 12)
    for said in (f"I watched {watched}", f"I watched {never}", "I like films"):
        backend.said = said
        assert w.interview(name, "What did you watch?") == said
    checks = [row for row in w.written if row["kind"] == "interview"]
    assert [row["passed"] for row in checks] == [True, False, False]


@pytest.mark.slow
def test_the_memory_template_writes_without_the_llm_and_the_run_says_so(ml):
    from agents.sandbox.run import decisions

    class Schemas(Critic):
        def answer(self, conversation, constraint):
            self.schemas = getattr(self, "schemas", []) + [str(getattr(constraint, "schema", ""))]
            return super().answer(conversation, constraint)

    backend = Schemas()
    w = world(ml, backend, ["memory.writer=template"])
    events, stats = w.step()
    for _ in range(4):  # to the first reflection round (reflect_every 5)
        stats = w.step()[1]
    assert backend.schemas and not any('"summary"' in c or '"insight"' in c for c in backend.schemas)
    assert w.model.counts["template_summaries"] > 0 and w.model.counts["llm_calls"] == 0
    assert not {"summary", "insight", "reflection"} & set(stats["text_checks"])  # nothing the LLM wrote
    assert all(a.memory.counts["reflections"] == 0 for a in w.agents.values())
    assert "memory texts: a template" in decisions(w.config)
