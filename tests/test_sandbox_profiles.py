"""Sandbox data and profiles: the MovieLens loader on the real sample, aligned profiles, handcrafted
profiles, profiles written by a (scripted) LLM, and the errors bad profile files get (file and row,
before any LLM call)."""

import json

import numpy as np
import pytest

from agents.llm import Answer
from agents.sandbox.config import FeatureConfig
from agents.sandbox.profiles import (
    Profile,
    ProfileError,
    aligned_profiles,
    combine,
    load_profiles,
    movielens_profiles,
    to_yaml,
    written_by_llm,
)
from data_prep import movielens

START = movielens.parse_moment("2010-01-01", None)
FEATURES = FeatureConfig()


@pytest.fixture(scope="module")
def ml(raw):
    return movielens.load(raw / "movielens_latest_small")


def test_movielens_loads_the_sample_and_keeps_the_fake_row_as_a_reject(ml):
    assert (ml.counts["ratings"], ml.counts["users"], ml.counts["movies"]) == (100836, 610, 9742)
    assert ml.rejects == [
        {
            "file": "ratings.csv",
            "line": 100838,
            "reason": "unknown_movie",
            "row": {"userId": "999", "movieId": "999999", "rating": "5.0", "timestamp": "1493846415"},
        }
    ]
    keys = [(r.ts, r.movie) for r in ml.ratings]
    assert keys == sorted(keys)  # time order, ties by movie id
    assert ml.movies[1].text().startswith("Toy Story (1995) (Adventure, Animation")


def profiles(ml, n, seed, start=START, min_history=5):
    return movielens_profiles(ml, n, start, np.random.default_rng(seed), FEATURES, min_history)


def test_aligned_profiles_carry_their_users_history_before_the_start_and_its_taste(ml):
    first, again, other = profiles(ml, 10, 7), profiles(ml, 10, 7), profiles(ml, 10, 8)
    assert first == again and [p.id for p in first] != [p.id for p in other]
    for profile in first:
        before = [r for r in ml.by_user()[profile.user] if r.ts < START]
        assert len(before) >= 5 and profile.history == [[r.movie, r.stars, r.ts] for r in before]
        assert profile.start == START and profile.source == "movielens"
        assert profile.mean_stars == pytest.approx(np.mean([r.stars for r in before]), abs=0.005)
        assert 1 <= len(profile.interests) <= 3 and not set(profile.interests) & set(profile.dislikes)
        # Watcher, Explorer and Critic are the data's; Chatter and Poster are drawn
        data = movielens.user_at(ml, profile.user, START).features
        assert [f for f in profile.features if f in ("Watcher", "Explorer", "Critic")] == data
        assert {f: s for f, s in profile.feature_sources.items() if s == "data"} == dict.fromkeys(
            data, "data"
        )
        assert all(
            profile.feature_sources[f] == "sampled" for f in ("Chatter", "Poster") if f in profile.features
        )
    by_id = aligned_profiles(ml, [p.id for p in first], START, np.random.default_rng(1), FEATURES)
    assert [(p.history, p.interests, p.dislikes) for p in by_id] == [
        (p.history, p.interests, p.dislikes) for p in first
    ]
    with pytest.raises(ProfileError, match="no MovieLens user 9999"):
        aligned_profiles(ml, [9999], START, np.random.default_rng(0), FEATURES)
    late = next(u for u, rs in ml.by_user().items() if rs[0].ts > START)
    with pytest.raises(
        ProfileError, match=f"MovieLens user {late} has 0 ratings before the start \\(2010-01-01\\)"
    ):
        aligned_profiles(ml, [late], START, np.random.default_rng(0), FEATURES)
    with pytest.raises(
        ProfileError, match="611 agents asked for, but the data has 610 users with at least 5"
    ):
        profiles(ml, 611, 0, start=ml.end)


def test_features_the_data_cannot_show_are_drawn_and_from_data_can_be_turned_off(ml):
    many = movielens_profiles(ml, 200, ml.end, np.random.default_rng(0), FeatureConfig(sample_share=0.3), 5)
    drawn = [p for p in many if "Chatter" in p.features]
    assert 0.2 < len(drawn) / len(many) < 0.4  # drawn with probability 0.3
    none = movielens_profiles(ml, 50, ml.end, np.random.default_rng(0), FeatureConfig(sample_share=0.0), 5)
    assert all(set(p.features) <= {"Watcher", "Explorer", "Critic"} for p in none)
    assert any(p.features for p in none)  # the data shows some
    off = movielens_profiles(
        ml, 50, ml.end, np.random.default_rng(0), FeatureConfig(from_data=False, sample_share=0.0), 5
    )
    assert all(p.features == [] for p in off)


def test_the_profile_summary_names_only_the_features_a_decision_asks_for():
    profile = Profile(
        1, "Ana", interests=["Drama"], dislikes=["Horror"], mean_stars=3.25, features=["Watcher", "Chatter"]
    )
    assert profile.summary() == (
        "Ana; likes Drama; cares less for Horror; rates films 3.2 stars out of 5 on average; "
        "a Watcher: you watch a lot of films and rate what you watch; "
        "a Chatter: you enjoy private chats with friends and trust their tips"
    )
    assert "Chatter" not in profile.summary(("Watcher", "Explorer")) and "Watcher" in profile.summary(
        ("Watcher",)
    )


HEADER = "id,name,gender,age,traits,career,interests,features\n"


def test_handcrafted_profiles_from_csv_and_yaml(tmp_path):
    csv_path = tmp_path / "p.csv"
    csv_path.write_text(
        HEADER + "1,Ana,female,31,curious,nurse,Comedy;Drama,Watcher;Critic\n2,Bo,male,40,calm,chef,Horror,\n"
    )
    profiles = load_profiles(csv_path)
    assert profiles[0].interests == ["Comedy", "Drama"] and profiles[0].features == ["Watcher", "Critic"]
    assert profiles[1].features == [] and profiles[1].age == 40
    yaml_path = tmp_path / "p.yaml"
    yaml_path.write_text(
        "- {id: 1, name: Ana, gender: female, age: 31, traits: curious, career: nurse, interests: [Comedy]}\n"
    )
    assert load_profiles(yaml_path)[0].summary() == "Ana; female, 31; nurse; traits: curious; likes Comedy"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("id,name,gender,age,traits,interests\n1,A,f,3,x,y\n", r"p\.csv: missing column career"),
        (HEADER + "1,A,f,30,x,c,Comedy,Lurker\n", r"p\.csv row 2: unknown behaviour feature 'Lurker'"),
        (
            HEADER + "1,A,f,30,x,c,Comedy,\n2,A,m,40,y,d,Drama,\n",
            r"p\.csv row 3: duplicate name 'A' \(first at .*row 2\)",
        ),
        (HEADER + "1,A,f,30,x,c,Comedy,\n1,B,m,40,y,d,Drama,\n", r"p\.csv row 3: duplicate id 1"),
        (HEADER + "1,A,f,old,x,c,Comedy,\n", r"p\.csv row 2: age 'old' is not a whole number"),
        (HEADER + "1,A,f,130,x,c,Comedy,\n", r"p\.csv row 2: age 130 is outside \[0, 120\]"),
        (HEADER + "1,A,f,30,,c,Comedy,\n", r"p\.csv row 2: missing traits"),
    ],
)
def test_bad_profile_files_name_the_file_and_row(tmp_path, text, message):
    path = tmp_path / "p.csv"
    path.write_text(text)
    with pytest.raises(ProfileError, match=message):
        load_profiles(path)


def test_handcrafted_fields_over_aligned_profiles_keep_the_data_history(ml, tmp_path):
    aligned = profiles(ml, 3, 0)
    path = tmp_path / "p.csv"
    path.write_text(
        HEADER.strip() + ",user\n" + f"70,Ana,female,31,curious,nurse,Comedy,Poster,{aligned[0].user}\n"
    )
    combined = combine(aligned, load_profiles(path))
    assert (combined[0].id, combined[0].name, combined[0].user) == (70, "Ana", aligned[0].user)
    assert combined[0].history == aligned[0].history and combined[0].mean_stars == aligned[0].mean_stars
    assert combined[0].features == ["Poster"] and combined[0].feature_sources == {"Poster": "handcrafted"}
    assert combined[0].source == "movielens+handcrafted" and combined[1] == aligned[1]
    path.write_text(HEADER.strip() + ",user\n1,Ana,female,31,curious,nurse,Comedy,,x1\n")
    with pytest.raises(ProfileError, match=r"p\.csv row 2: user 'x1' is not a whole number"):
        load_profiles(path)


class ProfileWriter:
    """Scripted answers in order; records the prompts and the constraint."""

    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def generate(self, conversations, sampling, constraint=None):
        self.asked.append((conversations, constraint))
        return [Answer(a) for a in self.answers[: len(conversations)]]


def person(name, age=30, features=("Critic", "Critic")):
    return json.dumps(
        {
            "name": name,
            "gender": "woman",
            "age": age,
            "traits": "curious",
            "career": "nurse",
            "interests": ["Drama"],
            "features": list(features),
        }
    )


def test_the_llm_fills_only_what_profiles_lack_and_every_problem_is_counted(ml, tmp_path):
    aligned = aligned_profiles(
        ml, [1, 2, 3], ml.end, np.random.default_rng(0), FeatureConfig(from_data=False, sample_share=0)
    )
    hand = Profile(9, "Zoe", "", 41, "calm", "", [], ["Poster"])
    backend = ProfileWriter([person("Ann"), person("Ann"), "{not json", person("Bob", features=[])])
    written, report = written_by_llm(
        [*aligned, hand], backend, "nurses in Leeds", np.random.default_rng(0), ml.movies
    )
    ((conversations, constraint),) = backend.asked  # one batched call, a JSON schema
    assert len(conversations) == 4 and constraint.kind == "json"
    assert "nurses in Leeds" in conversations[0][0]["content"]
    assert "User 1" not in conversations[0][0]["content"]  # the placeholder name is not a fact
    assert aligned[0].interests[0] in conversations[0][0]["content"]
    assert (
        ml.movies[aligned[0].history[-1][0]].title in conversations[0][0]["content"]
    )  # films watched lately
    first, second, third, zoe = written
    assert (first.name, first.age, first.career, first.features) == ("Ann", 30, "nurse", ["Critic"])
    assert first.feature_sources == {"Critic": "llm"}
    assert first.interests == aligned[0].interests and first.history == aligned[0].history  # the data's
    assert first.source == "movielens+llm"
    assert second.name == "Ann (2)" and report["renamed"] == 1
    assert third == aligned[2] and report["fallbacks"] == 1
    assert report["written"][3] == {"unusable_answer": "{not json"}
    # the handcrafted name, age, traits and features stay; only the empty fields are written
    assert (zoe.name, zoe.age, zoe.traits, zoe.features) == ("Zoe", 41, "calm", ["Poster"])
    assert (zoe.gender, zoe.career, zoe.interests) == ("woman", "nurse", ["Drama"])
    path = tmp_path / "profiles.yaml"  # written profiles are a handcrafted file for the next run
    path.write_text(to_yaml([first, second, zoe]))
    assert [p.name for p in load_profiles(path)] == ["Ann", "Ann (2)", "Zoe"]
