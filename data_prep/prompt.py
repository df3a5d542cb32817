"""The one prompt renderer: (user, history, item, item reviews) -> chat messages, and the completion
format with its parser. Training pairs (data_prep.pairs), fine-tuning (train.sft) and the agents all
import this module; there is no second copy of the prompt anywhere.

Only what a predictor may see goes in: the reviews it is given (callers pass reviews strictly older
than the target, with evaluation pairs blocked) and profile fields that do not aggregate over the
user's or item's whole history (Yelp's ``average_stars``, ``review_count`` and item ``stars`` include
the held-out review, so they are left out; averages over the shown reviews are given instead).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

# short, so the user's own reviews have room: at the demo's 256 tokens every token of the frame is one
# the user's reviews cannot have
SYSTEM = (
    "You are this user. Write your stars (1-5) and review of the item, in your own voice, in this "
    "format:\nstars: <1-5>\nreview: <the review text>"
)
MAX_REVIEW_CHARS = 400  # each review shown in a prompt is cut here, marked with "…"

USER_FIELDS = ("name", "yelping_since")  # not aggregates over the user's history
ITEM_FIELDS = ("name", "title", "city", "state", "categories", "category", "main_cat", "brand", "price")


def _short(text: str, limit: int = MAX_REVIEW_CHARS) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _stars(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _field(value) -> str:
    return ", ".join(map(str, value)) if isinstance(value, list) else str(value)


def describe_item(item: dict | None) -> str:
    if not item:
        return "(no description)"
    lines = [f"{key}: {_short(_field(item[key]), 200)}" for key in ITEM_FIELDS if item.get(key)]
    description = item.get("description")
    if description:
        lines.append(f"description: {_short(_field(description), 300)}")
    return "\n".join(lines) or "(no description)"


def _review_lines(reviews: list[dict]) -> str:
    return "\n".join(f"- {_stars(r['stars'])} stars: {_short(r['text'])}" for r in reviews)


def _mean(reviews: list[dict]) -> str:
    return f"{sum(r['stars'] for r in reviews) / len(reviews):.2f}"


def build_messages(
    user: dict | None,
    user_reviews: list[dict],
    item: dict | None,
    item_reviews: list[dict],
    left_out: int = 0,
) -> list[dict]:
    """System + user messages for one (user, item): the user first, then the item. Reviews are shown
    in the order given (the callers give them oldest first: the last is the latest). ``left_out``: how
    many of the user's reviews were left out to fit, so a prompt never claims none are known."""
    profile = [f"{k}: {user[k]}" for k in USER_FIELDS if user and user.get(k)]
    parts = ["# The user"]
    parts += profile
    if user_reviews:
        latest = "latest review" if len(user_reviews) == 1 else f"{len(user_reviews)} latest reviews"
        parts.append(f"Their {latest} (average {_mean(user_reviews)} stars):")
        parts.append(_review_lines(user_reviews))
    elif left_out:
        parts.append(f"Their {left_out} past review{'s' * (left_out != 1)} did not fit here.")
    else:
        parts.append("No past reviews are known.")
    parts += ["", "# The item", describe_item(item)]
    if item_reviews:
        parts.append(f"What {len(item_reviews)} other users wrote (average {_mean(item_reviews)} stars):")
        parts.append(_review_lines(item_reviews))
    parts += ["", "Your stars and review of this item:"]
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(parts)}]


# -- the conversational user simulator's prompts (agents/converse/simulator.py; the training pairs of
# data_prep.converse_pairs are built from the same functions, so the tuned model sees what it is used with)
ACTIONS = [
    "request_recommendation",
    "clarify_preference",
    "ask_plan",
    "give_feedback",
    "ask_attributes",
    "end",
]
ACTION_TEXT = {
    "request_recommendation": "ask for a (new) recommendation",
    "clarify_preference": "tell the assistant more about what you want",
    "ask_plan": "ask the assistant to plan it with you (the steps, a schedule, an itinerary)",
    "give_feedback": "say what you think of the last suggestion",
    "ask_attributes": "ask about details of a suggested place (price, dishes, atmosphere)",
    "end": "end the conversation (you have decided, or you give up)",
}
# the simulator's actions in the common intent vocabulary (data_prep.recllmsim.COMMON_INTENTS)
ACTION_INTENT = {
    "request_recommendation": "recommend",
    "clarify_preference": "other",
    "ask_plan": "plan",
    "give_feedback": "evaluate",
    "ask_attributes": "search",
    "end": "other",
}
TENDENCY = {
    "decisive": "You decide quickly: once a suggestion fits, you end the conversation.",
    "hesitant": "You take your time: you ask about details and compare before deciding.",
    "exploratory": "You are open to suggestions you would not have thought of.",
    "conservative": "You prefer what you already know you like.",
}


def satisfaction_words(score: float | None) -> str:
    if score is None:
        return "You have not heard from the assistant yet."
    if score >= 4.5:
        return "You are delighted with the assistant so far."
    if score >= 3.5:
        return "You are satisfied with the assistant so far."
    if score >= 2.5:
        return "You are lukewarm about the assistant so far."
    return "You are frustrated with the assistant."


def converse_transcript(
    dialogue: list[tuple[str, str]], turns: int, budget: int, tokenizer=None, keep_newest: bool = True
) -> tuple[str, int, int]:
    """The last ``turns`` turns ("You: ..." / "Assistant: ..."), whole while they fit ``budget`` tokens
    together, newest first; the newest (the message being rated or answered) always whole unless
    ``keep_newest`` is off (training pairs under a fixed budget). The first turn that does not fit is cut
    by tokens and marked "…", and older turns are left out. Returns the text, the turns cut (0 or 1) and
    the turns left out. Without a tokenizer every turn is whole."""
    lines = [
        f"{'You' if r == 'user' else 'Assistant'}: {' '.join(str(t).split())}" for r, t in dialogue[-turns:]
    ]
    if tokenizer is None:
        return "\n".join(lines), 0, 0
    kept, cut, left_out = [], 0, 0
    for k in range(len(lines) - 1, -1, -1):
        ids = tokenizer(lines[k], add_special_tokens=False)["input_ids"]
        if (keep_newest and k == len(lines) - 1) or len(ids) <= budget:
            kept.append(lines[k])
            budget -= len(ids)
            continue
        if budget > 0:
            kept.append(tokenizer.decode(ids[:budget]).rstrip() + "…")
            cut, left_out = 1, k
        else:  # no room left even for a cut: this turn is left out with the older ones
            left_out = k + 1
        break
    return "\n".join(reversed(kept)), cut, left_out


# RecLLMSim's questionnaire for the real people (English wording of its Chinese items), with each answer's
# place on the ordinal scale eval.converse uses (higher is better; for Memorization "yes, it forgot" is 0)
QUESTIONNAIRE_ITEMS = {
    "Memorization": (
        "During the conversation, did the assistant forget something said earlier?",
        {"yes": 0, "no": 1},
    ),
    "Detail": (
        "Overall, how detailed were the assistant's descriptions of each option (a dish, a destination)?",
        {"brief": 0, "average": 1, "detailed": 2},
    ),
    "Availability": (
        "Overall, how much would the assistant's answers help you with a similar problem in real life?",
        {"not usable": 0, "some reference": 1, "very useful": 2},
    ),
    "Diversity": (
        "How diverse were the assistant's answers over the whole conversation?",
        {"single": 0, "average": 1, "diverse": 2},
    ),
}


def converse_questionnaire_prompt(about: str, task: str, transcript: str) -> str:
    """The whole questionnaire, answered as one JSON object (the simulator's ``questionnaire_read: json``)."""
    items = "\n".join(
        f"{name}: {question} ({' / '.join(options)})"
        for name, (question, options) in QUESTIONNAIRE_ITEMS.items()
    )
    return (
        f"{about}\nYour task: {task}\nYour conversation with the assistant:\n{transcript}\n"
        f"Now fill in the questionnaire about the assistant, as yourself:\n{items}"
    )


def converse_questionnaire_digits_prompt(about: str, task: str, transcript: str) -> str:
    """The whole questionnaire, each item's options numbered by their place on the item's scale; the
    answer is one line per item ("Detail: 2"), each item's digit read from the model's probabilities
    (the simulator's ``questionnaire_read: expected`` or ``greedy``)."""
    items = "\n".join(
        f"{name}: {question} "
        + ", ".join(f"{value}: {text}" for text, value in sorted(options.items(), key=lambda o: o[1]))
        for name, (question, options) in QUESTIONNAIRE_ITEMS.items()
    )
    return (
        f"{about}\nYour task: {task}\nYour conversation with the assistant:\n{transcript}\n"
        "Now fill in the questionnaire about the assistant, as yourself. Answer each item with the number "
        f"of your choice, one line each (item: number):\n{items}"
    )


def converse_rating_prompt(about: str, task: str, transcript: str) -> str:
    return (
        f"{about}\nYour task: {task}\n{transcript}\n"
        "Rate the assistant's last message. First explain your rating in one or two sentences, then score "
        "1-5 how well it is written (language_quality), how sensible its move is (action_quality), "
        "whether it recommended something specific (recommended) and how good that recommendation is "
        "for you (recommendation_quality), and name any new thing it suggested that you had not "
        "thought of (new_preference, empty if none) with how well it fits you (fit). Every score runs from "
        "1 (very poor: useless or wrong for you) through 3 (acceptable) to 5 (excellent: exactly what you "
        "need)."
    )


def converse_action_prompt(
    about: str, task: str, tendencies: str, transcript: str, satisfaction: str, options: list[str]
) -> str:
    listing = "\n".join(f"{a}: {ACTION_TEXT[a]}" for a in options)
    return (
        f"{about}\nYour task: {task}\n{tendencies}\n{transcript}\n"
        f"{satisfaction}\nWhat do you do next? Choose one or two:\n{listing}"
    )


def converse_response_prompt(
    about: str, task: str, style: str, transcript: str, satisfaction: str, wanted: str, closing: bool = False
) -> str:
    end = " This is your last message: close the conversation." if closing else ""
    return (
        f"{about}\nYour task: {task}\n{style}\n{transcript}\n{satisfaction}\n"
        f"Write your next message to the assistant. In it you {wanted}.{end}"
    )


def render_prompt(tokenizer, messages: list[dict]) -> str:
    """The exact text the model sees: the tokenizer's chat template with the generation prompt. A
    conversation that ends with an assistant message gives the answer's beginning: the model continues
    it (the chat template's ``continue_final_message``), so its answer is what comes after."""
    if messages and messages[-1]["role"] == "assistant":
        return tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def answer_beginning(stars: float) -> str:
    """The answer's beginning when the stars are decided first: the renderer's format up to the review,
    which the model then writes (in training the review follows the real stars the same way). The
    stars are written as the whole number nearest the decided ones, as the format writes them."""
    return f"stars: {_stars(min(5.0, max(1.0, math.floor(stars + 0.5))))}\nreview:"


def training_prompt(tokenizer, messages: list[dict]) -> str:
    """render_prompt as TRL must get it for training. TRL tokenizes a text prompt with the tokenizer's
    special tokens; where the tokenizer adds BOS itself and the chat template also writes it (Llama 3),
    the written one is dropped, so training sees one BOS, as the served prompt has (tested per
    tokenizer family in tests/test_tokenization.py)."""
    text = render_prompt(tokenizer, messages)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and tokenizer("")["input_ids"][:1] == [tokenizer.bos_token_id]:
        text = text[len(bos) :]
    return text


def count_tokens(tokenizer, messages: list[dict], completion: str = "") -> int:
    """Tokens of the rendered prompt plus, when given, the completion and EOS (as training sees them)."""
    text = render_prompt(tokenizer, messages) + (completion + tokenizer.eos_token if completion else "")
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


MIN_REVIEW_TOKENS = 24  # a review is cut to no fewer tokens than this before reviews are dropped
MIN_DESCRIPTION_TOKENS = 16  # the item's description likewise (it goes with the item's other text)
# the item's fields in the order they go when nothing else is left to cut (the name or title last)
ITEM_FIELDS_LAST_KEPT = (
    "price",
    "brand",
    "main_cat",
    "category",
    "categories",
    "state",
    "city",
    "name",
    "title",
)


@dataclass
class FittedPrompt:
    """A prompt fitted to its token budget (fit_messages): the messages, the reviews it shows (texts as
    shown, cuts marked "…"), what was cut or dropped in order, and the tokens each part took."""

    messages: list[dict]
    user_reviews: list[dict]
    item_reviews: list[dict]
    cuts: list[str] = field(default_factory=list)
    tokens: dict[str, int] = field(default_factory=dict)

    @property
    def shown(self) -> str:
        """How many of the user's reviews the prompt shows: 0, 1 or 2+ (what the cards count)."""
        return "2+" if len(self.user_reviews) >= 2 else str(len(self.user_reviews))


def cut_to_tokens(tokenizer, text: str, keep: int) -> str:
    """The text's first ``keep`` tokens, marked "…" where anything was cut ("" for none)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if keep >= len(ids):
        return text
    return tokenizer.decode(ids[: max(keep, 0)]).rstrip() + "…" if keep > 0 else ""


def _length(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fit_messages(
    tokenizer,
    user: dict | None,
    user_reviews: list[dict],
    item: dict | None,
    item_reviews: list[dict],
    budget: int,
    completion: str = "",
) -> FittedPrompt:
    """build_messages fitted to ``budget`` tokens (the prompt, and the completion with EOS when given),
    the user's reviews kept longest. Text is cut by tokens before any review is dropped, every cut
    marked "…": (1) the item's description; (2) the longest shown review, again and again, down to
    MIN_REVIEW_TOKENS; then (3) the item's reviews are dropped, oldest first; (4) the user's, oldest
    first, down to one; (5) the item's description and fields, the name or title last; (6) the user's last review is cut
    further, and dropped only when nothing else is left. Raises ValueError when even that does not fit."""
    user_reviews, item_reviews = [dict(r) for r in user_reviews], [dict(r) for r in item_reviews]
    for r in user_reviews + item_reviews:  # as shown: one line, at most MAX_REVIEW_CHARS
        r["text"] = _short(r["text"])
    item = dict(item) if item else item
    cuts: list[str] = []
    given = len(user_reviews)

    def messages() -> list[dict]:
        return build_messages(user, user_reviews, item, item_reviews, left_out=given - len(user_reviews))

    def size() -> int:
        return count_tokens(tokenizer, messages(), completion)

    total = size()

    def over() -> int:
        return total - budget

    if over() > 0 and item and item.get("description"):  # (1) the item's description
        text = _short(_field(item["description"]), 300)
        keep = max(MIN_DESCRIPTION_TOKENS, _length(tokenizer, text) - over() - 2)
        item["description"] = cut_to_tokens(tokenizer, text, keep)
        if item["description"] != text:
            cuts.append("item description")
            total = size()
    for _ in range(64):  # (2) the longest review, down to MIN_REVIEW_TOKENS (bounded: each cut shortens)
        if over() <= 0:
            break
        lengths = [(_length(tokenizer, r["text"]), k) for k, r in enumerate(item_reviews + user_reviews)]
        lengths = [(n, k) for n, k in lengths if n > MIN_REVIEW_TOKENS]
        if not lengths:
            break
        n, k = max(lengths, key=lambda x: (x[0], -x[1]))  # ties: the item's, then the older
        second = max([m for m, j in lengths if j != k], default=0)
        keep = max(MIN_REVIEW_TOKENS, n - over() - 2)
        if keep < second < n:  # no shorter than the next longest: the cut is shared out
            keep = second
        review = (item_reviews + user_reviews)[k]
        review["text"] = cut_to_tokens(tokenizer, review["text"], min(keep, n - 2))
        cuts.append("item review" if k < len(item_reviews) else "user review")
        total = size()
    while over() > 0 and item_reviews:  # (3) the item's reviews, oldest first
        item_reviews.pop(0)
        cuts.append("item review dropped")
        total = size()
    while over() > 0 and len(user_reviews) > 1:  # (4) the user's, oldest first, down to one
        user_reviews.pop(0)
        cuts.append("user review dropped")
        total = size()
    for key in ("description", *ITEM_FIELDS_LAST_KEPT):  # (5) the item's text, the name or title last
        if over() <= 0 or not item:
            break
        if item.get(key):
            item.pop(key)
            cuts.append(f"item {key} dropped")
            total = size()
    while over() > 0 and user_reviews:  # (6) the user's last review: cut, then dropped
        review = user_reviews[0]
        n = _length(tokenizer, review["text"])
        shorter = cut_to_tokens(tokenizer, review["text"], min(max(4, n - over() - 2), n - 2))
        if n <= 6 or _length(tokenizer, shorter) >= n:  # nothing left to cut (every cut must shorten)
            user_reviews.pop()
            cuts.append("user review dropped")
        else:
            review["text"] = shorter
            cuts.append("user review")
        total = size()
    if over() > 0:
        raise ValueError(f"does not fit in {budget} tokens even without reviews or item text")
    parts = {
        "user_reviews": _length(tokenizer, _review_lines(user_reviews)) if user_reviews else 0,
        "item": _length(tokenizer, describe_item(item)),
        "item_reviews": _length(tokenizer, _review_lines(item_reviews)) if item_reviews else 0,
        "completion": _length(tokenizer, completion + tokenizer.eos_token) if completion else 0,
    }
    tokens = {"total": total, "frame": total - sum(parts.values()), **parts}
    return FittedPrompt(messages(), user_reviews, item_reviews, cuts, tokens)


def format_completion(stars: float, review: str) -> str:
    return f"stars: {_stars(stars)}\nreview: {review.strip()}"


_NUMBERS = {"zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "ten": 10}
_STARS = re.compile(r"(?:stars?|rating)\s*[:=]\s*\**\s*([0-9]+(?:\.[0-9]+)?|[a-z]+)", re.IGNORECASE)
_WORD_STARS = re.compile(
    r"\b([0-9]+(?:\.[0-9]+)?|" + "|".join(_NUMBERS) + r")\s*(?:out of 5\s*)?stars?\b", re.IGNORECASE
)
_REVIEW = re.compile(r"review\s*[:=]\s*(.*)", re.IGNORECASE | re.DOTALL)


def _number(token: str) -> float | None:
    token = token.lower()
    if token in _NUMBERS:
        return float(_NUMBERS[token])
    try:
        return float(token)
    except ValueError:
        return None


def parse_completion(text: str) -> tuple[float | None, str | None]:
    """(stars, review) from a model's answer; None for a part that is missing or unreadable.
    Accepts "stars: 4", "stars: four", "rating: 4.5", "4 stars", "four stars". Stars outside 1-5 are
    returned as they are: the caller decides (and counts) what to do."""
    match = _STARS.search(text) or _WORD_STARS.search(text)
    stars = _number(match.group(1)) if match else None
    review_match = _REVIEW.search(text)
    review = review_match.group(1) if review_match else None
    if review is not None:  # small models sometimes start the format again: keep the first answer
        review = re.split(r"\n\s*(?:stars?|rating|review)\s*[:=]", review, flags=re.IGNORECASE)[0].strip()
    return stars, review or None


# -- the recommender sandbox (agents.sandbox, eval.sandbox.discrimination, data_prep.choice_pairs) ------------------

# The five behaviour features of RecAgent and what each says about a person; a decision's prompt names
# only the features that bear on it (agents.sandbox.decide says which).
FEATURE_TEXT = {
    "Watcher": "you watch a lot of films and rate what you watch",
    "Explorer": "you explore films beyond your usual genres and search for ones you heard of",
    "Critic": "you hold films to high standards and criticise freely",
    "Chatter": "you enjoy private chats with friends and trust their tips",
    "Poster": "you like posting your opinions for all your friends to read",
}
# the answer is the film's number on the page: one token that carries the whole decision (what a tuned
# model learns, and what score mode ranks); a title's first token would carry it diluted among the
# tokens that only copy the rest of the title
WATCH_INSTRUCTION = "Which of these movies do you watch next? Answer with its number."
RATE_INSTRUCTION = "How many stars do you give it, from 1 (hated it) to 5 (loved it)? Answer with one digit."


def describe_person(
    name: str,
    *,
    gender: str = "",
    age: int | None = None,
    career: str = "",
    traits: str = "",
    interests: list[str] = (),
    dislikes: list[str] = (),
    mean_stars: float | None = None,
    features: list[str] = (),
) -> str:
    """Who a sandbox agent is, in one line: the fields it has, then the given features' meanings."""
    parts = [name]
    if gender or age is not None:
        parts.append(", ".join(str(x) for x in (gender, age) if x not in ("", None)))
    parts += [text for text in (career, f"traits: {traits}" if traits else "") if text]
    if interests:
        parts.append(f"likes {', '.join(interests)}")
    if dislikes:
        parts.append(f"cares less for {', '.join(dislikes)}")
    if mean_stars is not None:
        parts.append(f"rates films {mean_stars:.1f} stars out of 5 on average")
    parts += [f"{'an' if f[0] in 'AEIOU' else 'a'} {f}: {FEATURE_TEXT[f]}" for f in features]
    return "; ".join(parts)


def watched_line(movie_text: str, stars: float, when: str) -> str:
    """A film someone rated, as their memory holds it."""
    return f"I watched {movie_text} on {when}: {_stars(stars)}/5."


def listing_line(number: int, movie_text: str, ratings: int, mean: float | None) -> str:
    """One film of a page: its number, its text, and what the site shows of its ratings so far."""
    shown = (
        f"{ratings} rating{'s' * (ratings != 1)}, average {mean:.1f}"
        if ratings and mean is not None
        else "no ratings yet"
    )
    return f"{number}. {movie_text} [{shown}]"


def page_lines(page: list[int], movies: dict, counts: dict, tags_before: int) -> str:
    """A page as an agent sees it: numbered films (with their tags written before ``tags_before``) and
    their ratings on the site so far (``counts``: film -> (ratings, mean))."""
    return "\n".join(
        listing_line(k, movies[m].text(tags_before=tags_before), *counts[m])
        for k, m in enumerate(page, start=1)
    )


def observation(now: int, what: str) -> str:
    """What a sandbox agent sees, with the simulated date: a decision's context and its memory's query."""
    from datetime import UTC, datetime

    return f"It is {datetime.fromtimestamp(now, UTC).strftime('%Y-%m-%d')}. {what}"


def page_observation(now: int, listing: str) -> str:
    return observation(now, f"The recommender shows:\n{listing}")


def rate_observation(now: int, film: str) -> str:
    """What a sandbox agent sees when it rates a film it just watched (``film``: Movie.text())."""
    return observation(now, f"You just watched {film}.")


def build_sandbox_messages(profile: str, memories: list[str], instruction: str, context: str) -> list[dict]:
    """Every sandbox prompt: the profile summary relevant to the decision, the retrieved memories, the
    observation (context: the simulated time and what the agent sees) and the instruction."""
    remembered = "\n".join(f"- {m}" for m in memories) if memories else "- (nothing yet)"
    return [
        {"role": "system", "content": f"You are {profile}. Act as this person would, in their own voice."},
        {
            "role": "user",
            "content": f"# What you remember\n{remembered}\n\n# Now\n{context}\n\n# Task\n{instruction}",
        },
    ]


def instruction_of(messages: list[dict]) -> str:
    """The instruction of a sandbox prompt (what build_sandbox_messages put under "# Task")."""
    return messages[-1]["content"].rsplit("# Task\n", 1)[-1]


def rank_memories(relevance, recency, importance, top: int) -> list[int]:
    """Which long-term memories a sandbox prompt shows (RecAgent, after Generative Agents): the ``top``
    records by relevance + recency + importance, each min-max normalised over the records (all equal:
    all 1), ties by position. The sandbox's memory and the choice pairs both call this, so a tuned
    model trains on the memories it is served."""
    import numpy as np

    def normalise(values) -> np.ndarray:
        values = np.asarray(values, dtype=float)
        span = values.max() - values.min() if len(values) else 0
        return (values - values.min()) / span if span > 0 else np.ones_like(values)

    score = normalise(relevance) + normalise(recency) + normalise(importance)
    return sorted(range(len(score)), key=lambda i: (-score[i], i))[:top]
