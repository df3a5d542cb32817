"""Recommenders written the way a researcher would write one for the simulator's plug-in protocol
(agents/converse/plugins.py): they import nothing from this project."""

import time


class FirstPlace:
    """Recommends the catalogue ids it was given, one per turn, and names one id nobody knows."""

    def __init__(self, items, unknown="no-such-place"):
        self.items, self.unknown = list(items), unknown
        self.seen = []  # every dialogue it was sent, as sent

    def respond(self, dialogue):
        self.seen.append(dialogue)
        turn = sum(1 for t in dialogue if t["role"] == "user")
        item = self.items[(turn - 1) % len(self.items)]
        return {"reply": f"Try place {item} (your message {turn}).", "items": [item, self.unknown]}


class Plain:
    """Answers with a plain string: no items (the user judges whether something was recommended)."""

    def respond(self, dialogue):
        return "Tell me more about what you like."


class FailsLater:
    """Answers the first turn, raises on the second."""

    def respond(self, dialogue):
        if sum(1 for t in dialogue if t["role"] == "user") > 1:
            raise RuntimeError("out of memory on turn two")
        return {"reply": "Where are you?", "items": []}


class OneAtATime:
    """Records how many calls ran at once (a model that is not thread-safe must see one)."""

    def __init__(self):
        import threading

        self.lock, self.running, self.most = threading.Lock(), 0, 0

    def respond(self, dialogue):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.05)
        with self.lock:
            self.running -= 1
        return "ok"


class Broken:
    """Fails in the ways a research prototype does, chosen by the user's latest words."""

    def __init__(self, hang=5.0):
        self.hang = hang

    def respond(self, dialogue):
        said = dialogue[-1]["content"]
        if "raise" in said:
            raise RuntimeError("my model fell over")
        if "hang" in said:
            time.sleep(self.hang)
        if "shape" in said:
            return {"text": "a key the protocol does not have"}
        if "blank" in said:
            return {"reply": "   "}
        return {"reply": "fine"}


class AsksThenNames:
    """A text-only CRS: it gives no item ids; its first reply asks, every later one names ``name``."""

    def __init__(self, name):
        self.name = name

    def respond(self, dialogue):
        if len(dialogue) == 1:
            return "What would you like to eat, and where?"
        return f"You could try {self.name}, it is popular."
