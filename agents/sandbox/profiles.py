"""Agent profiles: handcrafted (YAML or CSV), aligned with real MovieLens users, or written by the LLM
from a prompt; combinable.

A profile has an id, a unique name, gender, age, traits, career, interests and any of the five
behaviour features (Watcher, Explorer, Critic, Chatter, Poster). A MovieLens-aligned profile takes its
interests (the user's most liked genres) and watched history (full titles, oldest first) from the
user's ratings; MovieLens has no demographics, so those fields stay empty unless a handcrafted profile
of the same id supplies them (``combine``), or the LLM writes them (``written_by_llm``: from a prompt
describing the population, it fills every field a profile lacks, seeing what the profile already has;
one batched structured call; handcrafted fields are never replaced).

Bad input is an error naming the file and the row, raised before any LLM call: a missing column or
field, an unknown behaviour feature, a duplicate id or name, an age that is not a whole number in
[0, 120].

CSV columns: id, name, gender, age, traits, career, interests, features (interests and features
separated by ';'; features may be empty). YAML: a list of mappings with the same keys (lists as lists).
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import yaml

from agents.sandbox.config import FEATURES

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
    watched: list[str] = field(default_factory=list)  # titles, oldest first
    source: str = "handcrafted"  # handcrafted | movielens | llm, joined by + when combined

    def summary(self) -> str:
        parts = [self.name]
        if self.gender or self.age is not None:
            parts.append(", ".join(str(x) for x in (self.gender, self.age) if x not in ("", None)))
        if self.career:
            parts.append(self.career)
        if self.traits:
            parts.append(f"traits: {self.traits}")
        if self.interests:
            parts.append(f"likes {', '.join(self.interests)}")
        if self.features:
            parts.append(f"a {', '.join(self.features)}")
        return "; ".join(parts)


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
    extra = sorted(set(row) - set(REQUIRED) - {"features"})
    if extra:
        raise ProfileError(f"{where}: unknown field {extra[0]!r}")
    return Profile(
        pid,
        str(row["name"]).strip(),
        str(row["gender"]).strip(),
        age,
        str(row["traits"]).strip(),
        str(row["career"]).strip(),
        _split(row["interests"]),
        features,
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
    data, n: int, rng: np.random.Generator, liked: float = 4.0, top_genres: int = 3
) -> list[Profile]:
    """n MovieLens users drawn with the run's generator: interests are the genres of the movies they
    rated at least ``liked`` (most frequent first, ties by name), watched is every movie they rated,
    oldest first (by time, then movie id)."""
    by_user = data.by_user()
    users = sorted(by_user)
    if n > len(users):
        raise ProfileError(f"{n} agents asked for, but the data has {len(users)} users")
    chosen = sorted(int(u) for u in rng.choice(users, size=n, replace=False))
    return aligned_profiles(data, chosen, liked, top_genres)


def aligned_profiles(data, users: list[int], liked: float = 4.0, top_genres: int = 3) -> list[Profile]:
    """The profiles of these MovieLens users (see movielens_profiles); a user without ratings is an
    error."""
    by_user = data.by_user()
    unknown = [u for u in users if u not in by_user]
    if unknown:
        raise ProfileError(f"no MovieLens user {unknown[0]} in the data")
    profiles = []
    for user in users:
        ratings = by_user[user]
        genres = Counter(g for r in ratings if r.stars >= liked for g in data.movies[r.movie].genres)
        genres.pop("(no genres listed)", None)
        interests = [g for g, _ in sorted(genres.items(), key=lambda kv: (-kv[1], kv[0]))[:top_genres]]
        watched = [data.movies[r.movie].title for r in ratings]
        profiles.append(
            Profile(user, f"User {user}", interests=interests, watched=watched, source="movielens")
        )
    return profiles


def combine(aligned: list[Profile], handcrafted: list[Profile]) -> list[Profile]:
    """Handcrafted fields (name, demographics, traits, career, features; interests when given) over
    MovieLens-aligned profiles of the same id; the watched history stays the data's."""
    by_id = {p.id: p for p in handcrafted}
    out = []
    for profile in aligned:
        hand = by_id.get(profile.id)
        if hand is None:
            out.append(profile)
            continue
        out.append(
            replace(
                hand,
                interests=hand.interests or profile.interests,
                watched=profile.watched,
                source="movielens+handcrafted",
            )
        )
    check_unique(out, [f"profile {p.id}" for p in out])
    return out


def placeholder_name(profile: Profile) -> bool:
    return profile.source.startswith("movielens") and profile.name == f"User {profile.id}"


def written_by_llm(
    profiles: list[Profile], backend, prompt: str, rng: np.random.Generator
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
    conversations = []
    for profile in profiles:
        about = profile.summary()
        if placeholder_name(profile):
            about = about.removeprefix(profile.name).removeprefix("; ")
        recent = f" Films they watched lately: {'; '.join(profile.watched[-5:])}." if profile.watched else ""
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
    for profile, answer in zip(profiles, answers, strict=True):
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
        report["written"][profile.id] = written
        out.append(replace(profile, **written, source=f"{profile.source}+llm" if written else profile.source))
    check_unique(out, [f"profile {p.id}" for p in out])
    return out, report


def to_yaml(profiles: list[Profile]) -> str:
    """Profiles as a handcrafted YAML file (``profiles:`` in a config reads it back)."""
    rows = [{key: getattr(p, key) for key in (*REQUIRED, "features")} for p in profiles]
    return yaml.safe_dump(rows, sort_keys=False, allow_unicode=True)
