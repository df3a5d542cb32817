"""The sandbox world with a scripted, deterministic backend on the real MovieLens sample: posts reach
every contact in batched calls, unusable answers fall back and are counted, a checkpoint resumes to the
identical next state, interviews answer, the seed decides the run."""

import json
from collections import Counter

import numpy as np
import pytest
from sandbox_fakes import Scripted, embed

from agents.sandbox.config import load_config
from agents.sandbox.profiles import movielens_profiles
from agents.sandbox.world import World
from data_prep import movielens


@pytest.fixture(scope="module")
def ml(raw):
    return movielens.load(raw / "movielens_latest_small")


def world(ml, backend, overrides=(), n=5, fresh=True):
    config = load_config(None, ["recommender.kind=popularity", "activity.pareto_xmin=1", *overrides])
    rng = np.random.default_rng(config.seed)
    profiles = movielens_profiles(ml, n, ml.end, rng, config.features, config.min_history)
    names = [p.name for p in profiles]
    graph = {name: {other for other in names if other != name} for name in names}  # everyone knows everyone
    return World(config, profiles, ml, backend, embed, graph, rng, fresh=fresh)


@pytest.mark.slow
def test_a_post_reaches_every_contact_in_batched_calls(ml):
    probe = world(ml, Scripted({}))
    poster = next(iter(probe.agents))
    backend = Scripted({poster: "social"})
    w = world(ml, backend)
    events, stats = w.step()
    post = [e for e in events if e["action"] == "post"]
    assert len(post) == 1 and post[0]["agent"] == poster and stats["posts"] == 1
    contacts = sorted(set(w.agents) - {poster})
    assert post[0]["audience"] == contacts and w.counts["post_deliveries"] == len(contacts)
    for name in contacts:  # in each contact's memory
        assert any(f"{poster} says hello" in r.text for r in w.agents[name].memory.short)
    assert backend.batches == [5, 1, 5]  # places (all), the poster's decision, one batch for all memories


@pytest.mark.slow
def test_watching_goes_into_memory_and_the_recommender_history(ml):
    w = world(ml, Scripted({name: "recommender" for name in world(ml, Scripted({})).agents}))
    events, stats = w.step()
    watches = [e for e in events if e["action"] == "watch"]
    assert stats["watches"] == len(watches) == 5 and stats["exposure_genre_entropy"] > 0
    for event in watches:
        agent = w.agents[event["agent"]]
        assert agent.watched == [event["item"]] and event["item"] not in {
            m for m, _, _ in agent.profile.history
        }
        remembered = [t for r in agent.memory.short for t in (r.text, *r.enhancers)]
        assert any("liked it" in t and f": {event['stars']:g}/5." in t for t in remembered)
        assert 0.5 <= event["stars"] <= 5 and event["rated_by"]  # the star model's, and which candidate


@pytest.mark.slow
def test_unusable_answers_fall_back_and_are_counted(ml):
    names = list(world(ml, Scripted({})).agents)
    w = world(ml, Scripted({n: "recommender" for n in names}, broken={"recommender"}))
    events, stats = w.step()
    assert w.counts["fallback:recommender"] == 5 and stats["watches"] == 0
    assert sum(1 for e in events if e.get("fallback")) == 5
    w = world(ml, Scripted({}, broken={"place"}))
    w.step()
    assert w.counts["fallback:place"] == 5


@pytest.mark.slow
def test_a_checkpoint_resumes_to_the_identical_next_state(ml):
    names = list(world(ml, Scripted({})).agents)
    places = {
        n: p
        for n, p in zip(names, ["recommender", "social", "recommender", "social", "nothing"], strict=True)
    }
    overrides = [
        "recommender.kind=mf",
        "recommender.factors=8",
        "recommender.iterations=3",
        "recommender.rec_random_k=1",
        "memory.reflect_every=2",  # forgetting, reflection and promotions within the rounds run here
        "memory.enhance_times=1",
        "stars.llm_validation=20",  # the LLM's validation stars travel in the checkpoint
    ]
    live = world(ml, Scripted(places), overrides)
    assert len(live.rater.validation_answers) == 20
    live.step()
    live.step()
    saved = json.loads(json.dumps(live.state()))  # through JSON text, as on disk
    next_events, next_stats = live.step()
    resumed = world(ml, Scripted(places), overrides, fresh=False)  # as a resumed run builds it
    resumed.restore(saved)
    assert resumed.rater.validation_answers == live.rater.validation_answers
    events, stats = resumed.step()
    assert (events, stats) == (next_events, next_stats)
    memory_counts = sum((a.memory.counts for a in live.agents.values()), start=Counter())
    assert memory_counts["reflections"] and memory_counts["insights"]  # both happened in the resumed span
    assert json.dumps(resumed.state(), sort_keys=True) == json.dumps(live.state(), sort_keys=True)


@pytest.mark.slow
def test_the_seed_decides_the_run_and_interviews_answer(ml):
    places = dict.fromkeys(world(ml, Scripted({})).agents, "recommender")
    one, two = world(ml, Scripted(places)), world(ml, Scripted(places))
    assert one.step() == two.step()
    other = world(ml, Scripted(places), ["seed=1"])
    assert [p for p in other.agents] != [p for p in one.agents]
    name = next(iter(one.agents))
    assert one.interview(name, "What did you watch?") == f"{name} answers"
    # the place an agent chooses decides what it does: in "nothing" it neither browses, watches nor posts
    idle = world(ml, Scripted(dict.fromkeys(one.agents, "nothing")))
    events, stats = idle.step()
    assert not [e for e in events if e["action"] in ("browse", "watch", "post", "chat", "search")]
    assert stats["watches"] == 0 and [e["action"] for e in one.step()[0]].count("watch") > 0


@pytest.mark.slow
def test_search_ranks_the_catalogue_and_skips_what_the_agent_has_seen(ml):
    w = world(ml, Scripted({}))
    toy = [m.id for m in ml.movies.values() if "toy story" in m.title.lower()]
    found = w.search("Toy Story", set())
    assert len(found) == w.config.recommender.page_size and set(toy) <= set(found)
    again = w.search("Toy Story", set(toy))
    assert not set(toy) & set(again) and len(again) == len(found)
    assert w.search("Toy Story", set(ml.movies) - {toy[0]}) == [toy[0]]  # only one left to show


@pytest.mark.slow
def test_an_empty_search_query_is_a_counted_fallback_not_the_first_films(ml):
    class EmptySearch(Scripted):
        def answer(self, conversation, constraint):
            if constraint.kind == "json" and "feeling" in constraint.schema:
                return json.dumps({"action": "search", "items": [1], "query": "  ", "feeling": ""})
            return super().answer(conversation, constraint)

    names = list(world(ml, Scripted({})).agents)
    w = world(ml, EmptySearch(dict.fromkeys(names, "recommender")))
    events, _ = w.step()
    assert w.counts["fallback:empty_search"] == len(names)
    assert not any(e["action"] == "search" for e in events)
    assert sum(1 for e in events if e["action"] == "leave" and e.get("fallback")) == len(names)
