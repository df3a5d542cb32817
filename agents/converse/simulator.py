"""The conversational user simulator (RecUserSim's design): each turn, Rating -> Action -> Response, then
the refinement tools; batched across the dialogues of a run.

- **Rating** (after every recommender message): a rationale first, then 1-5 for language quality and
  action quality and, when the recommender recommended something, recommendation quality = the
  objective score + a subjective modifier in [-1, +1] from the persona's traits (hesitant -0.5;
  exploratory +0.5 and conservative -0.5 when the recommendation is new to the persona), kept inside
  1-5 (how often that bound acted is counted). A recommendation outside the known preferences that
  fits well (``fit >= excitation_fit``) becomes a new preference with ``excitation_probability``
  (unknown-preference excitation; logged on the persona).
- **Action**: one or two of request_recommendation, clarify_preference, give_feedback,
  ask_attributes, end, with the action pattern's tendencies in the prompt. The conversation ends when
  the user chooses ``end``, at ``max_turns``, or when satisfaction stays under ``unhappy_below`` for
  ``patience`` rated turns in a row (decisive people have less patience). For a persona with a
  catalogue goal that satisfaction is the measured fit of each recommendation (``rating.patience_from:
  fit``, the default; the ratings while no recommended place is known), so the dialogue's course does
  not depend on the rating LLM; ``ratings`` uses the rated satisfaction. ``rating.enabled: false`` asks no rating at all (the objective figures alone).
- **Response**: from the persona, the dialogue, the satisfaction in words and the chosen actions, in
  the persona's language pattern.
- **Refinement**: each configured tool judges the message on its trait (a rule for message length;
  the LLM for formality and information richness) and, when the judged level is not the persona's,
  the LLM rewrites it toward that level; tools run in order and not on a closing message. Every
  judgement and rewrite is logged, and each trait's level is judged once more on the message as sent
  (``final``: what the evaluation reads).

Ratings, actions, judgements and messages are structured outputs; an unusable answer becomes a logged,
counted fallback (no rating; request_recommendation; a fixed message; no rewrite).

``replay`` rates every assistant turn of recorded conversations without changing them (how the
simulator's ratings are checked against people's).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np
from tqdm import tqdm

from agents.converse import goals
from agents.llm import Constraint, Sampling, choice_answer, count_usage, option_probs, read_choice
from data_prep.prompt import (  # noqa: F401 (the vocabulary, importable from here too)
    ACTION_INTENT,
    ACTION_TEXT,
    ACTIONS,
    TENDENCY,
    converse_action_prompt,
    converse_rating_prompt,
    converse_response_prompt,
    converse_transcript,
    satisfaction_words,
)

# every free string bounded (about 4 characters a token: 400 is about 100 tokens), so a rating written
# within config.rating_tokens is never lost to a loop
RATING = Constraint.json_object(
    rationale={"type": "string", "minLength": 1, "maxLength": 400},
    language_quality={"type": "integer", "minimum": 1, "maximum": 5},
    action_quality={"type": "integer", "minimum": 1, "maximum": 5},
    recommended={"type": "boolean"},
    recommendation_quality={"type": "integer", "minimum": 1, "maximum": 5},
    new_preference={"type": "string", "maxLength": 80},
    fit={"type": "integer", "minimum": 1, "maximum": 5},
)
# rating.read greedy / expected: the judgement written first, then each score read from probabilities
JUDGEMENT = Constraint.json_object(
    rationale={"type": "string", "minLength": 1, "maxLength": 400},
    recommended={"type": "boolean"},
    new_preference={"type": "string", "maxLength": 80},
)
SCORES = {  # each score's question, asked after the judgement
    "language_quality": "how well the assistant's last message is written",
    "action_quality": "how sensible the assistant's move is",
    "recommendation_quality": "how good its recommendation is for you (if it made none, how helpful it was)",
    "fit": "how well the new thing it suggested fits you (if none, how well its suggestion fits you)",
}
DIGITS = ["1", "2", "3", "4", "5"]
ACTION = Constraint.json_object(
    actions={"type": "array", "items": {"type": "string", "enum": ACTIONS}, "minItems": 1, "maxItems": 2}
)
FIRST_ACTION = Constraint.json_object(
    actions={
        "type": "array",
        "items": {"type": "string", "enum": ["request_recommendation", "clarify_preference", "ask_plan"]},
        "minItems": 1,
        "maxItems": 2,
    }
)
# no character caps: a message is bounded by config.message_tokens (a cut is counted as cut_short)
MESSAGE = Constraint.json_object(message={"type": "string", "minLength": 1})
FALLBACK_MESSAGE = "Could you suggest something?"


# the most tokens each kind of call may write, where the config does not set it
TOKENS = {"action": 40, "judge": 8, "questionnaire": 64}


@dataclass(frozen=True)
class Shown:
    """How much of a dialogue a prompt showed: ``turns`` of its ``of_turns`` turns (the oldest of them
    cut by tokens when ``cut`` is 1), and ``tokens`` of the ``of_tokens`` its whole transcript takes
    (None without a tokenizer)."""

    turns: int
    of_turns: int
    cut: int
    tokens: int | None
    of_tokens: int | None

    @property
    def whole(self) -> bool:
        return self.turns == self.of_turns and not self.cut


@dataclass(frozen=True)
class Questionnaire:
    """The simulator's answer to the people's questionnaire about one conversation: each item's place on
    its ordinal scale (a float when read as an expected value), or None when it could not be read; and
    what the prompts showed of the conversation."""

    answer: dict[str, float] | None
    shown: Shown
    # where the answer came from: "json" (written), or what the items' probabilities came from
    # ("logprobs"; "samples" where the backend gives none; several joined by "+")
    read_from: str


def decoding(config) -> dict:
    """How each kind of the simulated user's calls decodes (the run's record: summary.json): the
    temperature and token caps of the config, every other setting neutral (agents.llm.Sampling)."""
    caps = {
        "rating": config.rating_tokens,
        "response": config.message_tokens,
        "refine": config.message_tokens,
    }
    out = {
        kind: Sampling(
            tokens, config.rating.temperature if kind in ("rating", "questionnaire") else config.temperature
        ).settings()
        for kind, tokens in {**caps, **TOKENS}.items()
    }
    out["rating_scores"] = (
        {"read": config.rating.read, "from": "option probabilities"} if config.rating.read != "json" else None
    )
    out["questionnaire_items"] = (
        {"read": config.questionnaire_read, "from": "option probabilities"}
        if config.questionnaire_read != "json"
        else None
    )
    return out


def words_per_message(text: str) -> int:
    return len(text.split())


def known_preferences(persona) -> set[str]:
    """What the persona already likes (its preferences and those it adopted), lower case; empty in
    replay (no persona)."""
    if persona is None:
        return set()
    return {p.lower() for p in persona.preferences} | {a["preference"].lower() for a in persona.adopted}


class TurnLog(TypedDict, total=False):
    """One user turn, as ``turns.jsonl`` keeps it: ``UserSimulator.step`` writes the user's part,
    ``agents.converse.run`` adds the last four keys. A key is absent when its step did not run: no
    "rating" or "fit" on the first turn (no reply yet) and no "rating" with ratings off (a rating that
    was asked and lost is None); no "slot" when the agenda did not choose the act; no "adopted" without
    a new preference."""

    turn: int  # 1 for the user's first message
    rating: dict | None  # the user's judgement of the recommender's last reply
    fit: int | None  # a catalogue goal's measured fit of the best place that reply recommended
    actions: list[str]  # from ACTIONS; "end" closes the dialogue
    slot: str | None  # the goal's slot the agenda stated (city, cuisine, ...)
    ended: str | None  # User.ended after this turn ("crs_error" when the recommender failed to answer it)
    intent: str  # the first action in the common intent vocabulary (ACTION_INTENT)
    written_by: str  # "template" or "llm"
    refinements: list[dict]  # per tool: judged, target, final level, and before/after when rewritten
    message: str  # what the user said (template, LLM, or the fallback when the LLM's answer is unusable)
    adopted: dict  # a preference the user took up this turn (unknown-preference excitation)
    crs: str  # the recommender's name in the run
    dialogue: int  # the dialogue's number within the run
    persona: int  # Persona.id
    reply: dict | None  # the recommender's answer to this message (agents.converse.crs.Reply as a dict)


@dataclass
class User:
    """One simulated user in one dialogue."""

    persona: object  # agents.converse.profiles.Persona
    dialogue: list[tuple[str, str]] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)  # satisfaction per rated turn
    fits: list[float] = field(default_factory=list)  # a goal's measured fit per recommending turn
    ended: str | None = None  # why it ended: chosen | accepted | max_turns | impatient | crs_error
    stated: set[str] = field(default_factory=set)  # a goal's slots this user has stated (catalogue tasks)

    @property
    def turn(self) -> int:
        return sum(1 for role, _ in self.dialogue if role == "user")


class UserSimulator:
    def __init__(self, config, backend, rng: np.random.Generator, catalogue: list | None = None):
        """config: ConverseConfig; backend: a shared LLM backend; rng: the run's generator; catalogue:
        the restaurants (catalogue tasks: the objective fit of what a CRS recommends)."""
        self.config, self.backend, self.rng = config, backend, rng
        self.places = {r.id: r for r in catalogue or []}
        self.counts: Counter = Counter()
        # the backend's tokenizer measures the transcript (an openai backend has one when its config
        # names it); without one, turns are shown whole and the prompt is not fitted (counted)
        self.tokenizer = getattr(backend, "tokenizer", None)

    def generate(
        self, prompts: list[str], constraint: Constraint, kind: str, tokens: int = 160, temperature=None
    ) -> list[str]:
        if not prompts:
            return []
        heat = self.config.temperature if temperature is None else temperature
        sampling = Sampling(tokens, heat, 1.0, int(self.rng.integers(2**31 - 1)))
        self.counts[f"llm_calls:{kind}"] += len(prompts)
        self.counts["llm_batches"] += 1
        answers = self.backend.generate(
            [[{"role": "user", "content": p}] for p in prompts], sampling, constraint
        )
        # answers stopped by the token cap (their JSON is then incomplete: a fallback, counted as such too)
        self.counts[f"cut_short:{kind}"] += sum(a.cut_short for a in answers)
        count_usage(answers, self.counts)
        return [a.text for a in answers]

    def transcript(self, dialogue: list[tuple[str, str]]) -> str:
        """data_prep.prompt.converse_transcript with this run's settings; cuts counted (turns_cut,
        turns_left_out; transcripts_unmeasured without a tokenizer)."""
        return self.shown_transcript(dialogue)[0]

    def shown_transcript(self, dialogue: list[tuple[str, str]], measure: bool = False) -> tuple[str, Shown]:
        """``transcript`` with how much of the dialogue it shows (Shown; its tokens only when ``measure``:
        the whole dialogue is tokenised for it)."""
        text, cut, left_out = converse_transcript(
            dialogue, self.config.transcript_turns, self.config.transcript_tokens, self.tokenizer
        )
        self.counts["turns_cut"] += cut
        self.counts["turns_left_out"] += left_out
        self.counts["transcripts_unmeasured"] += self.tokenizer is None and bool(dialogue)
        tokens = of_tokens = None
        if measure and self.tokenizer is not None:
            whole = converse_transcript(dialogue, len(dialogue), 0)[0]  # every turn, whole
            tokens, of_tokens = (
                len(self.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in (text, whole)
            )
        turns = min(len(dialogue), self.config.transcript_turns) - left_out
        return text, Shown(turns, len(dialogue), cut, tokens, of_tokens)

    # -- rating -------------------------------------------------------------------------------------------
    def rate(self, items: list[dict]) -> list[dict | None]:
        """items: {"about": persona text, "task", "dialogue" (ending with the assistant's message),
        "recommended": True/False (the recommender says) or None (unknown: the LLM judges), "persona":
        a Persona for the subjective modifiers, or None (replay: no modifiers)}."""
        prompts = [
            converse_rating_prompt(item["about"], item["task"], self.transcript(item["dialogue"]))
            for item in items
        ]
        if self.config.rating.read == "json":
            written = self.generate(
                prompts, RATING, "rating", self.config.rating_tokens, self.config.rating.temperature
            )
            values = [RATING.parse(a) for a in written]
        else:
            values = self.read_scores(prompts)
        out = []
        for item, value in zip(items, values, strict=True):
            # value: every field present, of its type and in its range, or None
            if value is None:
                self.counts["fallback:rating"] += 1
                out.append(None)
                continue
            recommended = item["recommended"] if item["recommended"] is not None else value["recommended"]
            new = value["new_preference"].strip()
            rating = {
                "rationale": value["rationale"],
                "language_quality": value["language_quality"],
                "action_quality": value["action_quality"],
                "recommended": recommended,
                "recommendation_quality": None,
                "new_preference": new,
                "fit": value["fit"],
            }
            if recommended:
                objective = value["recommendation_quality"]
                if item.get("fit") is not None:  # a catalogue goal: the objective part is measured, not asked
                    rating["llm_objective"] = objective
                    objective = item["fit"]
                novel = bool(new) and new.lower() not in known_preferences(item["persona"])
                modifier = self.modifier(item["persona"], novel)
                raw = objective + modifier
                final = min(5.0, max(1.0, raw))
                self.counts["recommendation_quality_bounded"] += final != raw
                rating.update(objective=objective, modifier=modifier, recommendation_quality=final)
            out.append(rating)
        return out

    def read_scores(self, prompts: list[str]) -> list[dict | None]:
        """A rating whose judgement is written first (JUDGEMENT) and whose four scores are then read from
        the model's probabilities over 1-5 (``rating.read``: greedy or expected), each asked after the
        judgement; None where the judgement or a score could not be read (counted as fallbacks)."""
        written = self.generate(
            prompts, JUDGEMENT, "rating", self.config.rating_tokens, self.config.rating.temperature
        )
        judged = [JUDGEMENT.parse(a) for a in written]
        asked = [(k, key) for k, j in enumerate(judged) if j is not None for key in SCORES]
        question = "Now score {}, from 1 (very poor) to 5 (excellent). One digit."
        conversations = [
            [
                {"role": "user", "content": prompts[k]},
                {"role": "assistant", "content": json.dumps(judged[k])},
                {"role": "user", "content": question.format(SCORES[key])},
            ]
            for k, key in asked
        ]
        seed = int(self.rng.integers(2**31 - 1))
        answers = option_probs(self.backend, conversations, DIGITS, seed=seed) if conversations else []
        self.counts["llm_calls:rating_scores"] += len(conversations)
        count_usage(answers, self.counts)
        self.counts.update(f"rating_probs_from:{a.probs_from}" for a in answers)
        values = [dict(j) if j is not None else None for j in judged]
        for (k, key), answer in zip(asked, answers, strict=True):
            score = read_choice(answer, self.config.rating.read)
            if values[k] is not None and score is None:
                values[k] = None  # a score that could not be read: the whole rating is a fallback
            elif values[k] is not None:
                values[k][key] = score
        return values

    @staticmethod
    def modifier(persona, novel: bool) -> float:
        """The subjective modifier in [-1, +1] from the traits (0 without a persona)."""
        if persona is None:
            return 0.0
        value = -0.5 if persona.action["decisiveness"] == "hesitant" else 0.0
        if novel:
            value += 0.5 if persona.action["exploration"] == "exploratory" else -0.5
        return max(-1.0, min(1.0, value))

    # -- a turn ---------------------------------------------------------------------------------------------
    def step(self, users: list[User], replies: list) -> list[TurnLog]:
        """One user turn for each user: ``replies[i]`` is the recommender's last Reply (None before the
        first turn). Returns one log record per user, with the user's message (a closing one when it ends)."""
        logs: list[TurnLog] = [{"turn": u.turn + 1} for u in users]
        for user, reply in zip(users, replies, strict=True):
            if reply is not None:
                user.dialogue.append(("assistant", reply.text))
        rated = [i for i, r in enumerate(replies) if r is not None]
        items = [
            {
                "about": users[i].persona.describe(),
                "task": users[i].persona.task,
                "dialogue": users[i].dialogue,
                "recommended": self.says_recommended(replies[i]),
                "persona": users[i].persona,
                "fit": self.fit(users[i], replies[i]),
            }
            for i in rated
        ]
        ratings = self.rate(items) if self.config.rating.enabled else [None] * len(items)
        for i, item, rating in zip(rated, items, ratings, strict=True):
            if self.config.rating.enabled:  # with ratings off a turn has no "rating" (not a lost one)
                logs[i]["rating"] = rating
            logs[i]["fit"] = item["fit"]  # the objective part, kept if the rating fails
            if item["fit"] is not None:
                users[i].fits.append(float(item["fit"]))
            if rating is None:
                continue
            parts = [rating["language_quality"], rating["action_quality"]]
            if rating["recommendation_quality"] is not None:
                parts.append(rating["recommendation_quality"])
            users[i].scores.append(float(np.mean(parts)))
            self.excite(users[i], rating, logs[i])
        # actions: a catalogue goal's agenda decides (the act and its slot); the LLM chooses for the others
        agenda = {i: self.agenda(u, replies[i]) for i, u in enumerate(users) if u.persona.goal}
        free = [i for i in range(len(users)) if i not in agenda]
        prompts, constraints = [], []
        for user in (users[i] for i in free):
            persona = user.persona
            score = user.scores[-1] if user.scores else None
            prompts.append(
                converse_action_prompt(
                    persona.describe(),
                    persona.task,
                    f"{TENDENCY[persona.action['decisiveness']]} {TENDENCY[persona.action['exploration']]}",
                    self.transcript(user.dialogue),
                    satisfaction_words(score),
                    ACTIONS if user.dialogue else ACTIONS[:3],
                )
            )
            constraints.append(ACTION if user.dialogue else FIRST_ACTION)
        chosen_by_llm = dict(zip(free, self.actions(prompts, constraints), strict=True))
        actions = [[agenda[i][0]] if i in agenda else chosen_by_llm[i] for i in range(len(users))]
        for i, (user, chosen) in enumerate(zip(users, actions, strict=True)):
            logs[i]["actions"] = chosen
            if i in agenda:
                logs[i]["slot"] = agenda[i][1]
                if agenda[i][1]:
                    user.stated.add(agenda[i][1])
            streak = 0
            # a goal's measured fits, once a recommendation was known (a CRS whose places are not known:
            # the ratings, as for a persona without a goal)
            by_fit = self.config.rating.patience_from == "fit" and user.persona.goal and user.fits
            for score in reversed(user.fits if by_fit else user.scores):
                if score >= self.config.rating.unhappy_below:
                    break
                streak += 1
            if "end" in chosen:
                user.ended = "accepted" if i in agenda else "chosen"
            elif user.turn + 1 >= self.config.max_turns:
                user.ended = "max_turns"  # this turn is the last: its message closes
            elif streak >= self.config.rating.patience[user.persona.action["decisiveness"]]:
                user.ended = "impatient"
                logs[i]["actions"] = chosen = ["end"]
            logs[i]["ended"] = user.ended
        # responses: the template writes a goal's act where configured (text: template), the LLM the rest
        templated = {  # a user who ends without accepting closes by giving up, not by the agenda's act
            i: goals.template_message(
                users[i].persona.goal_of(),
                "give_up"
                if users[i].ended in ("max_turns", "impatient") and agenda[i][0] != "end"
                else agenda[i][0],
                agenda[i][1],
                not users[i].dialogue,
            )
            for i in agenda
            if self.config.user_text == "template"
        }
        self.counts["template_messages"] += len(templated)
        prompts, asked = [], [i for i in range(len(users)) if i not in templated]
        for user, log in ((users[i], logs[i]) for i in asked):
            persona = user.persona
            wanted = "; ".join(ACTION_TEXT[a] for a in log["actions"])
            if log.get("slot"):
                wanted += f": say that you want something {persona.goal_of().slot_text(log['slot'])}"
            prompts.append(
                converse_response_prompt(
                    persona.describe(),
                    persona.task,
                    persona.style(),
                    self.transcript(user.dialogue),
                    satisfaction_words(user.scores[-1] if user.scores else None),
                    wanted,
                    closing=bool(user.ended),
                )
            )
        written = {}
        for i, answer in zip(
            asked, self.generate(prompts, MESSAGE, "response", self.config.message_tokens), strict=True
        ):
            value = MESSAGE.parse(answer)
            if value is None or not value["message"].strip():
                self.counts["fallback:response"] += 1
                written[i] = FALLBACK_MESSAGE
            else:
                written[i] = value["message"].strip()
        messages = [templated.get(i, written.get(i)) for i in range(len(users))]
        for i, log in enumerate(logs):
            log["intent"] = ACTION_INTENT[log["actions"][0]]
            log["written_by"] = "template" if i in templated else "llm"
        messages = self.refine(users, messages, logs, skip=set(templated))
        for user, log, message in zip(users, logs, messages, strict=True):
            user.dialogue.append(("user", message))
            log["message"] = message
        return logs

    @staticmethod
    def says_recommended(reply) -> bool | None:
        """Whether the reply recommended something: the CRS's ids say so; None (the rating LLM judges) when
        the CRS gave no ids, or when names were matched and none was found (it may have named a place
        outside the catalogue)."""
        if reply.recommended is None or (
            getattr(reply, "matched_by", "items") == "names" and not reply.recommended
        ):
            return None
        return bool(reply.recommended)

    def recommended_places(self, reply) -> list:
        """The catalogue places a reply recommended (none when the CRS does not say)."""
        ids = (reply.recommended or []) if reply is not None else []
        return [self.places[i] for i in ids if i in self.places]

    def fit(self, user: User, reply) -> int | None:
        """A catalogue goal's objective fit of the best place the reply recommended (None: no goal, or
        nothing known to be recommended)."""
        places = self.recommended_places(reply)
        if not user.persona.goal or not places:
            return None
        goal = user.persona.goal_of()
        return max(goals.objective_fit(goal, p) for p in places)

    def agenda(self, user: User, reply) -> tuple[str, str | None]:
        return goals.next_act(user.persona.goal_of(), user.stated, self.recommended_places(reply) or None)

    def actions(self, prompts: list[str], constraints: list[Constraint]) -> list[list[str]]:
        out: list[list[str] | None] = [None] * len(prompts)
        for constraint in dict.fromkeys(constraints):  # one batch per constraint (first turns differ)
            index = [k for k, c in enumerate(constraints) if c == constraint]
            answers = self.generate([prompts[k] for k in index], constraint, "action", TOKENS["action"])
            for k, answer in zip(index, answers, strict=True):
                value = constraint.parse(answer)
                if value is None:
                    self.counts["fallback:action"] += 1
                    value = {"actions": ["request_recommendation"]}
                out[k] = list(dict.fromkeys(value["actions"]))
        return out

    def excite(self, user: User, rating: dict, log: TurnLog) -> None:
        """Unknown-preference excitation: a well-fitting new suggestion may become a preference."""
        new = rating["new_preference"]
        if not (rating["recommended"] and new) or rating["fit"] < self.config.rating.excitation_fit:
            return
        known = {p.lower() for p in user.persona.preferences} | {
            a["preference"].lower() for a in user.persona.adopted
        }
        if new.lower() in known:
            return
        if self.rng.random() < self.config.rating.excitation_probability:
            adopted = {"preference": new, "turn": user.turn + 1, "fit": rating["fit"]}
            user.persona.adopted.append(adopted)
            log["adopted"] = adopted
            self.counts["adopted_preferences"] += 1

    # -- refinement -----------------------------------------------------------------------------------------
    def refine(
        self, users: list[User], messages: list[str], logs: list[TurnLog], skip=frozenset()
    ) -> list[str]:
        """Each tool in order: judge every open message, rewrite those off the persona's level (not the
        template's messages, ``skip``: the template states facts, not a style)."""
        messages = list(messages)
        for log in logs:
            log["refinements"] = []
        if not self.config.refinement.enabled:
            return messages
        for tool in self.config.refinement.tools:
            levels = list(self.config.priors.language[tool.trait])
            open_ = [i for i, u in enumerate(users) if not u.ended and i not in skip]  # not a closing message
            judged = self.judge(tool, [messages[i] for i in open_], levels)
            targets = [users[i].persona.language.get(tool.trait) for i in open_]
            redo = [
                (i, level, target)
                for i, level, target in zip(open_, judged, targets, strict=True)
                if level is not None and target is not None and level != target
            ]
            prompts = [
                f"Rewrite this message so that its {tool.trait.replace('_', ' ')} is {target} instead of {level}. "
                f"Keep its meaning and write only the message.\nMessage: {messages[i]}"
                for i, level, target in redo
            ]
            rewritten = self.generate(prompts, MESSAGE, f"refine:{tool.name}", self.config.message_tokens)
            done = {}
            for (i, level, target), answer in zip(redo, rewritten, strict=True):
                value = MESSAGE.parse(answer)
                if value is None or not value["message"].strip():
                    self.counts["fallback:refine"] += 1
                    continue
                done[i] = (level, target, value["message"].strip())
            for i, level in zip(open_, judged, strict=True):
                entry = {
                    "tool": tool.name,
                    "judged": level,
                    "target": users[i].persona.language.get(tool.trait),
                }
                if i in done:
                    entry.update(before=messages[i], after=done[i][2])
                    messages[i] = done[i][2]
                logs[i]["refinements"].append(entry)
        # the level of what is finally sent, per trait: every tool judges the final message again (a later
        # tool's rewrite can change an earlier tool's trait)
        open_ = [i for i, u in enumerate(users) if not u.ended and i not in skip]
        for tool in self.config.refinement.tools:
            levels = list(self.config.priors.language[tool.trait])
            for i, level in zip(open_, self.judge(tool, [messages[i] for i in open_], levels), strict=True):
                next(e for e in logs[i]["refinements"] if e["tool"] == tool.name)["final"] = level
        return messages

    def judge(self, tool, messages: list[str], levels: list[str]) -> list[str | None]:
        if tool.judge == "rule":
            low, high = tool.thresholds
            out = []
            for message in messages:
                words = words_per_message(message)
                out.append(
                    levels[0] if words < low else levels[-1] if words > high else levels[len(levels) // 2]
                )
            return out
        prompts = [
            f"{tool.question}\nMessage: {m}\nAnswer with one of: {', '.join(levels)}" for m in messages
        ]
        answers = self.generate(prompts, Constraint.choice(levels), f"judge:{tool.name}", TOKENS["judge"])
        out = []
        for answer in answers:
            if answer.strip() in levels:
                out.append(answer.strip())
            else:
                self.counts["fallback:judge"] += 1
                out.append(None)
        return out

    # -- replay -------------------------------------------------------------------------------------------------
    def questionnaire(self, conversations: list[dict]) -> list[Questionnaire]:
        """conversations as for ``replay``: each whole conversation answered with RecLLMSim's questionnaire
        for the real people (data_prep.prompt.QUESTIONNAIRE_ITEMS), each item as its place on the item's
        ordinal scale, read as ``questionnaire_read`` says; with what the prompts showed of it. An
        unusable answer is None (counted: fallback:questionnaire)."""
        shown = [self.shown_transcript(c["turns"], measure=True) for c in conversations]
        texts = [text for text, _ in shown]
        if self.config.questionnaire_read == "json":
            answers = self.questionnaire_json(conversations, texts)
            sources = ["json"] * len(answers)
        else:
            answers, sources = self.questionnaire_probs(conversations, texts)
        self.counts["fallback:questionnaire"] += sum(a is None for a in answers)
        return [
            Questionnaire(a, s, source) for a, (_, s), source in zip(answers, shown, sources, strict=True)
        ]

    def questionnaire_json(self, conversations: list[dict], texts: list[str]) -> list[dict | None]:
        """All four items in one JSON object (one option per item), at the judgement's temperature."""
        from data_prep.prompt import QUESTIONNAIRE_ITEMS, converse_questionnaire_prompt

        schema = Constraint.json_object(
            **{
                name: {"type": "string", "enum": list(options)}
                for name, (_, options) in QUESTIONNAIRE_ITEMS.items()
            }
        )
        prompts = [
            converse_questionnaire_prompt(c["about"], c["task"], text)
            for c, text in zip(conversations, texts, strict=True)
        ]
        out = []
        for start in tqdm(range(0, len(prompts), 32), desc="questionnaires", unit=" x32", leave=False):
            for answer in self.generate(
                prompts[start : start + 32],
                schema,
                "questionnaire",
                TOKENS["questionnaire"],
                self.config.rating.temperature,
            ):
                value = schema.parse(answer)
                out.append(
                    None
                    if value is None
                    else {name: QUESTIONNAIRE_ITEMS[name][1][value[name]] for name in QUESTIONNAIRE_ITEMS}
                )
        return out

    def questionnaire_probs(
        self, conversations: list[dict], texts: list[str]
    ) -> tuple[list[dict | None], list[str]]:
        """The questionnaire with each item's options numbered by their place on its scale, and each
        item read from the model's probabilities over its digits after the answer's beginning
        "{item}: " (expected or greedy): no digit decided by a first token written before the rest.
        An ``hf`` backend scores every item's lines ("Detail: 0", "Detail: 1", ...) in one prompt pass;
        each item's lines are then normalised among themselves, which leaves the probability of each
        digit after "{item}: ". Other backends read each item's digit after the answer's beginning
        "{item}: " (four calls). A backend that cannot continue an answer gives none, and the answer is
        unusable, counted (the replay refuses such a backend before it starts: use
        ``questionnaire_read: json`` there). Returns the answers and where each
        one's probabilities came from."""
        from data_prep.prompt import QUESTIONNAIRE_ITEMS, converse_questionnaire_digits_prompt

        lines = {
            name: [f"{name}: {v}" for v in sorted(options.values())]
            for name, (_, options) in QUESTIONNAIRE_ITEMS.items()
        }
        chats = [
            [{"role": "user", "content": converse_questionnaire_digits_prompt(c["about"], c["task"], t)}]
            for c, t in zip(conversations, texts, strict=True)
        ]
        # shortest first: prompts batched with others of their length carry less padding
        order = sorted(range(len(chats)), key=lambda k: len(chats[k][0]["content"]))
        seed = int(self.rng.integers(2**31 - 1))
        if hasattr(self.backend, "score"):  # hf: one prompt pass scores every item's lines
            calls = {None: [line for item in lines.values() for line in item]}
        else:  # each item's digit after its beginning: one-token options (vllm; openai with vllm fields)
            calls = {name: [str(v) for v in range(len(item))] for name, item in lines.items()}
        probs: list[dict] = [{} for _ in chats]  # item line -> probability
        sources: list[set[str]] = [set() for _ in chats]
        for name, options in calls.items():
            prefix = "" if name is None else f"{name}: "
            scored = option_probs(self.backend, [chats[k] for k in order], options, seed=seed, prefix=prefix)
            self.counts["llm_calls:questionnaire"] += len(chats)
            count_usage(scored, self.counts)
            for k, answer in zip(order, scored, strict=True):
                sources[k].add(answer.probs_from or "unknown")
                self.counts[f"questionnaire_probs_from:{answer.probs_from}"] += 1
                for option, p in (answer.probs or {}).items():
                    probs[k][option if name is None else f"{name}: {option}"] = p
        out: list[dict | None] = []
        for k in range(len(chats)):
            values = {}
            for name, item in lines.items():
                mass = [probs[k].get(line, 0.0) for line in item]
                if sum(mass) <= 0:  # no probabilities, or no sampled answer for this item: unusable
                    values = None
                    break
                digits = [str(v) for v in range(len(item))]
                choice = choice_answer(digits, [m / sum(mass) for m in mass], "logprobs")
                values[name] = read_choice(choice, self.config.questionnaire_read)
            out.append(values)
        return out, ["+".join(sorted(x)) for x in sources]

    def replay(self, conversations: list[dict]) -> list[list[dict | None]]:
        """conversations: {"about": persona text, "task", "turns": [(role, text)]}. Every assistant turn
        rated with the dialogue up to it, in batches of 32; the dialogues are not changed. The recommender's
        recommendations are unknown here: the LLM judges whether one was made; no trait modifiers."""
        items, where = [], []
        for c, conversation in enumerate(conversations):
            for t, (role, _) in enumerate(conversation["turns"]):
                if role == "assistant":
                    items.append(
                        {
                            "about": conversation["about"],
                            "task": conversation["task"],
                            "dialogue": conversation["turns"][: t + 1],
                            "recommended": None,
                            "persona": None,
                        }
                    )
                    where.append(c)
        out: list[list] = [[] for _ in conversations]
        ratings: list[dict | None] = []
        chunk = 32  # batched calls of this many turns, for the progress bar
        for start in tqdm(range(0, len(items), chunk), desc="replayed turns", unit=f" x{chunk}", leave=False):
            ratings += self.rate(items[start : start + chunk])
        for c, rating in zip(where, ratings, strict=True):
            out[c].append(rating)
        return out
