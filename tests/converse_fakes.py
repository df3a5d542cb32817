"""A scripted, deterministic backend for the conversational simulator's tests: answers by the
constraint's shape, and records the kind of every call in order."""

import json

from agents.llm import Answer


class Scripted:
    def __init__(self, rating=None, actions=None, judged=None, drop=(), plan="recommend"):
        """rating: the rating JSON (a dict; None: garbage); actions: a list of action lists, one per
        user turn number (the last repeats); judged: trait level the LLM judger answers; drop: the
        attribute values the conflict check drops, in order, while the persona has them (None: garbage);
        plan: the AgentCRS plan."""
        self.rating = (
            rating
            if rating is not None
            else {
                "rationale": "fine",
                "language_quality": 4,
                "action_quality": 4,
                "recommended": True,
                "recommendation_quality": 4,
                "new_preference": "",
                "fit": 3,
            }
        )
        self.actions = actions or [["request_recommendation"]]
        self.judged, self.drop, self.plan = judged, drop, plan
        self.kinds: list[str] = []
        self.calls: list[tuple[str, str]] = []  # (kind, prompt) of every call, in order

    def generate(self, conversations, sampling, constraint=None):
        out = []
        for conversation in conversations:
            known = len(self.kinds)
            out.append(self.answer(conversation, constraint))
            kind = self.kinds[-1] if len(self.kinds) > known else "unrecorded"
            self.calls.append((kind, conversation[-1]["content"]))
        return [Answer(text, constrained=constraint is not None) for text in out]

    def option_probs(self, conversations, options, samples=8, seed=0, prefix=""):
        """A score asked after the judgement: all probability on the scripted rating's value. The
        questionnaire's item lines ("Detail: 0", ...): each item's probability on its lowest option."""
        from agents.converse.simulator import SCORES

        out = []
        for conversation in conversations:
            if "Now fill in the questionnaire" in conversation[-1]["content"]:  # one item, after its prefix
                self.kinds.append(f"questionnaire:{prefix}")
                probs = {o: float(o == "0") for o in options}
                out.append(Answer("0", probs=probs, expected=0.0, probs_from="logprobs"))
                continue
            key = next(k for k, q in SCORES.items() if q in conversation[-1]["content"])
            self.kinds.append(f"score:{key}")
            value = str(self.rating[key])
            probs = {o: float(o == value) for o in options}
            out.append(Answer(value, probs=probs, expected=float(value), probs_from="logprobs"))
        return out

    def answer(self, conversation, constraint):
        text = conversation[-1]["content"]
        if constraint is None:
            self.kinds.append("assistant")
            return "Here is an idea for you."
        if constraint.kind == "choice":
            options = list(constraint.options)
            if "ask" in options:
                self.kinds.append("plan")
                return self.plan
            self.kinds.append("judge")
            return self.judged if self.judged is not None else options[0]
        keys = set(json.loads(constraint.schema)["properties"])
        if keys == {"contradiction", "drop"}:
            self.kinds.append("conflict")
            if self.drop is None:
                return "{not json"
            values = json.loads(constraint.schema)["properties"]["drop"]["enum"]
            wanted = [v for v in self.drop if v in values]
            return json.dumps({"contradiction": bool(wanted), "drop": wanted[0] if wanted else values[0]})
        if "rationale" in keys:  # the whole rating, or its judgement alone (rating.read greedy / expected)
            self.kinds.append("rating")
            if self.rating == "garbage":
                return "{oops"
            return json.dumps(
                {k: v for k, v in self.rating.items() if k in keys} if len(keys) < 7 else self.rating
            )
        if keys == {"actions"}:
            self.kinds.append("action")
            turn = text.count("\nYou: ")  # the user's earlier turns in the transcript
            return json.dumps({"actions": self.actions[min(turn, len(self.actions) - 1)]})
        if keys == {"message"}:
            if text.startswith("Rewrite"):
                self.kinds.append("refine")
                return json.dumps({"message": "Rewritten. Short."})
            self.kinds.append("response")
            return json.dumps({"message": "I would like a quiet place with good noodles tonight please"})
        if keys == {"likes", "dislikes"}:
            self.kinds.append("crs:preferences")
            return json.dumps({"likes": ["noodles"], "dislikes": []})
        if keys == {"reply", "recommend"}:
            self.kinds.append("crs:reply")
            return json.dumps({"reply": "Try the first place.", "recommend": [1]})
        self.kinds.append("crs:say")
        return json.dumps({"reply": "How about this one?"})


class Reading(Scripted):
    """Answers from what the prompt says, as a person reading it would: ends the conversation when it
    is told it decides quickly and is satisfied, and rates a reply 2 when it mentions a food the prompt
    says the persona dislikes (5 otherwise). A difference in the persona that does not reach the
    prompt cannot reach these answers."""

    def answer(self, conversation, constraint):
        text = conversation[-1]["content"]
        if constraint is not None and constraint.kind == "json":
            keys = set(json.loads(constraint.schema)["properties"])
            if keys == {"actions"}:
                self.kinds.append("action")
                quick = "You decide quickly" in text and "You are delighted" in text
                return json.dumps({"actions": ["end"] if quick else ["request_recommendation"]})
            if "rationale" in keys:
                self.kinds.append("rating")
                disliked = (
                    text.split("Food you dislike: ")[1].split(".")[0]
                    if "Food you dislike: " in text
                    else None
                )
                last = text.split("Assistant: ")[-1].split("\nRate the assistant")[0]
                score = 2 if disliked and disliked.lower() in last.lower() else 5
                return json.dumps(dict(self.rating, language_quality=score, action_quality=score,
                                       recommendation_quality=score))  # fmt: skip
        return super().answer(conversation, constraint)
