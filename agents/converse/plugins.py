"""Your own conversational recommender in the simulator: one protocol, three transports.

The protocol is one call per turn, stateless: the dialogue so far in, the reply out.

    dialogue = [{"role": "user", "content": "I want sushi tonight"},
                {"role": "assistant", "content": "Any budget?"},
                {"role": "user", "content": "Cheap, please."}]          # ends with the user's message
    answer = {"reply": "Try Sushi Den.", "items": ["yelp-business-id"]}   # items: optional

``items`` are the catalogue ids recommended in this reply (the Yelp setting's business ids; any ids in the
open RecLLMSim tasks). Leave them out when your system does not know them: the places your reply names
are then looked up in the catalogue by name (below).

Transports (the config's ``plugins`` section, each entry named and listed in ``crs`` like a built-in):

- ``python``: ``target: package.module:Class`` (or ``path/file.py:Class``); the class is built with
  ``options`` as keyword arguments and its ``respond(dialogue)`` returns the answer dict or a plain string.
  A shorthand: a ``module:Class`` string in ``crs`` itself.
- ``http``: ``target: http://127.0.0.1:8000/respond``; the simulator POSTs ``{"dialogue": [...]}`` and reads
  the answer as JSON.
- ``openai``: ``target: http://host:port/v1``, any OpenAI-compatible chat endpoint; the full dialogue is
  sent after your ``system_prompt`` (none when empty), with no token cap unless ``max_tokens`` is set, so
  only the model's window bounds it. The key is read from the environment variable ``api_key_env`` and
  never recorded. Items are not known on this transport.

A reply without ``items`` (the openai transport, or a CRS that leaves them out) is read for the catalogue
places it names (``match_names``, on by default; agents/converse/crs.py NameMatcher): the matched places
count as recommended, so success, hit@k and fit apply and the goal's agenda reacts to them. Names that
fit several places the dialogue's cities cannot tell apart are ambiguous and counted.

Every call has a ``timeout`` (seconds). The network transports have ``retries`` (http: a timeout, a
lost connection or a 5xx is tried again with a short backoff; openai: the openai client's own retries,
which also cover 429); a python plug-in's call is not retried (an exception is the plug-in's answer). A turn that still fails (an exception, a hang, a 4xx, a body that is not
JSON or not the answer's shape, an empty reply) gets ``Reply.error``: the dialogue ends there as
``crs_error``, nothing is rated, the error and the raw answer are in the turn log and counted per CRS.
Item ids the catalogue does not hold are refused, kept in ``Reply.refused`` and counted. Up to
``concurrency`` dialogues are served at once (threads: a python plug-in's ``respond`` must be safe to
call from that many threads; ``concurrency: 1`` calls it one dialogue at a time), so a slow server does
not serialise a chunk. The fingerprint records the digest of the file that defines a python plug-in's
class (not of modules it imports).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.converse.crs import CRS, NameMatcher, Reply, Session
from agents.plugins import describe, load_class


class Answer(BaseModel):
    """What a CRS returns for one turn (the protocol above)."""

    model_config = ConfigDict(extra="forbid")
    reply: str = Field(min_length=1)
    items: list[str] | None = None
    cut_short: bool = Field(False, exclude=True)  # set by the openai transport, not by a CRS


class CRSFailure(Exception):
    """One turn that failed after its retries; ``reason`` is the counted kind, ``raw`` what came back."""

    def __init__(self, reason: str, detail: str, raw: str | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.raw = reason, raw


def parse_answer(value, raw: str | None = None) -> Answer:
    if isinstance(value, str):
        value = {"reply": value}
    try:
        answer = Answer.model_validate(value)
    except ValidationError as error:
        raise CRSFailure("bad_answer", str(error).splitlines()[0], raw or repr(value)[:2000]) from None
    if not answer.reply.strip():
        raise CRSFailure("empty_reply", "the reply is blank", raw or repr(value))
    return answer


def with_retries(call, retries: int):
    """call() -> value; timeouts, lost connections and 5xx answers are retried ``retries`` times."""
    for attempt in range(retries + 1):
        try:
            return call()
        except CRSFailure as failure:
            if failure.reason not in ("timeout", "connection", "server_error") or attempt == retries:
                raise
            time.sleep(min(0.2 * 2**attempt, 2.0))


class PythonTransport:
    def __init__(self, spec):
        self.instance = load_class(spec.target)(**spec.options)

    def __call__(self, dialogue: list[dict]) -> Answer:
        try:
            value = self.instance.respond([dict(turn) for turn in dialogue])
        except Exception as error:  # the researcher's code raised: counted, the run goes on
            raise CRSFailure("raised", repr(error)) from error
        return parse_answer(value)


class HttpTransport:
    def __init__(self, spec):
        self.url, self.timeout, self.retries = spec.target, spec.timeout, spec.retries
        self.client = httpx.Client(timeout=spec.timeout)

    def once(self, dialogue: list[dict]) -> Answer:
        try:
            response = self.client.post(self.url, json={"dialogue": dialogue})
        except httpx.TimeoutException as error:
            raise CRSFailure("timeout", f"no answer from {self.url} in {self.timeout} s") from error
        except httpx.TransportError as error:
            raise CRSFailure("connection", f"{self.url}: {error!r}") from error
        if response.status_code >= 500:
            raise CRSFailure("server_error", f"{self.url} answered {response.status_code}", response.text)
        if response.status_code != 200:
            raise CRSFailure("http_status", f"{self.url} answered {response.status_code}", response.text)
        try:
            value = response.json()
        except ValueError:
            raise CRSFailure(
                "not_json", f"{self.url} answered with a body that is not JSON", response.text
            ) from None
        return parse_answer(value, response.text)

    def __call__(self, dialogue: list[dict]) -> Answer:
        return with_retries(lambda: self.once(dialogue), self.retries)


class OpenAITransport:
    def __init__(self, spec):
        import openai

        self.openai = openai
        key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
        # retries are the openai client's own (timeouts, lost connections, 429 and 5xx, with backoff)
        self.client = openai.OpenAI(
            base_url=spec.target, api_key=key or "none", timeout=spec.timeout, max_retries=spec.retries
        )
        self.model, self.system, self.max_tokens = spec.model, spec.system_prompt, spec.max_tokens

    def __call__(self, dialogue: list[dict]) -> Answer:
        messages = ([{"role": "system", "content": self.system}] if self.system else []) + dialogue
        extra = {"max_tokens": self.max_tokens} if self.max_tokens else {}
        try:
            response = self.client.chat.completions.create(model=self.model, messages=messages, **extra)
        except self.openai.APITimeoutError as error:
            raise CRSFailure("timeout", repr(error)) from error
        except self.openai.APIConnectionError as error:
            raise CRSFailure("connection", repr(error)) from error
        except self.openai.APIStatusError as error:
            kind = "server_error" if error.status_code >= 500 else "http_status"
            raise CRSFailure(kind, repr(error), error.response.text) from error
        except self.openai.APIError as error:  # e.g. a body that is not an answer
            raise CRSFailure("bad_answer", repr(error)) from error
        choice = response.choices[0] if response.choices else None
        text = (choice.message.content or "") if choice else ""
        if not text.strip():
            raise CRSFailure("empty_reply", "the endpoint returned no text", response.model_dump_json())
        # stopped by max_tokens or the model's window: kept, and counted by PluginCRS
        return Answer(reply=text, items=None, cut_short=choice.finish_reason == "length")


TRANSPORTS = {"python": PythonTransport, "http": HttpTransport, "openai": OpenAITransport}


class PluginCRS(CRS):
    """A plugged-in recommender behind the built-ins' batched interface: every session of a chunk is
    served at once (up to ``concurrency`` threads), each call bounded by ``timeout``."""

    def __init__(self, name: str, spec, catalogue: list, match_names: bool = True):
        """match_names: a reply without item ids is read for the catalogue names it says (NameMatcher)."""
        self.name, self.spec = name, spec
        self.by_id = {r.id: r for r in catalogue}
        self.matcher = NameMatcher(catalogue) if catalogue and match_names else None
        self.transport = TRANSPORTS[spec.transport](spec)
        self.session = Session()
        self.hung = 0  # python plug-in calls left running after their timeout

    def respond(self, sessions: list[Session], texts: list[str]) -> list[Reply]:
        for session, text in zip(sessions, texts, strict=True):
            session.dialogue.append(("user", text))
        dialogues = [[{"role": r, "content": t} for r, t in s.dialogue] for s in sessions]
        if self.spec.transport == "python":
            outcomes = self.bounded(dialogues)
        else:  # the network transports bound each try themselves
            with ThreadPoolExecutor(max_workers=max(1, min(self.spec.concurrency, len(sessions)))) as pool:
                outcomes = list(pool.map(self.outcome, dialogues))
        replies = []
        for outcome, session in zip(outcomes, sessions, strict=True):
            if isinstance(outcome, CRSFailure):
                replies.append(Reply("", [], error=str(outcome), raw=outcome.raw))
            else:
                replies.append(self.accept(outcome, session))
        for session, reply in zip(sessions, replies, strict=True):
            if reply.error is None:
                session.dialogue.append(("assistant", reply.text))
                session.recommended += reply.recommended or []
        return replies

    def outcome(self, dialogue: list[dict]) -> Answer | CRSFailure:
        try:
            return self.transport(dialogue)
        except CRSFailure as failure:
            return failure

    def bounded(self, dialogues: list[list[dict]]) -> list[Answer | CRSFailure]:
        """A python plug-in's calls in waves of ``concurrency`` (so ``concurrency: 1`` calls it one
        dialogue at a time), one daemon thread each, every call waited for ``timeout`` seconds from the
        start of its wave. A call that hangs is answered with a timeout and left behind (a daemon thread
        does not hold up the exit); calls still running are counted (``hung``)."""
        outcomes: list = [CRSFailure("timeout", f"no answer in {self.spec.timeout:g} s")] * len(dialogues)

        def work(k: int) -> None:
            outcomes[k] = self.outcome(dialogues[k])

        for start in range(0, len(dialogues), self.spec.concurrency):
            wave = range(start, min(start + self.spec.concurrency, len(dialogues)))
            threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in wave]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + self.spec.timeout
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            self.hung += sum(thread.is_alive() for thread in threads)
        return list(outcomes)

    def accept(self, answer: Answer, session: Session | None = None) -> Reply:
        if answer.items is None and self.matcher is not None:  # the places its words name
            context = " ".join(t for _, t in session.dialogue) if session else ""
            ids, ambiguous = self.matcher(answer.reply, context)
            return Reply(
                answer.reply, ids, cut_short=answer.cut_short, matched_by="names", ambiguous=ambiguous
            )
        if answer.items is None:
            return Reply(answer.reply, None, cut_short=answer.cut_short)
        items = list(dict.fromkeys(answer.items))
        if not self.by_id:  # open tasks: no catalogue to check the ids against
            return Reply(answer.reply, items)
        known = [i for i in items if i in self.by_id]
        return Reply(answer.reply, known, refused=[i for i in items if i not in self.by_id])


def plugin_records(config) -> dict:
    """Each plug-in's transport and target, and for a python one its source file's digest."""
    out = {}
    for name, spec in ((n, config.plugins[n]) for n in config.crs if n in config.plugins):
        record = {"transport": spec.transport, "target": spec.target}
        if spec.transport == "python":
            record.update(describe(spec.target))
        out[name] = record
    return out
