"""Agent profiles: handcrafted (YAML or CSV), aligned with real MovieLens users, or written by the LLM
from a prompt; combinable.

A profile has an id, a unique name, gender, age, traits, career, interests and any of the five
behaviour features (Watcher, Explorer, Critic, Chatter, Poster). A MovieLens-aligned profile stands for
one user at the run's start: its history is the user's ratings strictly before the start (film, stars,
time; the agent's memory starts with them), its taste comes from those ratings (most liked genres,
genres cared less for, the mean rating: data_prep.movielens.user_at), and its behaviour features are
what the data shows where it can (Watcher, Explorer, Critic; ``features.from_data``) and drawn with
the run's generator otherwise (each with probability ``features.sample_share``; Chatter and Poster
always, since MovieLens has no social data). ``feature_sources`` says which is which. MovieLens has no
demographics, so those fields stay empty unless a handcrafted profile of the same user supplies them
(``combine``), or the LLM writes them (``written_by_llm``: from a prompt describing the population, it
fills every field a profile lacks, seeing what the profile already has; one batched structured call;
handcrafted fields are never replaced).

Bad input is an error naming the file and the row, raised before any LLM call: a missing column or
field, an unknown behaviour feature, a duplicate id or name, an age that is not a whole number in
[0, 120], a ``user`` that is not a MovieLens user of the data or has fewer ratings before the start
than ``min_history``.

CSV columns: id, name, gender, age, traits, career, interests, features, and optionally user
(interests and features separated by ';'; features may be empty; user is the MovieLens user the agent
stands for, by default the one whose id is the profile's id, if the data has it). YAML: a list of
mappings with the same keys (lists as lists).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

from agents.sandbox.config import FEATURES
from data_prep.movielens import day, user_at
from data_prep.prompt import describe_person

REQUIRED = ("id", "name", "gender", "age", "traits", "career", "interests")


class ProfileError(ValueError):
    pass


@dataclass
class Profile:
    id: int
    name: str
    gender: str = ""
    age: int | None = None
    traits: str = ""
    career: str = ""
    interests: list[str] = field(default_factory=list)
    features: list[str] = field(default_factory=list)
    source: str = "handcrafted"  # handcrafted | movielens | llm, joined by + when combined
    user: int | None = None  # the MovieLens user it stands for
    dislikes: list[str] = field(default_factory=list)
    mean_stars: float | None = None
    history: list[list] = field(default_factory=list)  # [movie, stars, ts] before the start, oldest first
    start: int | None = None  # the moment the history ends (exclusive)
    feature_sources: dict[str, str] = field(
        default_factory=dict
    )  # feature -> data | sampled | handcrafted | llm

    def summary(self, features: tuple[str, ...] | None = None) -> str:
        """Who the agent is; ``features``: only those of its features that bear on the decision at hand
        (None: all of them)."""
        return describe_person(
            self.name,
            gender=self.gender,
            age=self.age,
            career=self.career,
            traits=self.traits,
            interests=self.interests,
            dislikes=self.dislikes,
            mean_stars=self.mean_stars,
            features=[f for f in self.features if features is None or f in features],
        )

    def titles(self, movies: dict, last: int | None = None) -> list[str]:
        """The titles of the history, oldest first (the last ``last`` of them)."""
        rows = self.history[-last:] if last else self.history
        return [movies[movie].title for movie, _, _ in rows]


def _split(value) -> list[str]:
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    return [v.strip() for v in str(value or "").split(";") if v.strip()]


def _profile(row: dict, where: str) -> Profile:
    missing = [key for key in REQUIRED if row.get(key) in (None, "")]
    if missing:
        raise ProfileError(f"{where}: missing {', '.join(missing)}")
    try:
        pid = int(row["id"])
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: id {row['id']!r} is not a whole number") from None
    try:
        age = int(row["age"])
    except (TypeError, ValueError):
        raise ProfileError(f"{where}: age {row['age']!r} is not a whole number") from None
    if not 0 <= age <= 120:
        raise ProfileError(f"{where}: age {age} is outside [0, 120]")
    features = _split(row.get("features"))
    unknown = [f for f in features if f not in FEATURES]
    if unknown:
        raise ProfileError(
            f"{where}: unknown behaviour feature {unknown[0]!r} (one of {', '.join(FEATURES)})"
        )
    extra = sorted(set(row) - set(REQUIRED) - {"features", "user"})
    if extra:
        raise ProfileError(f"{where}: unknown field {extra[0]!r}")
    user = None
    if row.get("user") not in (None, ""):
        try:
            user = int(row["user"])
        except (TypeError, ValueError):
            raise ProfileError(f"{where}: user {row['user']!r} is not a whole number") from None
    return Profile(
        pid,
        str(row["name"]).strip(),
        str(row["gender"]).strip(),
        age,
        str(row["traits"]).strip(),
        str(row["career"]).strip(),
        _split(row["interests"]),
        features,
        user=user,
        feature_sources=dict.fromkeys(features, "handcrafted"),
    )


def load_profiles(path: str | Path) -> list[Profile]:
    path = Path(path)
    if path.suffix.lower() == ".csv":
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise ProfileError(f"{path}: missing column {', '.join(missing)}")
            rows = [(f"{path} row {n}", row) for n, row in enumerate(reader, start=2)]
    else:
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise ProfileError(f"{path}: expected a list of profiles (mappings)")
        rows = [(f"{path} profile {n}", row) for n, row in enumerate(data, start=1)]
    profiles = [_profile(row, where) for where, row in rows]
    check_unique(profiles, [where for where, _ in rows])
    return profiles


def check_unique(profiles: list[Profile], where: list[str]) -> None:
    seen_ids: dict[int, str] = {}
    seen_names: dict[str, str] = {}
    for profile, place in zip(profiles, where, strict=True):
        if profile.id in seen_ids:
            raise ProfileError(f"{place}: duplicate id {profile.id} (first at {seen_ids[profile.id]})")
        if profile.name in seen_names:
            raise ProfileError(
                f"{place}: duplicate name {profile.name!r} (first at {seen_names[profile.name]})"
            )
        seen_ids[profile.id], seen_names[profile.name] = place, place


def movielens_profiles(
    data, n: int, start: int, rng: np.random.Generator, features, min_history: int = 1
) -> list[Profile]:
    """n MovieLens users with at least ``min_history`` ratings before ``start``, drawn with the run's
    generator, as aligned profiles at ``start`` (see aligned_profiles)."""
    users = sorted(u for u in data.by_user() if len(data.history(u, start)) >= max(min_history, 1))
    if n > len(users):
        raise ProfileError(
            f"{n} agents asked for, but the data has {len(users)} users with at least {max(min_history, 1)} "
            f"ratings before the start ({day(start)})"
        )
    chosen = sorted(int(u) for u in rng.choice(users, size=n, replace=False))
    return aligned_profiles(data, chosen, start, rng, features, min_history)


def sample_features(
    known: list[str], estimated: set[str], rng: np.random.Generator, share: float
) -> dict[str, str]:
    """Every feature the data did not settle (not in ``estimated``) drawn with probability ``share``;
    returns feature -> source, in the order of FEATURES."""
    out = {}
    for feature in FEATURES:
        if feature in estimated:
            if feature in known:
                out[feature] = "data"
        elif rng.random() < share:
            out[feature] = "sampled"
    return out


def aligned_profiles(
    data, users: list[int], start: int, rng: np.random.Generator, features, min_history: int = 1
) -> list[Profile]:
    """The profiles of these MovieLens users as they were at ``start``: history and taste from their
    ratings strictly before it, features from the data where ``features.from_data`` (Watcher, Explorer,
    Critic) and drawn otherwise. A user the data does not have, or with fewer than ``min_history``
    ratings before the start, is an error."""
    by_user = data.by_user()
    unknown = [u for u in users if u not in by_user]
    if unknown:
        raise ProfileError(f"no MovieLens user {unknown[0]} in the data")
    profiles = []
    for user in users:
        now = user_at(data, user, start)
        if len(now.history) < max(min_history, 1):
            raise ProfileError(
                f"MovieLens user {user} has {len(now.history)} ratings before the start ({day(start)}); "
                f"min_history is {max(min_history, 1)}"
            )
        estimated = {"Watcher", "Explorer", "Critic"} if features.from_data else set()
        sources = sample_features(now.features, estimated, rng, features.sample_share)
        profiles.append(
            Profile(
                user,
                f"User {user}",
                interests=now.interests,
                features=list(sources),
                source="movielens",
                user=user,
                dislikes=now.dislikes,
                mean_stars=now.mean_stars,
                history=[[r.movie, r.stars, r.ts] for r in now.history],
                start=start,
                feature_sources=sources,
            )
        )
    return profiles


def combine(aligned: list[Profile], handcrafted: list[Profile]) -> list[Profile]:
    """Handcrafted fields (name, demographics, traits, career, features; interests when given) over
    MovieLens-aligned profiles of the same user; the history and the taste stay the data's."""
    by_user = {h.user if h.user is not None else h.id: h for h in handcrafted}
    out = []
    for profile in aligned:
        hand = by_user.get(profile.user)
        if hand is None:
            out.append(profile)
            continue
        out.append(
            replace(
                profile,
                id=hand.id,
                name=hand.name,
                gender=hand.gender,
                age=hand.age,
                traits=hand.traits,
                career=hand.career,
                interests=hand.interests or profile.interests,
                features=hand.features or profile.features,
                feature_sources=hand.feature_sources if hand.features else profile.feature_sources,
                source="movielens+handcrafted",
            )
        )
    check_unique(out, [f"profile {p.id}" for p in out])
    return out


def placeholder_name(profile: Profile) -> bool:
    return profile.source.startswith("movielens") and profile.name == f"User {profile.id}"


def written_by_llm(
    profiles: list[Profile], backend, prompt: str, rng: np.random.Generator, movies: dict | None = None
) -> tuple[list[Profile], dict]:
    """The LLM fills every empty field of these profiles (and a MovieLens placeholder name) from
    ``prompt``, a description of the population, and what each profile already has; one batched call
    with a JSON schema (features among the five, an age in [16, 90]). An unusable answer leaves its
    profile as it was; a name the LLM gives twice gets the profile's id appended. Both are counted in
    the returned report, with what was written to each profile."""
    from agents.llm import Constraint, Sampling

    schema = Constraint.json_object(
        name={"type": "string", "minLength": 1, "maxLength": 40},
        gender={"type": "string", "minLength": 1, "maxLength": 20},
        age={"type": "integer", "minimum": 16, "maximum": 90},
        traits={"type": "string", "minLength": 1, "maxLength": 120},
        career={"type": "string", "minLength": 1, "maxLength": 60},
        interests={
            "type": "array",
            "items": {"type": "string", "maxLength": 30},
            "minItems": 1,
            "maxItems": 3,
        },
        features={"type": "array", "items": {"type": "string", "enum": list(FEATURES)}, "maxItems": 3},
    )
    titles = {p.id: p.titles(movies, 5) if movies and p.history else [] for p in profiles}
    conversations = []
    for profile in profiles:
        about = profile.summary()
        if placeholder_name(profile):
            about = about.removeprefix(profile.name).removeprefix("; ")
        recent = f" Films they watched lately: {'; '.join(titles[profile.id])}." if titles[profile.id] else ""
        ask = (
            f"Invent one person of this population: {prompt}\n"
            f"What is known about them: {about or 'nothing yet'}.{recent}\n"
            "Give their name, gender, age, traits, career, up to three favourite movie genres, and which "
            f"of these describe them: {', '.join(FEATURES)}."
        )
        conversations.append([{"role": "user", "content": ask}])
    answers = backend.generate(conversations, Sampling(160, 0.7, 1.0, int(rng.integers(2**31 - 1))), schema)
    report = {"fallbacks": 0, "renamed": 0, "written": {}}
    out, names = [], {p.name for p in profiles if not placeholder_name(p)}
    for profile, answer in zip(profiles, (a.text for a in answers), strict=True):
        value = schema.parse(answer)  # every field present, of its type, in its range; or None
        ok = value is not None and bool(value["name"].strip())
        if not ok:
            report["fallbacks"] += 1
            report["written"][profile.id] = {"unusable_answer": answer}
            out.append(profile)
            continue
        written = {}
        if placeholder_name(profile) or not profile.name:
            name = value["name"].strip()
            if name in names:
                name, report["renamed"] = f"{name} ({profile.id})", report["renamed"] + 1
            names.add(name)
            written["name"] = name
        for key in ("gender", "traits", "career"):
            if not getattr(profile, key) and value[key].strip():
                written[key] = value[key].strip()
        if profile.age is None:
            written["age"] = value["age"]
        if not profile.interests:
            interests = [i.strip() for i in value["interests"] if i.strip()]
            if interests:
                written["interests"] = interests
            else:  # only blank interests: the profile keeps none, counted
                report["blank_interests"] = report.get("blank_interests", 0) + 1
        if not profile.features:
            written["features"] = list(dict.fromkeys(value["features"]))  # the schema allows only the five
            written["feature_sources"] = dict.fromkeys(written["features"], "llm")
        report["written"][profile.id] = written
        out.append(replace(profile, **written, source=f"{profile.source}+llm" if written else profile.source))
    check_unique(out, [f"profile {p.id}" for p in out])
    return out, report


def to_yaml(profiles: list[Profile]) -> str:
    """Profiles as a handcrafted YAML file (``profiles:`` in a config reads it back)."""
    rows = [
        {key: getattr(p, key) for key in (*REQUIRED, "features")}
        | ({"user": p.user} if p.user is not None else {})
        for p in profiles
    ]
    return yaml.safe_dump(rows, sort_keys=False, allow_unicode=True)
