"""Sandbox data and profiles: the MovieLens loader on the real sample, aligned profiles, handcrafted
profiles, profiles written by a (scripted) LLM, and the errors bad profile files get (file and row,
before any LLM call)."""

import json

import numpy as np
import pytest

from agents.sandbox import movielens
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


def test_aligned_profiles_are_drawn_with_the_seed_and_carry_whole_titles(ml):
    first = movielens_profiles(ml, 10, np.random.default_rng(7))
    again = movielens_profiles(ml, 10, np.random.default_rng(7))
    other = movielens_profiles(ml, 10, np.random.default_rng(8))
    assert first == again and [p.id for p in first] != [p.id for p in other]
    by_user = ml.by_user()
    for profile in first:
        assert profile.watched == [ml.movies[r.movie].title for r in by_user[profile.id]]
        assert min(len(title) for title in profile.watched) > 3  # titles, not single characters
        assert 1 <= len(profile.interests) <= 3 and profile.source == "movielens"
    assert aligned_profiles(ml, [p.id for p in first]) == first  # the same profiles by id
    with pytest.raises(ProfileError, match="no MovieLens user 9999"):
        aligned_profiles(ml, [9999])
    with pytest.raises(ProfileError, match="611 agents asked for, but the data has 610 users"):
        movielens_profiles(ml, 611, np.random.default_rng(0))


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
    aligned = movielens_profiles(ml, 3, np.random.default_rng(0))
    path = tmp_path / "p.csv"
    path.write_text(HEADER + f"{aligned[0].id},Ana,female,31,curious,nurse,Comedy,Poster\n")
    combined = combine(aligned, load_profiles(path))
    assert combined[0].name == "Ana" and combined[0].watched == aligned[0].watched
    assert combined[0].source == "movielens+handcrafted" and combined[1] == aligned[1]


class ProfileWriter:
    """Scripted answers in order; records the prompts and the constraint."""

    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def generate(self, conversations, sampling, constraint=None):
        self.asked.append((conversations, constraint))
        return self.answers[: len(conversations)]


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
    aligned = aligned_profiles(ml, [1, 2, 3])
    hand = Profile(9, "Zoe", "", 41, "calm", "", [], ["Poster"])
    backend = ProfileWriter([person("Ann"), person("Ann"), "{not json", person("Bob", features=[])])
    profiles, report = written_by_llm([*aligned, hand], backend, "nurses in Leeds", np.random.default_rng(0))
    ((conversations, constraint),) = backend.asked  # one batched call, a JSON schema
    assert len(conversations) == 4 and constraint.kind == "json"
    assert "nurses in Leeds" in conversations[0][0]["content"]
    assert "User 1" not in conversations[0][0]["content"]  # the placeholder name is not a fact
    assert aligned[0].interests[0] in conversations[0][0]["content"]
    first, second, third, zoe = profiles
    assert (first.name, first.age, first.career, first.features) == ("Ann", 30, "nurse", ["Critic"])
    assert first.interests == aligned[0].interests and first.watched == aligned[0].watched  # the data's
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
