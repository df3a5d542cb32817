"""An agent's memory, as RecAgent designs it: sensory, short-term and long-term.

- **Sensory**: each observation is compressed by the LLM into one sentence with an importance score in
  (0, 1]; below ``importance_threshold`` it is dropped (counted).
- **Short-term**: a new record enhances every existing record whose embedding cosine to it reaches
  ``enhance_similarity`` (it is then not stored itself); a record enhanced ``enhance_times`` times is
  summarised with its enhancers into an insight by the LLM, and the record, its enhancers and the
  insight move to long-term. Beyond ``short_term_capacity`` the oldest record moves to long-term.
- **Long-term**: retrieval of the top ``retrieve_top`` records by relevance to the current observation
  + recency + importance (each min-max normalised over the candidates: data_prep.prompt.rank_memories);
  forgetting, each record with probability ``forget_scale`` x g(M) (``history_forget_scale`` for the
  real history's records), g(M) = 1 - (s + r)/2 * max(r^beta, delta), where s and r are its importance
  and recency in (0, 1) (the paper makes the probability proportional to g; the scale sets how long a
  record lives: ``python -m bench.sandbox_bench memory``);
  reflection, which asks the LLM for higher-level insights from the most important records and merges
  near-duplicates (cosine >= ``merge_similarity``: the more important one stays, absorbing the other's
  enhancements; records of the real history are distinct films and never merged).
- **The real past** (``seed``): a data-aligned agent starts with its user's rated films as records of
  kind ``history``, the most recent ``short_term_capacity`` in short-term memory and the rest in
  long-term, each created at its real time on the round clock (so recency, retrieval, forgetting and
  reflection treat them as memories like any other).
- What a prompt reads (``context``): the top long-term records for the observation plus all short-term
  ones.
- **Ablations** (config switches): ``short_term: false`` stores every kept observation straight in
  long-term (no enhancement, no insights); ``long_term: false`` keeps nothing beyond short-term (what
  leaves it is dropped, counted); ``reflection: false`` never reflects.

Time is the simulated round. Every random draw comes from the run's one generator. The LLM is reached
through ``MemoryModel``: ``LLMMemoryModel`` asks a shared backend (agents/llm.py) with structured
outputs, batched over observations; tests use the same class over a scripted backend. State is plain
JSON (``to_json``/``load_json``) for the run's checkpoints; embeddings are not stored but recomputed on
load from each record's text (a history record's key is its film's text), so a checkpoint stays small.
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import numpy as np

from agents.llm import Constraint, Sampling, count_usage
from data_prep.prompt import rank_memories

COMPRESS = Constraint.json_object(
    summary={"type": "string", "minLength": 1, "maxLength": 200},
    importance={"type": "integer", "minimum": 1, "maximum": 10},
)
SENTENCE = Constraint.json_object(insight={"type": "string", "minLength": 1, "maxLength": 200})


@dataclass
class Record:
    text: str
    importance: float  # (0, 1]
    created: int  # round (a history record: negative, its real time on the round clock)
    accessed: int  # round of the last retrieval (or creation)
    embedding: np.ndarray | list[float] | None  # not in checkpoints: recomputed from key or text
    kind: str = "observation"  # observation | insight | reflection | history
    enhanced: int = 0
    enhancers: list[str] = field(default_factory=list)
    key: str | None = None  # the text embedded, when it is not ``text`` (a history record: its film)

    def as_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "embedding"}


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of one vector against the rows of a matrix."""
    norms = np.linalg.norm(b, axis=-1) * np.linalg.norm(a)
    return (b @ a) / np.where(norms == 0, 1, norms)


def forget_probability(importance: np.ndarray, recency: np.ndarray, beta: float, delta: float) -> np.ndarray:
    """g(M) = 1 - (s + r)/2 * max(r^beta, delta), with s and r already in (0, 1)."""
    return 1 - (importance + recency) / 2 * np.maximum(recency**beta, delta)


class LLMMemoryModel:
    """The memory's LLM calls through a shared backend, each a structured output, batched."""

    def __init__(self, backend, sampling: Sampling | None = None, around=None, writer: str = "llm"):
        """around: kind -> context manager each call runs in (the world's: the base model without an
        adapter trained for other decisions); writer: llm, or template (no LLM call: MemoryConfig)."""
        self.backend, self.sampling = backend, sampling or Sampling(max_new_tokens=96)
        self.writer = writer
        self.around = around or (lambda kind: nullcontext())
        self.counts: Counter = Counter()
        # (kind, text, the memories it was made from) of every usable answer, kept only while ``collect``
        # (the world's rounds: World.check_memory takes them each time)
        self.collect = False
        self.written: list[tuple[str, str, list[str]]] = []

    def _ask(self, prompts: list[str], constraint: Constraint, key: str) -> list[dict | None]:
        with self.around("memory"):
            answers = self.backend.generate(
                [[{"role": "user", "content": p}] for p in prompts], self.sampling, constraint
            )
        self.counts["llm_calls"] += len(prompts)
        count_usage(answers, self.counts)
        out = []
        for answer in (a.text for a in answers):
            value = constraint.parse(answer)  # valid under the schema, else None
            out.append(value if value and value.get(key) else None)
            if out[-1] is None:
                self.counts["unparsable"] += 1
        return out

    def compress(self, observations: list[str]) -> list[tuple[str, float]]:
        """One sentence and an importance in (0, 1] per observation; an unusable answer keeps the
        observation itself at importance 0.5 (counted as a fallback). The template keeps every one so."""
        if self.writer == "template":
            self.counts["template_summaries"] += len(observations)
            return [(observation, 0.5) for observation in observations]
        prompts = [
            "Compress this observation into one sentence, and rate how important it is to remember, "
            f"from 1 (trivial) to 10 (life-changing).\nObservation: {o}"
            for o in observations
        ]
        out = []
        for observation, value in zip(observations, self._ask(prompts, COMPRESS, "summary"), strict=True):
            if value is None:  # failed COMPRESS (counted as unparsable): never clamped, a fallback
                self.counts["fallbacks"] += 1
                out.append((observation, 0.5))
            else:  # an integer 1-10 by the schema (5.0 is an integer to it)
                out.append((str(value["summary"]), int(value["importance"]) / 10))
                if self.collect:
                    self.written.append(("summary", out[-1][0], [observation]))
        return out

    def _sentences(self, instruction: str, groups: list[list[str]], kind: str) -> list[str | None]:
        """One sentence from each group of memories, all groups in one batched call; None for an unusable
        answer (counted as a fallback)."""
        if not groups:
            return []
        prompts = [instruction + "\n" + "\n".join(f"- {t}" for t in texts) for texts in groups]
        out = []
        for value, texts in zip(self._ask(prompts, SENTENCE, "insight"), groups, strict=True):
            if value is None:
                self.counts["fallbacks"] += 1
            elif self.collect:
                self.written.append((kind, str(value["insight"]), texts))
            out.append(str(value["insight"]) if value else None)
        return out

    def insights(self, themes: list[tuple[str, list[str]]]) -> list[str]:
        """The insight each repeated theme (a record and its enhancers) adds up to; the record itself when
        the answer is unusable."""
        if self.writer == "template":
            return [record for record, _ in themes]
        instruction = "These memories repeat one theme. Write the insight they add up to, in one sentence."
        answers = self._sentences(
            instruction, [[record, *enhancers] for record, enhancers in themes], "insight"
        )
        return [answer or record for answer, (record, _) in zip(answers, themes, strict=True)]

    def reflections(self, groups: list[list[str]]) -> list[str | None]:
        if self.writer == "template":  # a template has nothing higher-level to say: no reflection
            return [None] * len(groups)
        instruction = "From these memories, write one higher-level insight about yourself."
        return self._sentences(instruction, groups, "reflection")


class Memory:
    def __init__(self, config, embed, model, rng: np.random.Generator):
        """config: MemoryConfig; embed: texts -> array (n, d); model: LLMMemoryModel-like; rng: the run's
        one generator."""
        self.config, self.embed, self.model, self.rng = config, embed, model, rng
        self.short: list[Record] = []
        self.long: list[Record] = []
        self.due: list[Record] = []  # enhanced enough, waiting for their insight (promote_due)
        self.counts: Counter = Counter()

    # -- the real past ---------------------------------------------------------------------------------
    def seed(self, records: list[Record]) -> None:
        """Start with these records (oldest first): the newest ``short_term_capacity`` in short-term, the
        rest in long-term (with an ablated part, all in the other one; with both ablated, none)."""
        if not records:
            return
        vectors = np.asarray(self.embed([r.key or r.text for r in records]), dtype=float)
        for record, vector in zip(records, vectors, strict=True):
            record.embedding = vector
        cut = (
            max(len(records) - self.config.short_term_capacity, 0) if self.config.short_term else len(records)
        )
        self.long.extend(records[:cut] if self.config.long_term else [])
        self.short.extend(records[cut:] if self.config.short_term else [])
        self.counts["seeded"] += len(records)
        if not self.config.long_term:
            self.counts["dropped_no_long_term"] += cut

    # -- sensory -> short-term -------------------------------------------------------------------------
    def observe(self, observations: list[str], now: int) -> list[Record]:
        """Compress and score the observations (one batched LLM call); keep those at or above the
        threshold in short-term memory, and promote what is due. Returns the records kept."""
        if not observations:
            return []
        kept = self.store(self.model.compress(observations), now)
        promote_due([self], now)
        return kept

    def store(self, compressed: list[tuple[str, float]], now: int) -> list[Record]:
        """Keep compressed observations (text, importance) at or above the threshold in short-term
        memory (the world compresses a whole round's observations of all agents in one call, and then
        promotes every agent's due records in one more: ``promote_due``)."""
        kept = [(text, score) for text, score in compressed if score >= self.config.importance_threshold]
        self.counts["dropped"] += len(compressed) - len(kept)
        if not kept:
            return []
        vectors = np.asarray(self.embed([text for text, _ in kept]), dtype=float)
        records = []
        for (text, score), vector in zip(kept, vectors, strict=True):
            record = Record(text, score, now, now, vector)
            if self.config.short_term:
                self.add_short(record, now)
            else:
                self.to_long([record])
            records.append(record)
        return records

    def to_long(self, records: list[Record]) -> None:
        if self.config.long_term:
            self.long.extend(records)
        else:
            self.counts["dropped_no_long_term"] += len(records)

    def add_short(self, record: Record, now: int) -> None:
        """A record enhances every short-term record at least ``enhance_similarity`` alike (and is then
        not stored); otherwise it is stored, the oldest moving to long-term beyond the capacity."""
        if self.short:
            similarity = cosine(np.asarray(record.embedding), np.asarray([r.embedding for r in self.short]))
            alike = [
                r for r, s in zip(self.short, similarity, strict=True) if s >= self.config.enhance_similarity
            ]
            for target in alike:
                target.enhanced += 1
                target.enhancers.append(record.text)
                target.accessed = now
                target.importance = max(target.importance, record.importance)
                self.counts["enhanced"] += 1
                if target.enhanced >= self.config.enhance_times:
                    self.short.remove(target)
                    self.due.append(target)
            if alike:
                return
        self.short.append(record)
        while len(self.short) > self.config.short_term_capacity:
            self.to_long([self.short.pop(0)])
            self.counts["moved_by_capacity"] += 1

    def promote(self, record: Record, text: str, now: int) -> None:
        """A record enhanced enough times, with the insight from it and its enhancers: all to long-term."""
        vectors = np.asarray(self.embed([text, *record.enhancers]), dtype=float)
        insight = Record(text, record.importance, now, now, vectors[0], kind="insight")
        enhancers = [
            Record(t, record.importance, now, now, v)
            for t, v in zip(record.enhancers, vectors[1:], strict=True)
        ]
        self.to_long([record, *enhancers, insight])
        self.counts["insights"] += 1

    # -- long-term ---------------------------------------------------------------------------------------
    def recency(self, records: list[Record], now: int) -> np.ndarray:
        return np.array([self.config.recency_decay ** (now - r.accessed) for r in records])

    def retrieve(self, observation: str, now: int, top: int | None = None) -> list[Record]:
        """The top long-term records for the observation by relevance + recency + importance
        (data_prep.prompt.rank_memories); retrieval refreshes their recency."""
        if not self.long:
            return []
        vector = np.asarray(self.embed([observation]), dtype=float)[0]
        relevance = cosine(vector, np.asarray([r.embedding for r in self.long]))
        importance = [r.importance for r in self.long]
        order = rank_memories(
            relevance, self.recency(self.long, now), importance, top or self.config.retrieve_top
        )
        chosen = [self.long[i] for i in order]
        for record in chosen:
            record.accessed = now
        return chosen

    def forget(self, now: int) -> int:
        """Forget each long-term record with probability forget_scale (history_forget_scale for a history
        record) x g(M); returns how many."""
        if not self.long:
            return 0
        # importance and recency are already in (0, 1]; the formula needs them strictly inside (0, 1)
        s = np.array([r.importance for r in self.long]).clip(1e-6, 1 - 1e-6)
        r = self.recency(self.long, now).clip(1e-6, 1 - 1e-6)
        history, other = self.config.history_forget_scale, self.config.forget_scale
        scale = np.array([history if x.kind == "history" else other for x in self.long])
        g = scale * forget_probability(s, r, self.config.forget_beta, self.config.forget_delta)
        keep = self.rng.random(len(self.long)) >= g
        forgotten = int((~keep).sum())
        self.long = [record for record, k in zip(self.long, keep, strict=True) if k]
        self.counts["forgotten"] += forgotten
        return forgotten

    def reflect(self, now: int, top: int = 10) -> Record | None:
        """A higher-level insight from the most important long-term records, then near-duplicates merged."""
        return reflect_all([self], now, top)[0]

    def merge(self) -> int:
        """Merge long-term records whose cosine reaches merge_similarity: the more important (then the
        newer) stays and absorbs the other's enhancements. History records are films the user really
        rated, each its own fact: they are never merged. Returns how many were merged away."""
        pool = [r for r in self.long if r.kind != "history"]
        if len(pool) < 2:
            return 0
        vectors = np.asarray([r.embedding for r in pool], dtype=float)
        vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        similarity = vectors @ vectors.T
        np.fill_diagonal(similarity, -1)
        gone: set[int] = set()
        for i in range(len(pool)):
            for j in np.flatnonzero(similarity[i] >= self.config.merge_similarity):
                if i in gone:
                    break
                if j in gone:
                    continue
                a, b = pool[i], pool[j]
                keep, drop = (i, j) if (a.importance, a.created) >= (b.importance, b.created) else (j, i)
                pool[keep].enhanced += pool[drop].enhanced + 1
                pool[keep].enhancers.append(pool[drop].text)
                gone.add(drop)
        dropped = {id(pool[k]) for k in gone}
        self.long = [r for r in self.long if id(r) not in dropped]
        self.counts["merged"] += len(gone)
        return len(gone)

    # -- what a prompt reads -----------------------------------------------------------------------------
    def context(self, observation: str, now: int) -> list[str]:
        return [r.text for r in self.retrieve(observation, now)] + [r.text for r in self.short]

    # -- checkpoints ---------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "short": [r.as_json() for r in self.short],
            "long": [r.as_json() for r in self.long],
            "due": [r.as_json() for r in self.due],
            "counts": dict(self.counts),
        }

    def load_json(self, state: dict) -> None:
        parts = {
            name: [Record(**{"embedding": None, **r}) for r in state.get(name, [])]
            for name in ("short", "long", "due")
        }
        records = [r for part in parts.values() for r in part if r.embedding is None]
        if records:  # recomputed from the same texts (the encoder's cache makes a repeat free)
            vectors = np.asarray(self.embed([r.key or r.text for r in records]), dtype=float)
            for record, vector in zip(records, vectors, strict=True):
                record.embedding = vector
        self.short, self.long, self.due = parts["short"], parts["long"], parts["due"]
        self.counts = Counter(state["counts"])


def promote_due(memories: list[Memory], now: int) -> None:
    """Every record that reached ``enhance_times`` in any of these memories becomes an insight: one
    batched LLM call for all of them (the world passes every agent's memory at once)."""
    due = [(memory, record) for memory in memories for record in memory.due]
    if not due:
        return
    model = due[0][0].model
    texts = model.insights([(record.text, record.enhancers) for _, record in due])
    for (memory, record), text in zip(due, texts, strict=True):
        memory.promote(record, text, now)
    for memory in memories:
        memory.due = []


def reflect_all(memories: list[Memory], now: int, top: int = 10) -> list[Record | None]:
    """Each memory's reflection (a higher-level insight from its most important long-term records, one
    batched LLM call for all), then its near-duplicates merged; a memory with ``reflection: false`` does
    neither. Returns each memory's new record."""
    asking = [m for m in memories if m.long and m.config.reflection]
    best = {id(m): sorted(m.long, key=lambda r: (-r.importance, -r.created))[:top] for m in asking}
    texts = asking[0].model.reflections([[r.text for r in best[id(m)]] for m in asking]) if asking else []
    answers = {id(m): t for m, t in zip(asking, texts, strict=True)}
    out = []
    for memory in memories:
        reflection = None
        text = answers.get(id(memory))
        if text:
            vector = np.asarray(memory.embed([text]), dtype=float)[0]
            importance = max(r.importance for r in best[id(memory)])
            reflection = Record(text, importance, now, now, vector, kind="reflection")
            memory.long.append(reflection)
            memory.counts["reflections"] += 1
        if memory.config.reflection:
            memory.merge()
        out.append(reflection)
    return out
