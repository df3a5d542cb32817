"""The RecLLMSim conversations (``../shared/data/raw/recllmsim``, its SOURCE.md): loaders for both layouts.

- ``LLM_agent_user/<task>/<n>.json``: an LLM-played user with a written preference (profile) and a task
  context talks to an LLM assistant; user turns carry one intent, assistant turns a hallucination flag;
  seven quality ratings per conversation, the preference summary and strategy labels.
- ``real_human_user/<person>/<task>/<n>.json``: real people (Chinese) with a structured profile, a
  four-item questionnaire, and multi-label intents per user turn.
- ``user_profiling/desc_translated.json`` (attribute -> Chinese tag -> English tag), the preference
  pool (``RecUserSim/data/pool/preference_pool_en.txt``: numbered profiles separated by blank lines) and
  the task-context templates (``RecUserSim/data/task_context_en.xlsx``, read with openpyxl).

Every file is read; a record that cannot be used (not JSON, a missing field, a field of the wrong
type, a rating outside its scale, a turn without role or content) is not loaded: it is reported with
its file and reason (``Loaded.rejects``) and counted, never skipped silently. Nothing is ``eval``-ed.

    python -m data_prep.recllmsim --data ../shared/data/raw/recllmsim    # counts and rejects
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

# the seven ratings of the LLM-user conversations and their scales (SOURCE.md)
RATING_SCALES = {
    "Preference Alignment": 2,
    "Role-Playing Completeness": 2,
    "Detail Level": 2,
    "Practical Usefulness": 2,
    "Diversity": 2,
    "Additional Preferences": 1,
    "Memorization": 1,
}
# One intent vocabulary for the three label sets that meet in the evaluation: the LLM users' single
# intent per turn, the real people's multi-label Chinese intents, and the simulator's actions
# (agents.converse maps its actions onto it). Published in docs/converse.md.
COMMON_INTENTS = ("recommend", "plan", "search", "evaluate", "other")
INTENT_MAP = {
    "Recommendation": "recommend",
    "Search & Recommendation": "recommend",
    "Planning": "plan",
    "Search": "search",
    "Others": "other",
    "推荐": "recommend",
    "规划": "plan",
    "评估": "evaluate",
    "其它": "other",
}
PROFILE_KEYS = (
    "gender",
    "age",
    "personality",
    "occupation",
    "daily_interests",
    "travel_habits",
    "dining_preferences",
    "spending_habits",
    "other_aspects",
)


@dataclass
class Turn:
    role: str  # user | assistant
    content: str
    content_zh: str | None = None  # the LLM-user conversations' Chinese translation
    intents: list[str] = field(default_factory=list)  # user turns: one (LLM users) or several (people)
    hallucination: bool | None = None  # assistant turns, where annotated

    def common_intents(self) -> list[str]:
        """The turn's intents in the common vocabulary (COMMON_INTENTS), each once, in label order."""
        return list(dict.fromkeys(INTENT_MAP[i] for i in self.intents))


@dataclass
class Conversation:
    source: str  # llm | human
    file: str  # relative to the data folder
    task: str
    persona: str  # llm: the preference id; human: the person's folder
    profile: dict | str  # human: the structured profile; llm: the written preference
    task_context: str
    turns: list[Turn]
    language: str  # en | zh: the language of ``content``
    ratings: dict[str, int] | None = None  # llm users
    questionnaire: dict[str, str] | None = None  # people: summary -> chosen option
    preference_summary: list[str] = field(default_factory=list)
    conflict: bool | None = None
    profile_zh: str | None = None  # llm users: the Chinese translations of the preference
    task_context_zh: str | None = None  # and of the task context


@dataclass
class Loaded:
    conversations: list[Conversation]
    rejects: list[dict]  # {"file", "reason"}
    counts: Counter


class BadRecord(ValueError):
    pass


def _need(record: dict, key: str, kind: type | tuple):
    if key not in record:
        raise BadRecord(f"missing field {key!r}")
    if not isinstance(record[key], kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise BadRecord(f"field {key!r} is {type(record[key]).__name__}, expected {names}")
    return record[key]


def _turns(history: list) -> list[Turn]:
    turns = []
    for number, raw in enumerate(history, start=1):
        if not isinstance(raw, dict):
            raise BadRecord(f"turn {number} is not an object")
        try:
            role = _need(raw, "role", str)
            content = _need(raw, "content", str)
        except BadRecord as err:
            raise BadRecord(f"turn {number}: {err}") from None
        if role not in ("user", "assistant"):
            raise BadRecord(f"turn {number}: role {role!r} is not user or assistant")
        turn = Turn(role, content, raw.get("content_zh"))
        if role == "user":
            intent = raw.get("intent")
            if isinstance(intent, str):
                turn.intents = [intent]
            elif isinstance(intent, list) and intent and all(isinstance(i, str) for i in intent):
                turn.intents = list(intent)
            else:
                raise BadRecord(
                    f"turn {number}: intent {intent!r} is neither a string nor a non-empty list of strings"
                )
            unknown = [i for i in turn.intents if i not in INTENT_MAP]
            if unknown:
                raise BadRecord(f"turn {number}: intent {unknown[0]!r} is not one of {sorted(INTENT_MAP)}")
        else:
            flag = raw.get("hallucination")
            if isinstance(flag, dict):  # LLM users: {"hallucination": bool, "memo": ...}
                flag = flag.get("hallucination")
            if isinstance(flag, str):  # people: 是 / 否
                flag = {"是": True, "否": False}.get(flag)
            turn.hallucination = flag if isinstance(flag, bool) else None
        turns.append(turn)
    if not any(t.role == "user" for t in turns):
        raise BadRecord("no user turn")
    return turns


def _llm_conversation(record: dict, file: str) -> Conversation:
    ratings = _need(record, "rating", dict)
    for name, top in RATING_SCALES.items():
        value = ratings.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
            raise BadRecord(f"rating {name!r} is {value!r}, expected a whole number in [0, {top}]")
    summary = record.get("preference_summary", [])
    if not isinstance(summary, list):
        raise BadRecord("field 'preference_summary' is not a list")
    return Conversation(
        source="llm",
        file=file,
        task=_need(record, "task", str),
        persona=str(_need(record, "preference_id", int)),
        profile=_need(record, "preference", str),
        task_context=_need(record, "task_context", str),
        turns=_turns(_need(record, "history", list)),
        language="en",
        ratings={name: ratings[name] for name in RATING_SCALES},
        preference_summary=[str(s) for s in summary],
        conflict=record.get("conflict") if isinstance(record.get("conflict"), bool) else None,
        profile_zh=record.get("preference_zh") if isinstance(record.get("preference_zh"), str) else None,
        task_context_zh=record.get("task_context_zh")
        if isinstance(record.get("task_context_zh"), str)
        else None,
    )


def _human_conversation(record: dict, file: str, person: str) -> Conversation:
    profile = _need(record, "profile", dict)
    missing = [key for key in PROFILE_KEYS if key not in profile]
    if missing:
        raise BadRecord(f"profile lacks {', '.join(missing)}")
    answers = {}
    for item in _need(record, "questionnaire", list):
        if not isinstance(item, dict) or not isinstance(item.get("summary"), str) or "option" not in item:
            raise BadRecord(f"questionnaire item {item!r} has no summary and option")
        answers[item["summary"]] = str(item["option"])
    return Conversation(
        source="human",
        file=file,
        task=_need(record, "task_type", str),
        persona=person,
        profile=profile,
        task_context=_need(record, "task_context", str),
        turns=_turns(_need(record, "history", list)),
        language="zh",
        questionnaire=answers,
    )


def load(root: str | Path) -> Loaded:
    """Both layouts under ``root``: every JSON file read, every unusable one reported."""
    root = Path(root)
    conversations, rejects, counts = [], [], Counter()
    files = [(p, "llm") for p in sorted((root / "LLM_agent_user").glob("*/*.json"))]
    files += [(p, "human") for p in sorted((root / "real_human_user").glob("*/*/*.json"))]
    if not files:
        raise SystemExit(
            f"error: no RecLLMSim conversations under {root} (LLM_agent_user/, real_human_user/)"
        )
    for path, source in files:
        file = str(path.relative_to(root))
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(record, dict):
                raise BadRecord(f"the file holds a {type(record).__name__}, not an object")
            if source == "llm":
                conversation = _llm_conversation(record, file)
            else:
                conversation = _human_conversation(record, file, path.parent.parent.name)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            rejects.append({"file": file, "reason": f"not JSON: {err}"})
            counts[f"rejected:{source}"] += 1
            continue
        except BadRecord as err:
            rejects.append({"file": file, "reason": str(err)})
            counts[f"rejected:{source}"] += 1
            continue
        conversations.append(conversation)
        counts[source] += 1
    return Loaded(conversations, rejects, counts)


def load_tag_dictionary(root: str | Path) -> dict[str, dict[str, str]]:
    """``user_profiling/desc_translated.json``: attribute -> {Chinese tag: English tag}."""
    path = Path(root) / "user_profiling" / "desc_translated.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(
        isinstance(tags, dict) and all(isinstance(v, str) for v in tags.values()) for tags in data.values()
    ):
        raise SystemExit(f"error: {path}: expected attribute -> {{Chinese tag: English tag}}")
    return data


_LINE = re.compile(r"^\s*\d+\.\s*([^:]+):\s*(.*)$")


def load_preference_pool(root: str | Path) -> tuple[list[dict[str, str]], list[dict]]:
    """The preference pool: profiles of numbered ``Key: value`` lines, separated by blank lines. A
    block with a line that is not ``N. Key: value`` is reported (block number and line), not loaded."""
    path = Path(root) / "RecUserSim" / "data" / "pool" / "preference_pool_en.txt"
    profiles, rejects = [], []
    blocks = [b for b in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")) if b.strip()]
    for number, block in enumerate(blocks, start=1):
        profile = {}
        for line in block.strip().splitlines():
            match = _LINE.match(line)
            if not match:
                rejects.append(
                    {"file": str(path), "block": number, "reason": f"not 'N. Key: value': {line!r}"}
                )
                profile = None
                break
            profile[match.group(1).strip()] = match.group(2).strip()
        if profile:
            profiles.append(profile)
    return profiles, rejects


def load_task_contexts(root: str | Path) -> dict[str, dict]:
    """The task-context templates: task type -> {"prompt": text with [SLOT]s, "slots": {SLOT: options}}.
    Needs openpyxl (the spreadsheet's reader)."""
    import openpyxl

    path = Path(root) / "RecUserSim" / "data" / "task_context_en.xlsx"
    sheet = openpyxl.load_workbook(path, read_only=True).worksheets[0]
    contexts: dict[str, dict] = {}
    current = None
    for number, row in enumerate(sheet.iter_rows(values_only=True), start=1):
        if number == 1 or not any(cell is not None for cell in row):
            continue
        kind, prompt, slot, *options = row
        if kind:
            current = contexts.setdefault(str(kind).strip(), {"prompt": str(prompt or ""), "slots": {}})
        if current is None or not slot:
            raise SystemExit(f"error: {path} row {number}: a slot row before any task type, or no slot name")
        current["slots"][str(slot).strip()] = [str(o) for o in options if o is not None]
    return contexts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="../shared/data/raw/recllmsim")
    args = parser.parse_args(argv)
    loaded = load(args.data)
    pool, pool_rejects = load_preference_pool(args.data)
    print(
        json.dumps(
            {
                "counts": dict(loaded.counts),
                "rejects": loaded.rejects[:20],
                "pool": len(pool),
                "pool_rejects": pool_rejects[:5],
                "task_contexts": sorted(load_task_contexts(args.data)),
                "tag_attributes": sorted(load_tag_dictionary(args.data)),
            },
            indent=1,
            ensure_ascii=False,
        )
    )


if __name__ == "__main__":
    main()
