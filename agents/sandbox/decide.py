"""Every decision of a sandbox agent goes through one place, ``Decider``: the caller builds the prompt
(data_prep.prompt's build_sandbox_messages), the decider asks the LLM for every agent at that step in
one batched call and returns the answers; the caller parses them and counts each fallback. A person
playing an agent answers its decisions instead (``human``).

Two modes (``decision.mode``):

- ``generate``: constrained generation: a choice among fixed words, or a JSON schema.
- ``score``: the options are ranked by the LLM's log-likelihood of each as the answer (the backend's
  ``score``: one forward pass over the prompt, one over its options). A film on a page is scored as the
  answer of its number; an option's score is its log-probability summed over its tokens (``sum``), per
  token (``mean``), or less its log-probability after a prompt that says nothing about the agent or the
  page (``pmi``: the option's own prior removed, a number's position bias).
  The option is then drawn from the softmax of the scores at the run's temperature (the highest at 0).

**Behaviour features act.** Each decision's prompt names only the features that bear on it
(``PROMPT_FEATURES``), and in score mode each feature multiplies the probability of the options it
names by ``features.weight`` (``FEATURE_OPTIONS``: a Watcher goes to the recommender and watches, an
Explorer asks for another page or searches, a Critic leaves a page, a Chatter chats and a Poster
posts).

With an adapter (``llm.adapter``) and ``decision.adapter_scope: watch``, only the choice of a film
runs on the adapter (what data_prep.choice_pairs trains it for); every other call runs on the base model.
``watch-rate`` also reads the stars for a watched film from it (pairs built with ``--ratings``).
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext

import numpy as np

from agents.llm import Constraint, Sampling, count_usage, option_probs, read_choice
from data_prep.prompt import build_sandbox_messages, instruction_of

FEATURE_OPTIONS = {
    "place": {"Watcher": ("recommender",), "Chatter": ("social",), "Poster": ("social",)},
    "page": {"Watcher": ("watch",), "Explorer": ("next", "search"), "Critic": ("leave",)},
    "social": {"Chatter": ("chat",), "Poster": ("post",)},
}
PROMPT_FEATURES = {
    "place": ("Watcher", "Chatter", "Poster"),
    "page": ("Watcher", "Explorer", "Critic"),
    "watch": ("Watcher", "Explorer", "Critic"),
    "social": ("Chatter", "Poster"),
    "chat": ("Chatter", "Critic"),
    "post": ("Poster", "Critic"),
    "rate": ("Critic",),
    "interview": None,  # every feature
}


MESSAGE_KINDS = ("social", "chat", "post", "interview")  # calls that write words a person reads


def priors(features: list[str], decision: str, options: list[str], weight: float) -> np.ndarray:
    """The factor each option's probability is multiplied by: ``weight`` for every one of the agent's
    features that names it."""
    named = FEATURE_OPTIONS.get(decision, {})
    return np.array(
        [weight ** sum(option in named.get(f, ()) for f in features) for option in options], dtype=float
    )


class Decider:
    def __init__(self, config, backend, rng: np.random.Generator, counts: Counter, human=None):
        """config: SandboxConfig; backend: a shared LLM backend (agents/llm.py); rng: the run's one
        generator; counts: where calls, batches and tokens are counted."""
        self.config, self.backend, self.rng, self.counts, self.human = config, backend, rng, counts, human
        self.neutral: dict[tuple[str, str], tuple[float, int]] = {}  # pmi: (instruction, option) -> score
        self.decoding: dict[str, dict] = {}  # call kind -> the decoding settings it was asked with
        if (
            config.llm.adapter
            and config.decision.mode == "generate"
            and config.decision.adapter_scope == "watch"
        ):  # (watch-rate: the adapter still rates)
            raise ValueError(
                "llm.adapter scores the choice of a film in decision.mode: score; with generate it would be "
                "loaded and never used (set decision.mode: score, or decision.adapter_scope: all)"
            )
        if config.decision.mode == "score" and not hasattr(backend, "score"):
            name = getattr(backend, "info", {}).get("backend", type(backend).__name__)
            raise ValueError(
                f"decision.mode: score needs a backend that scores answers (hf); {name} has none"
            )

    def plays(self, name: str) -> bool:
        return bool(self.human and self.human.plays(name))

    def adapter(self, kind: str):
        """The base model alone, unless this decision is one the adapter is for."""
        off = getattr(self.backend, "adapter_off", None)
        scope = self.config.decision.adapter_scope
        if off is None or scope == "all" or kind == "watch" or (kind == "rate" and scope == "watch-rate"):
            return nullcontext()
        return off()

    def sampling(self, kind: str, max_new_tokens: int = 160) -> Sampling:
        """A fresh seed per call from the run's generator (varied, and the same on a rerun); the
        decoding controls against loops (``text``) for the calls that write messages, those the backend
        applies (the summary lists the others as not available). Recorded per kind for the summary."""
        text = self.config.text
        words = kind in MESSAGE_KINDS
        controls = getattr(self.backend, "decoding_controls", ())
        sampling = Sampling(
            max_new_tokens,
            self.config.temperature,
            1.0,
            int(self.rng.integers(2**31 - 1)),
            repetition_penalty=text.repetition_penalty if words and "repetition_penalty" in controls else 1.0,
            no_repeat_ngram_size=text.no_repeat_ngram_size
            if words and "no_repeat_ngram_size" in controls
            else 0,
        )
        self.decoding[kind] = sampling.settings()
        return sampling

    def ask(
        self, kind: str, names: list[str], prompts: list[list[dict]], constraint: Constraint
    ) -> list[str]:
        """One batched generate call for everyone at this step; a human-played agent answers itself."""
        answers = [""] * len(names)
        machine = [i for i, n in enumerate(names) if not self.plays(n)]
        if machine:
            with self.adapter(kind):
                out = self.backend.generate([prompts[i] for i in machine], self.sampling(kind), constraint)
            for i, answer in zip(machine, out, strict=True):
                answers[i] = answer.text
            self.counted(kind, len(machine), out)
        for i, name in enumerate(names):
            if self.plays(name):
                answers[i] = self.human.answer(kind, prompts[i], constraint)
        return answers

    def read(
        self, kind: str, names: list[str], prompts: list[list[dict]], options: list[str], mode: str
    ) -> list[float | None]:
        """A number per agent read from the LLM's probabilities over numeric ``options`` (agents.llm.
        option_probs): their expected value or the most likely one (``mode``); None where none could be
        read (counted). A human-played agent answers itself. One batched call; where the probabilities
        came from is counted (``probs_from:...``)."""
        out: list[float | None] = [None] * len(names)
        machine = [i for i, n in enumerate(names) if not self.plays(n)]
        if machine:
            with self.adapter(kind):
                answers = option_probs(
                    self.backend,
                    [prompts[i] for i in machine],
                    options,
                    seed=int(self.rng.integers(2**31 - 1)),
                )
            self.counted(kind, len(machine), answers)
            for i, answer in zip(machine, answers, strict=True):
                out[i] = read_choice(answer, mode)
                self.counts[f"probs_from:{answer.probs_from}"] += 1
            self.decoding[kind] = {"read": mode, "from": "option probabilities"}
        for i, name in enumerate(names):
            if self.plays(name):
                answer = self.human.answer(kind, prompts[i], Constraint.choice(options)).strip()
                out[i] = float(answer) if answer in options else None
        return out

    def counted(self, kind: str, rows: int, answers: list | None = None) -> None:
        """Count a call of ``rows`` prompts and the tokens its answers used (a score call has none)."""
        self.counts[f"llm_calls:{kind}"] += rows
        self.counts["llm_batches"] += 1
        count_usage(answers or [], self.counts)

    def choose(
        self,
        kind: str,
        names: list[str],
        prompts: list[list[dict]],
        options: list[str] | list[list[str]],
        features: list[list[str]],
    ) -> list[str | None]:
        """One of the options per agent (None: an unusable answer, for the caller to count); ``options``
        is one list for everyone or one list per agent. Generate mode: a constrained choice (one call per
        distinct list; the features act through the prompt); score mode: scored in one call, each
        option's probability multiplied by its features' weights."""
        each = options if options and isinstance(options[0], list) else [options] * len(names)
        out: list[str | None] = [None] * len(names)
        if self.config.decision.mode == "generate":
            for group in dict.fromkeys(tuple(o) for o in each):
                rows = [i for i, o in enumerate(each) if tuple(o) == group]
                answers = self.ask(
                    kind, [names[i] for i in rows], [prompts[i] for i in rows], Constraint.choice(list(group))
                )
                for i, answer in zip(rows, answers, strict=True):
                    out[i] = answer.strip() if answer.strip() in group else None
            return out
        rows = [i for i, n in enumerate(names) if not self.plays(n)]
        scores = self.scores(kind, [prompts[i] for i in rows], [each[i] for i in rows])
        weight = self.config.features.weight
        for i, score in zip(rows, scores, strict=True):
            out[i] = each[i][self.draw(score + np.log(priors(features[i], kind, each[i], weight)))]
        for i, name in enumerate(names):
            if self.plays(name):
                answer = self.human.answer(kind, prompts[i], Constraint.choice(each[i])).strip()
                out[i] = answer if answer in each[i] else None
        return out

    def scores(self, kind: str, prompts: list[list[dict]], options: list[list[str]]) -> list[np.ndarray]:
        """Each option's score after its prompt (``decision.normalisation``), one batched call."""
        mode = self.config.decision.normalisation
        return self.all_scores(kind, prompts, options, (mode,))[mode]

    def all_scores(
        self, kind: str, prompts: list[list[dict]], options: list[list[str]], wanted=("sum", "mean", "pmi")
    ) -> dict[str, list[np.ndarray]]:
        """Each option's score under the ``wanted`` normalisations (sum, mean, pmi) from one batched call
        (a test chooses the normalisation on validation users). The pmi prior of an option is its score
        after the same instruction with nothing about the agent or the page, once per instruction
        (cached)."""
        out: dict[str, list[np.ndarray]] = {n: [] for n in wanted}
        if not prompts:
            return out
        with self.adapter(kind):
            raw = self.backend.score(prompts, options)
            self.counted(kind, len(prompts))
            instructions = [instruction_of(p) for p in prompts]
            if "pmi" in wanted:
                self.score_priors(instructions, options)
        for instruction, group, values in zip(instructions, options, raw, strict=True):
            total = np.array([v[0] for v in values])
            if "sum" in wanted:
                out["sum"].append(total)
            if "mean" in wanted:
                out["mean"].append(total / np.array([v[1] for v in values]))
            if "pmi" in wanted:
                out["pmi"].append(total - np.array([self.neutral[(instruction, o)][0] for o in group]))
        return out

    def score_priors(self, instructions: list[str], options: list[list[str]]) -> None:
        """Each option's score after its instruction alone (nothing about the agent or the page): the
        prior pmi removes, scored once per (instruction, option) and cached."""
        missing: dict[str, set[str]] = {}
        for instruction, group in zip(instructions, options, strict=True):
            missing.setdefault(instruction, set()).update(
                o for o in group if (instruction, o) not in self.neutral
            )
        for instruction, todo in missing.items():
            if todo:
                todo = sorted(todo)
                neutral = build_sandbox_messages("a person", [], instruction, "")
                for option, value in zip(todo, self.backend.score([neutral], [todo])[0], strict=True):
                    self.neutral[(instruction, option)] = value

    def draw(self, logits: np.ndarray) -> int:
        """The index drawn from softmax(logits / temperature) with the run's generator; the highest
        (first of ties) at temperature 0."""
        temperature = self.config.temperature
        if temperature == 0:
            return int(np.argmax(logits))
        z = (logits - logits.max()) / temperature
        p = np.exp(z) / np.exp(z).sum()
        return int(self.rng.choice(len(p), p=p))
