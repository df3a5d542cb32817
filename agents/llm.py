"""LLM backends behind one interface: a batch of chat conversations in, one ``Answer`` per conversation
out. An ``Answer`` is a record: the text, whether it stopped at ``max_new_tokens`` rather than at its
end (``cut_short``: a truncated review is counted, never silent), the prompt and answer tokens (None
where a server does not say), whether a constraint was enforced, whether it came from the answer cache,
and, for a choice read from probabilities, each option's probability and their expected value. No
caller reads state left on a backend.

**Structured outputs.** ``generate(..., constraint=...)`` makes every answer follow a ``Constraint``:

- ``Constraint.answer(n)``: the renderer's answer format (``stars: S`` with S in 1-5, a newline,
  ``review: `` and 1 to n characters without a newline, then the end), so training and inference keep
  one format and a looping small model still closes its review;
- ``Constraint.json(schema)``: a JSON schema, decoded in the order its properties are written (a
  rationale written first is decoded first); the answer cache keys it in that order too;
- ``Constraint.choice(options)``: exactly one of fixed strings.

``hf`` enforces them with llguidance (``GrammarProcessor``, a logits processor over transformers'
``generate``; why llguidance: docs/dependencies.md), ``vllm`` with its own structured outputs, ``openai``
with ``response_format`` (a JSON schema: the answer format is asked as {"stars", "review"} and written
back as the two lines). A server that refuses ``response_format`` is asked without it from then on, and
the answers are parsed (and retried) as before; their records say ``constrained=False``.

**Choices from probabilities.** ``option_probs(backend, conversations, options)`` gives, for each prompt,
the normalised probability of each option (digits, item numbers, yes/no) and, when every option is a
number, their expected value: a rating read as 3.6 where the most likely digit is 4, not the first
digit a small model copies from "from 1 to 5". ``hf``: one forward pass over the prompts (options of
one token) or one more over the options (longer ones); ``vllm``: the log-probabilities of each option's
tokens after the prompt (``prompt_logprobs``); ``openai``: the first answer token's ``top_logprobs``,
when every option is one token. A server that returns no log-probabilities, or options it cannot read
that way, fall back to ``samples`` sampled answers under a choice constraint: the records say
``probs_from="samples"`` and the callers count them. A backend without ``option_probs`` (a scripted test
backend) takes the same fallback.

**Decoding is explicit.** Every setting of ``Sampling`` (max tokens, temperature, top_p, repetition
penalty, no-repeat n-gram) reaches every backend; nothing else applies. ``hf`` sets the model's
``generation_config`` aside when it loads (what it asked is in ``info["model_generation_config"]``),
``vllm`` builds every ``SamplingParams`` in full, ``openai`` sends the standard fields and, with
``decoding_fields: vllm``, vLLM's own (``repetition_penalty``, ``top_k``, ``min_p``), so ``vllm serve``
cannot fill in the model's defaults; with ``decoding_fields: vllm`` a constraint goes in vLLM's own
terms too (``structured_outputs``: the two-line answer as a regular expression, a choice's options, a
JSON schema), where a standard server is asked for a JSON schema (``response_format``). A control a backend cannot apply is refused (``decoding_controls``
lists what each applies): callers ask only for what it has and record the rest.

- ``hf``: transformers (+ an optional PEFT adapter), batched left-padded generation, greedy when
  temperature is 0; ``score`` gives the log-probability of given answers (options) after a prompt, the
  prompt run once and its cache shared by the options (the sandbox's score decisions);
- ``vllm``: vLLM's offline engine, with a LoRA request when an adapter is given (``max_lora_rank`` read
  from the adapter's config); vLLM is imported only when this backend is used;
- ``openai``: any OpenAI-compatible endpoint (a vLLM server, a hosted model). The key comes from the
  environment variable named by ``api_key_env``; several keys (``api_key_env: KEY_A,KEY_B``, one variable
  each) take the requests in turn, ``concurrency`` × keys at once (a hosted model's rate limit is per
  key); requests run with a per-request timeout, and the client's retries with exponential backoff
  on 429, 5xx and timeouts.

**Answer cache.** ``answer_cache: PATH`` (a SQLite file) keeps every greedy answer (temperature 0) a
backend gives, so a second run asking the same backend the same conversation with the same settings
gets the first run's answer instead of generating it again (eval.review.suite: ``tuned`` and ``tuned-mbr`` ask
the same greedy answers and blend stars). The key is everything the answer depends on: the backend's
identity (backend, model, the model's files by name, size and time, from its folder or its snapshot
in the local Hugging Face cache, the adapter's digest and its tokenizer files, device, adapter on or
off, the library versions, this file's digest, so a change to the decoding code asks again), the
conversation and its rendered prompt, the sampling settings (not the seed or top_p, which change no
greedy answer) and the constraint. Sampled answers are never kept (they depend on the batch's random
stream). An openai model is known by its served name only (a warning says so). A kept answer's record
says ``cached=True`` (the agents count it; ``count_usage`` counts no tokens for it). In float32 greedy
answers do not depend on the batch they were made in (tests/test_agents.py on the CPU,
tests/test_gpu.py on CUDA); in bf16 on a GPU left padding can flip a near-tie, so a cached answer can
differ from what another batch would give, as answers from two batch sizes can. So the cache is an
execution setting, like the batch size: it is left out of run fingerprints.

``adapter_off()`` runs a block on the base model alone (hf, vllm).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import sqlite3
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import lru_cache, partial
from pathlib import Path

from data_prep.offline_models import resolve_model
from data_prep.prompt import render_prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """One answer of a backend: what it says and how it came about."""

    text: str
    cut_short: bool = False  # stopped at max_new_tokens rather than at its end
    prompt_tokens: int | None = None  # None where a server does not say
    answer_tokens: int | None = None
    constrained: bool = False  # asked for a constraint, and the backend enforced it
    cached: bool = False  # from the answer cache: it cost no tokens now
    # a choice read from probabilities (``option_probs``): option -> probability (summing to 1)
    probs: dict[str, float] | None = None
    expected: float | None = None  # numeric options: the expected value under ``probs``
    probs_from: str | None = None  # logprobs | top_logprobs | samples


def count_usage(answers: list[Answer], counts: Counter) -> None:
    """Add the answers' prompt and answer tokens to the counts; an answer from the answer cache cost
    none: it is counted as ``cached_answers`` instead."""
    for answer in answers:
        if answer.cached:
            counts["cached_answers"] += 1
            continue
        counts["prompt_tokens"] += answer.prompt_tokens or 0  # a server may leave either number out
        counts["answer_tokens"] += answer.answer_tokens or 0


@lru_cache(maxsize=256)
def schema_validator(constraint: Constraint):
    """A checked validator for a constraint's JSON schema, built once per constraint (it is frozen, so
    equal constraints share one): jsonschema.validate checks the schema itself against its meta-schema
    on every call, 12 ms an answer, most of a sandbox round's own time (bench.sandbox_bench efficiency)."""
    import jsonschema

    schema = constraint.json_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@dataclass(frozen=True)
class Constraint:
    """What every answer must look like; see the module docstring."""

    kind: str  # answer | json | choice
    max_chars: int = 400
    schema: str | None = None  # json: the schema as JSON text in its written order (hashable)
    options: tuple[str, ...] = ()

    @staticmethod
    def answer(max_chars: int = 400) -> Constraint:
        if max_chars < 1:
            raise ValueError("the review needs room for at least one character")
        return Constraint("answer", max_chars=max_chars)

    @staticmethod
    def review(max_chars: int = 400) -> Constraint:
        """The rest of an answer whose stars were given (data_prep.prompt.answer_beginning): one line of
        review text."""
        if max_chars < 1:
            raise ValueError("the review needs room for at least one character")
        return Constraint("review", max_chars=max_chars)

    @staticmethod
    def json(schema: dict) -> Constraint:
        """A JSON schema, kept in the order it is written: decoding writes its properties in that order."""
        if not isinstance(schema, dict) or not schema:
            raise ValueError("a JSON constraint needs a schema (a non-empty dict)")
        if schema.get("type") == "object" and not schema.get("properties"):
            raise ValueError("a JSON object schema needs properties: without them the answer is unbounded")
        return Constraint("json", schema=json.dumps(schema))

    @staticmethod
    def json_object(**properties: dict) -> Constraint:
        """A JSON object with exactly these properties (JSON schemas), all required, in this order."""
        return Constraint.json(
            {
                "type": "object",
                "properties": properties,
                "required": list(properties),
                "additionalProperties": False,
            }
        )

    @staticmethod
    def choice(options: list[str]) -> Constraint:
        return Constraint("choice", options=tuple(check_options(options)))

    def regex(self) -> str:
        """The answer format as a regular expression."""
        if self.kind == "review":
            return f"[^\\n]{{1,{self.max_chars}}}"
        if self.kind != "answer":
            raise ValueError(f"a {self.kind} constraint is not a regular expression")
        return f"stars: [1-5]\\nreview: [^\\n]{{1,{self.max_chars}}}"

    def llguidance(self) -> str:
        """The constraint as an llguidance grammar."""
        import llguidance

        if self.kind in ("answer", "review"):
            return llguidance.LLMatcher.grammar_from_regex(self.regex())
        if self.kind == "choice":
            return llguidance.grammar_from("choice", json.dumps(list(self.options)))
        return llguidance.LLMatcher.grammar_from_json_schema(
            self.schema, defaults={"whitespace_flexible": False}
        )

    def json_schema(self) -> dict:
        """The JSON schema a backend that only offers JSON is asked for (in its written order)."""
        if self.kind == "json":
            return json.loads(self.schema)
        if self.kind == "answer":
            properties = {
                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                "review": {"type": "string", "minLength": 1, "maxLength": self.max_chars},
            }
            required = ["stars", "review"]
        elif self.kind == "review":
            properties = {"review": {"type": "string", "minLength": 1, "maxLength": self.max_chars}}
            required = ["review"]
        else:
            properties, required = {"choice": {"type": "string", "enum": list(self.options)}}, ["choice"]
        return {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }

    def parse(self, text: str) -> dict | None:
        """A JSON answer as a dict when it is valid under this constraint's schema (types, ranges,
        enums, lengths: jsonschema's validation), else None. Backends that enforce the schema make
        this a formality; a server without structured outputs (or a fallback to plain parsing) does
        not, and an invalid answer must become the caller's counted fallback, never a crash or a
        string "None"."""
        import jsonschema

        try:
            value = json.loads(text)
        except (json.JSONDecodeError, TypeError):
            return None
        try:
            schema_validator(self).validate(value)
        except jsonschema.ValidationError:
            return None
        return value

    def holds(self, text: str) -> bool:
        """Whether an answer is what this constraint allows (a server that ignored the constraint is
        found out this way, not trusted)."""
        if self.kind in ("answer", "review"):
            return re.fullmatch(self.regex(), text) is not None
        if self.kind == "choice":
            return text.strip() in self.options
        return self.parse(text) is not None

    def from_json(self, text: str) -> str:
        """A JSON answer written back as this constraint's text (unparsable JSON is returned as is)."""
        if self.kind == "json":
            return text
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return text
        if not isinstance(value, dict):
            return text
        if self.kind == "answer":
            return f"stars: {value.get('stars')}\nreview: {value.get('review')}"
        if self.kind == "review":
            return f" {value.get('review')}"
        return str(value.get("choice"))


def check_options(options: list[str]) -> list[str]:
    """Options of a choice: at least one, each a non-empty string, no two alike."""
    options = list(options)
    if not options:
        raise ValueError("a choice needs options")
    if not all(isinstance(o, str) and o for o in options):
        raise ValueError(f"every option of a choice must be a non-empty string: {options!r}")
    if len(set(options)) != len(options):
        twice = sorted({o for o in options if options.count(o) > 1})
        raise ValueError(f"the options of a choice must differ: {twice} appear more than once")
    return options


@dataclass(frozen=True)
class Sampling:
    """How a call decodes. Every field reaches every backend (module docstring); neutral by default."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    # controls against loops, where a backend has them (its ``decoding_controls``)
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    def controls(self) -> list[str]:
        """The loop controls this sampling asks for (those away from neutral)."""
        return [
            name
            for name, on in (
                ("repetition_penalty", self.repetition_penalty != 1.0),
                ("no_repeat_ngram_size", self.no_repeat_ngram_size > 0),
            )
            if on
        ]

    def settings(self) -> dict:
        """What a run's provenance records of it: everything but the seed (varied per call)."""
        return {k: v for k, v in asdict(self).items() if k != "seed"}


def refuse_missing_controls(backend, sampling: Sampling) -> None:
    """A clear error when a sampling asks for a loop control the backend cannot apply (never a silent
    no-op): the caller asks only for what ``decoding_controls`` lists, and records the rest."""
    missing = [c for c in sampling.controls() if c not in backend.decoding_controls]
    if missing:
        name = getattr(backend, "info", {}).get("backend", type(backend).__name__)
        raise ValueError(
            f"the {name} backend cannot apply {', '.join(missing)} (it applies "
            f"{', '.join(backend.decoding_controls) or 'none'}): leave it neutral for this backend"
        )


def continues_answer(conversations: list[list[dict]]) -> bool:
    """Whether the conversations give their answers' beginning (an assistant message last, which the
    model continues: data_prep.prompt.render_prompt); all of one call alike."""
    begun = {bool(c) and c[-1]["role"] == "assistant" for c in conversations}
    if len(begun) > 1:
        raise ValueError("in one call either every conversation gives its answer's beginning or none does")
    return begun == {True}


def normalise(logprobs: list[float]) -> list[float]:
    """Probabilities from log-probabilities, summing to 1 (a softmax)."""
    top = max(logprobs)
    weights = [math.exp(x - top) for x in logprobs]
    total = sum(weights)
    return [w / total for w in weights]


def numeric(options: list[str]) -> list[float] | None:
    """The options as numbers, when every one is a number; else None."""
    try:
        return [float(o) for o in options]
    except ValueError:
        return None


def choice_answer(options: list[str], probs: list[float], probs_from: str, **usage) -> Answer:
    """The record of a choice read from probabilities: the most likely option as its text (ties to the
    first), each option's probability and, for numeric options, the expected value."""
    values = numeric(options)
    best = max(range(len(options)), key=lambda i: (probs[i], -i))
    return Answer(
        options[best],
        constrained=True,
        probs=dict(zip(options, probs, strict=True)),
        expected=sum(v * p for v, p in zip(values, probs, strict=True)) if values else None,
        probs_from=probs_from,
        **usage,
    )


def sampled_choices(
    backend, conversations: list[list[dict]], options: list[str], samples: int, seed: int
) -> list[Answer]:
    """The fallback where no log-probabilities can be read: ``samples`` answers per prompt at
    temperature 1 under a choice constraint, each option's probability its share of them (labelled
    ``probs_from="samples"``). Answers outside the options (a backend that could not enforce the
    choice) are left out of the shares; a prompt with none of them gets no probabilities."""
    if samples < 1:
        raise ValueError("the sampled fallback of a choice needs samples >= 1")
    sampling = Sampling(max_new_tokens=max(8, 4 * max(len(o) for o in options)), temperature=1.0, seed=seed)
    asked = [c for c in conversations for _ in range(samples)]
    answers = backend.generate(asked, sampling, Constraint.choice(options)) if asked else []
    out = []
    for i in range(len(conversations)):
        mine = answers[i * samples : (i + 1) * samples]
        picked = Counter(a.text.strip() for a in mine)
        inside = sum(picked[o] for o in options)
        usage = {
            "prompt_tokens": sum(a.prompt_tokens or 0 for a in mine),
            "answer_tokens": sum(a.answer_tokens or 0 for a in mine),
        }
        if inside == 0:
            out.append(Answer("", probs=None, probs_from="samples", **usage))
            continue
        out.append(choice_answer(options, [picked[o] / inside for o in options], "samples", **usage))
    return out


def option_probs(
    backend,
    conversations: list[list[dict]],
    options: list[str],
    samples: int = 8,
    seed: int = 0,
    prefix: str = "",
) -> list[Answer]:
    """The shared choice call (module docstring): for each prompt, each option's probability and their
    expected value, from the backend's probabilities where it has them, else from ``samples`` sampled
    answers (labelled). ``options`` are the same for every prompt; ``prefix`` is the beginning of the
    answer the option follows ("stars: "): a backend that cannot continue one gives no probabilities
    there (``probs_from="unavailable"``), for the caller to count."""
    options = check_options(options)
    if not conversations:
        return []
    own = getattr(backend, "option_probs", None)
    if own is not None:
        return own(conversations, options, samples=samples, seed=seed, prefix=prefix)
    if prefix:
        return [Answer("", probs_from="unavailable") for _ in conversations]
    return sampled_choices(backend, conversations, options, samples, seed)


def continues_answers(backend) -> bool:
    """Whether ``option_probs`` can read a choice after an answer's given beginning (its ``prefix``): a
    backend that says so itself (openai: only a vLLM server), else one with its own ``option_probs``
    (hf, vllm). Elsewhere such a choice is unavailable."""
    said = getattr(backend, "continues_answers", None)
    return said if said is not None else getattr(backend, "option_probs", None) is not None


def read_choice(answer: Answer, mode: str) -> float | None:
    """A numeric choice as the caller's ``mode`` reads it: ``expected`` the expected value, ``greedy``
    the most likely option; None for an answer without probabilities (its caller's counted fallback)."""
    if mode not in ("expected", "greedy"):
        raise ValueError(f"a rating is read greedy or expected, not {mode!r}")
    if answer.probs is None:
        return None
    return answer.expected if mode == "expected" else float(answer.text)


# LLMConfig settings that change how fast answers come, not what they are: run fingerprints leave them out
EXECUTION_FIELDS = (
    "generation_batch_size",
    "device",
    "concurrency",
    "timeout_s",
    "max_retries",
    "answer_cache",
)


@dataclass
class LLMConfig:
    backend: str = "hf"  # hf | vllm | openai
    model: str = "smollm2-135m-instruct-offline"  # hub id, local folder, or the offline SmolLM2 alias
    adapter: str | None = None  # a LoRA adapter folder (train.sft output)
    generation_batch_size: int = 8  # hf: rows generated together
    device: str = "auto"
    answer_cache: str | None = None  # a SQLite file that keeps greedy answers (see the module docstring)
    # openai
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"  # several keys: variable names separated by commas
    concurrency: int = 8
    timeout_s: float = 60.0
    max_retries: int = 5
    # openai: which decoding fields the server takes: standard (the OpenAI API's) or vllm (also
    # repetition_penalty, top_k and min_p, sent in full so `vllm serve` cannot fill in the model's own
    # defaults, and continue_final_message for an answer whose beginning is given)
    decoding_fields: str = "standard"
    # openai: the served model's tokenizer (hub id, folder or offline alias), so prompts are fitted to
    # prompt_tokens exactly as the training pairs were; without it prompts are not fitted (a warning)
    tokenizer: str | None = None
    # vllm
    gpu_memory_utilization: float = 0.85
    tensor_parallel_size: int = 1  # GPUs one engine spans
    max_model_len: int | None = None  # the engine's context (prompt + answer); None: the model's own


class GrammarProcessor:
    """transformers logits processor that lets each row of a batch continue only with tokens its
    llguidance matcher allows (one matcher per row; for one generate call). llguidance ships the
    matcher, not this glue. Unlike a plain regex-to-token mask, it keeps fixed text in the tokenizer's
    usual tokenization, which keeps a small model on its normal path (bench/README.md)."""

    def __init__(self, lltokenizer, grammar: str, vocab_size: int):
        self.lltokenizer, self.grammar, self.vocab_size = lltokenizer, grammar, vocab_size
        self.matchers = None

    def __call__(self, input_ids, scores):
        import llguidance
        import llguidance.torch
        import torch

        rows = input_ids.shape[0]
        if self.matchers is None:  # the first step: nothing generated yet
            self.matchers = [llguidance.LLMatcher(self.lltokenizer, self.grammar) for _ in range(rows)]
            self.mask = llguidance.torch.allocate_token_bitmask(rows, self.vocab_size)
        else:
            for row, matcher in enumerate(self.matchers):  # a finished row is fed padding: ignored
                if not matcher.is_stopped() and not matcher.consume_token(int(input_ids[row, -1])):
                    raise RuntimeError(f"the grammar refused a token it allowed: {matcher.get_error()}")
        for row, matcher in enumerate(self.matchers):
            llguidance.torch.fill_next_token_bitmask(matcher, self.mask, row)  # stopped: end of text only
        bits = (self.mask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
        allowed = bits.reshape(rows, -1)[:, : scores.shape[1]].bool().to(scores.device)
        return scores.masked_fill(~allowed, float("-inf"))


def adapter_base(adapter: str) -> str | None:
    """The base model an adapter was trained on: the name train.sft was given (training_card.json), else
    the path or hub id PEFT recorded (adapter_config.json); None when neither says."""
    folder = Path(adapter)
    for name, key in (
        ("training_card.json", "base_model"),
        ("adapter_config.json", "base_model_name_or_path"),
    ):
        if (folder / name).exists() and (base := json.loads((folder / name).read_text()).get(key)):
            return base
    return None


def warn_other_base(model: str, path: str, adapter: str) -> None:
    """A warning when ``model`` (resolved: ``path``) is named differently from the adapter's base. Not
    an error: a local snapshot of the same hub model is named differently and fits; one that does not
    fit fails to load, with the error of ``load_adapter``."""
    base = adapter_base(adapter)
    if base and base not in (model, path) and Path(base).resolve() != Path(path).resolve():
        log.warning("the adapter %s was trained on %s; loading it on %s", adapter, base, model)


def load_adapter(model, name: str, adapter: str):
    """PEFT's adapter on ``model``; an adapter from another architecture is refused naming its base."""
    from peft import PeftModel

    try:
        return PeftModel.from_pretrained(model, adapter)
    except RuntimeError as error:
        if "size mismatch" not in str(error):
            raise
        base = adapter_base(adapter)
        raise SystemExit(
            f"error: the adapter {adapter} does not fit {name}: it was trained on {base}. Give that model "
            f"(model: in the agent config; eval.review.suite --set model={base})"
        ) from None


class HFBackend:
    def __init__(self, config: LLMConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model(config.model)
        if config.adapter:
            warn_other_base(config.model, path, config.adapter)
        device = (
            config.device if config.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        )
        self.tokenizer = AutoTokenizer.from_pretrained(config.adapter or path)
        self.tokenizer.padding_side = "left"  # generation continues the right end of every row
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        asked = neutral_generation_config(model, self.tokenizer)
        if config.adapter:
            model = load_adapter(model, config.model, config.adapter)
        self.model = model.to(device).eval()
        self.batch_size = config.generation_batch_size
        self.info = {
            "backend": "hf",
            "model": config.model,
            "adapter": config.adapter,
            "device": device,
            "model_generation_config": asked,  # set aside: decoding comes from Sampling alone
        }
        self._lltokenizer, self._grammars = None, {}

    decoding_controls = ("repetition_penalty", "no_repeat_ngram_size")

    @contextmanager
    def adapter_off(self):
        """The base model alone inside this block (PEFT's disable_adapter); no-op without an adapter.
        Blocks nest: an inner one leaves the adapter off when it ends inside an outer one."""
        if getattr(self, "_off", False) or not hasattr(self.model, "disable_adapter"):
            yield
            return
        self._off = True
        try:
            with self.model.disable_adapter():
                yield
        finally:
            self._off = False

    def score(
        self,
        conversations: list[list[dict]],
        options: list[list[str]],
        max_rows: int = 64,
        end: bool = True,
        prefix: str = "",
    ) -> list[list[tuple[float, int]]]:
        """For each conversation and each of its options: (log-probability, tokens) of the answer
        ``prefix + option`` (followed by the end of turn when ``end``), given the conversation's rendered
        prompt; the prefix is given, not scored. Each prompt is run once; its key-value cache is shared by
        its options, which run together in one more forward pass (``max_rows`` options at most per pass,
        whole prompts' worth)."""
        import torch

        device = self.model.device
        eos = self.tokenizer.eos_token if end else ""
        encoded = [
            [self.tokenizer(t + eos, add_special_tokens=False)["input_ids"] for t in o] for o in options
        ]
        if any(not x for group in encoded for x in group):
            raise ValueError("an option the tokenizer turns into no tokens cannot be scored")
        out: list[list[tuple[float, int]]] = []
        start = 0
        while start < len(conversations):
            end = start + 1  # whole prompts, at most batch_size of them and max_rows options (at least one)
            while (
                end < len(conversations)
                and end - start < self.batch_size
                and sum(len(o) for o in options[start : end + 1]) <= max_rows
            ):
                end += 1
            batch = self.encode(conversations[start:end], prefix).to(device)
            mask = batch["attention_mask"]
            with torch.no_grad():
                first = self.model(
                    input_ids=batch["input_ids"],
                    attention_mask=mask,
                    position_ids=(mask.cumsum(-1) - 1).clamp(min=0),  # left padding: positions from 0
                    use_cache=True,
                    logits_to_keep=1,
                )
            head = torch.log_softmax(first.logits[:, -1].float(), dim=-1)  # the first answer token
            rows = [i for i in range(end - start) for _ in encoded[start + i]]
            ids = [x for group in encoded[start:end] for x in group]
            if not ids:
                out += [[] for _ in range(start, end)]
                start = end
                continue
            width = max(len(x) for x in ids)
            tokens = torch.full((len(ids), width), self.tokenizer.pad_token_id, dtype=torch.long)
            own = torch.zeros((len(ids), width), dtype=torch.long)
            for k, x in enumerate(ids):
                tokens[k, : len(x)] = torch.tensor(x)
                own[k, : len(x)] = 1
            index = torch.tensor(rows, device=device)
            cache = first.past_key_values
            cache.batch_select_indices(index)
            prompt_mask = mask[index]
            positions = prompt_mask.sum(-1, keepdim=True) + torch.arange(width, device=device)
            with torch.no_grad():
                logits = self.model(
                    input_ids=tokens.to(device),
                    attention_mask=torch.cat([prompt_mask, own.to(device)], dim=1),
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=False,
                ).logits.float()
            logp = torch.log_softmax(logits, dim=-1).cpu()
            head = head[index].cpu()
            results = []
            for k, x in enumerate(ids):
                total = float(head[k, x[0]]) + sum(float(logp[k, j - 1, x[j]]) for j in range(1, len(x)))
                results.append((total, len(x)))
            for i in range(end - start):
                out.append([r for r, row in zip(results, rows, strict=True) if row == i])
            start = end
        return out

    def processor(self, constraint: Constraint):
        """A fresh logits processor for one generate call (it keeps per-row state)."""
        import llguidance.hf

        if self._lltokenizer is None:  # about 0.5 s, once
            self._lltokenizer = llguidance.hf.from_tokenizer(
                self.tokenizer, n_vocab=self.model.config.vocab_size, eos_token=self.tokenizer.eos_token_id
            )
        if constraint not in self._grammars:
            self._grammars[constraint] = constraint.llguidance()
        return GrammarProcessor(self._lltokenizer, self._grammars[constraint], self.model.config.vocab_size)

    def encode(self, conversations: list[list[dict]], prefix: str = ""):
        """The token ids the model is fed: the chat template's text (it writes any BOS itself) and the
        answer's given beginning (``prefix``), left-padded."""
        texts = [render_prompt(self.tokenizer, c) + prefix for c in conversations]
        return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    def option_probs(
        self,
        conversations: list[list[dict]],
        options: list[str],
        samples: int = 8,
        seed: int = 0,
        prefix: str = "",
    ) -> list[Answer]:
        """Each option's probability after each prompt (and the answer's given beginning ``prefix``):
        the log-probabilities of the option's tokens, normalised over the options. Options of one
        token each are read off the prompts' forward pass alone."""
        options = check_options(options)
        ids = [self.tokenizer(o, add_special_tokens=False)["input_ids"] for o in options]
        if all(len(x) == 1 for x in ids) and len({x[0] for x in ids}) == len(ids):
            scored = self.next_token_logprobs(conversations, [x[0] for x in ids], prefix)
        else:
            scored = [
                [lp for lp, _ in row]
                for row in self.score(conversations, [options] * len(conversations), end=False, prefix=prefix)
            ]
        prompt_tokens = self.encode(conversations, prefix)["attention_mask"].sum(dim=1).tolist()
        return [
            choice_answer(options, normalise(row), "logprobs", prompt_tokens=n, answer_tokens=0)
            for row, n in zip(scored, prompt_tokens, strict=True)
        ]

    def next_token_logprobs(
        self, conversations: list[list[dict]], token_ids: list[int], prefix: str = ""
    ) -> list[list[float]]:
        """The log-probability of each of ``token_ids`` as the next token after each prompt (and
        ``prefix``), in batches of ``batch_size`` prompts, one forward pass each."""
        import torch

        out = []
        for start in range(0, len(conversations), self.batch_size):
            batch = self.encode(conversations[start : start + self.batch_size], prefix).to(self.model.device)
            mask = batch["attention_mask"]
            with torch.no_grad():
                logits = (
                    self.model(
                        input_ids=batch["input_ids"],
                        attention_mask=mask,
                        position_ids=(mask.cumsum(-1) - 1).clamp(min=0),  # left padding: positions from 0
                        logits_to_keep=1,
                    )
                    .logits[:, -1]
                    .float()
                )
            logp = torch.log_softmax(logits, dim=-1)[:, token_ids].cpu()
            out += logp.tolist()
        return out

    def generate(
        self, conversations: list[list[dict]], sampling: Sampling, constraint: Constraint | None = None
    ) -> list[Answer]:
        import torch

        refuse_missing_controls(self, sampling)
        torch.manual_seed(sampling.seed)
        outputs: list[Answer] = []
        for start in range(0, len(conversations), self.batch_size):
            batch = self.encode(conversations[start : start + self.batch_size]).to(self.model.device)
            kwargs = {  # every setting explicit: the model's generation_config was set aside at load
                "do_sample": sampling.temperature > 0,
                "repetition_penalty": sampling.repetition_penalty,
                "no_repeat_ngram_size": sampling.no_repeat_ngram_size,
            }
            if sampling.temperature > 0:
                kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
            if constraint is not None:
                from transformers import LogitsProcessorList

                kwargs["logits_processor"] = LogitsProcessorList([self.processor(constraint)])
            with torch.no_grad():
                generated = self.model.generate(
                    **batch,
                    max_new_tokens=sampling.max_new_tokens,
                    pad_token_id=self.tokenizer.pad_token_id,
                    eos_token_id=self.tokenizer.eos_token_id,
                    **kwargs,
                )
            new = generated[:, batch["input_ids"].shape[1] :]
            texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
            ended = new == self.tokenizer.eos_token_id
            # answer tokens up to and including the first end token (the rest is padding)
            lengths = torch.where(ended.any(dim=1), ended.int().argmax(dim=1) + 1, new.shape[1])
            outputs += [
                Answer(text, not stopped, prompt, length, constrained=constraint is not None)
                for text, stopped, prompt, length in zip(
                    texts,
                    ended.any(dim=1).tolist(),
                    batch["attention_mask"].sum(dim=1).tolist(),
                    lengths.tolist(),
                    strict=True,
                )
            ]
        return outputs


# what a model's generation_config may ask that changes answers; neutral_generation_config sets it aside
DECODING_KEYS = (
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "repetition_penalty",
    "no_repeat_ngram_size",
    "length_penalty",
    "num_beams",
)


def neutral_generation_config(model, tokenizer) -> dict:
    """Replace the model's ``generation_config`` with a neutral one that keeps only its special token
    ids, so no decoding default of the model's (Qwen2.5-Instruct's 1.05 repetition penalty, say)
    applies silently; returns what the model's own config asked."""
    from transformers import GenerationConfig

    own = model.generation_config.to_diff_dict() if model.generation_config is not None else {}
    asked = {k: own[k] for k in DECODING_KEYS if k in own}
    ids = {k: own.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    ids["pad_token_id"] = ids["pad_token_id"] if ids["pad_token_id"] is not None else tokenizer.pad_token_id
    model.generation_config = GenerationConfig(**{k: v for k, v in ids.items() if v is not None})
    if asked:
        log.info("decoding from Sampling alone; the model's generation_config asked %s (set aside)", asked)
    return asked


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the values vLLM's max_lora_rank accepts


def vllm_lora_rank(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds an adapter of this rank."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})")


class VLLMBackend:
    def __init__(self, config: LLMConfig):
        from vllm import LLM

        self.lora = None
        kwargs = {}
        if config.adapter:
            from vllm.lora.request import LoRARequest

            warn_other_base(config.model, resolve_model(config.model), config.adapter)
            rank = json.loads((Path(config.adapter) / "adapter_config.json").read_text())["r"]
            kwargs.update(enable_lora=True, max_lora_rank=vllm_lora_rank(rank))
            self.lora = LoRARequest("adapter", 1, str(config.adapter))
        if config.max_model_len:
            kwargs["max_model_len"] = config.max_model_len
        self.engine = LLM(
            model=resolve_model(config.model),
            gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=config.tensor_parallel_size,
            **kwargs,
        )
        self.tokenizer = self.engine.get_tokenizer()  # the engine's own: prompts fitted as in training
        self.info = {
            "backend": "vllm",
            "model": config.model,
            "adapter": config.adapter,
            "tensor_parallel_size": config.tensor_parallel_size,
            "max_model_len": config.max_model_len,
        }

    decoding_controls = ("repetition_penalty",)

    @contextmanager
    def adapter_off(self):
        """The base model alone inside this block (no LoRA request)."""
        lora, self.lora = self.lora, None
        try:
            yield
        finally:
            self.lora = lora

    def generate(
        self, conversations: list[list[dict]], sampling: Sampling, constraint: Constraint | None = None
    ) -> list[Answer]:
        from vllm import SamplingParams

        refuse_missing_controls(self, sampling)
        extra = {}
        if constraint is not None:
            from vllm.sampling_params import StructuredOutputsParams

            if constraint.kind == "json":
                structured = StructuredOutputsParams(json=constraint.json_schema())
            elif constraint.kind == "choice":
                structured = StructuredOutputsParams(choice=list(constraint.options))
            else:
                structured = StructuredOutputsParams(regex=constraint.regex())
            extra["structured_outputs"] = structured
        # one seed per request (seed + its index), so identical prompts in a batch (several samples of
        # one prompt) sample independently, as the hf backend's rows do
        params = [
            SamplingParams(
                max_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                repetition_penalty=sampling.repetition_penalty,
                seed=sampling.seed + i,
                **extra,
            )
            for i in range(len(conversations))
        ]
        begun = continues_answer(conversations)  # each continues its given answer beginning
        outputs = self.engine.chat(
            conversations,
            params,
            lora_request=self.lora,
            use_tqdm=False,
            add_generation_prompt=not begun,
            continue_final_message=begun,
        )
        return [
            Answer(
                o.outputs[0].text,
                o.outputs[0].finish_reason == "length",
                len(o.prompt_token_ids),
                len(o.outputs[0].token_ids),
                constrained=constraint is not None,
            )
            for o in outputs
        ]

    def option_probs(
        self,
        conversations: list[list[dict]],
        options: list[str],
        samples: int = 8,
        seed: int = 0,
        prefix: str = "",
    ) -> list[Answer]:
        """Each option's probability after each prompt (and ``prefix``): the engine scores the prompt
        followed by each option (``prompt_logprobs``: the log-probability of every prompt token),
        normalised over the options. vLLM does not reuse its prefix cache for a request that asks for
        prompt log-probabilities, so this costs one prefill per option (five for a rating)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        options = check_options(options)
        option_ids = [self.tokenizer.encode(o, add_special_tokens=False) for o in options]
        if any(not x for x in option_ids):
            raise ValueError("an option the tokenizer turns into no tokens cannot be scored")
        requests, spans = [], []
        for conversation in conversations:
            text = render_prompt(self.tokenizer, conversation) + prefix
            base = self.tokenizer.encode(text, add_special_tokens=False)
            for ids in option_ids:
                requests.append(TokensPrompt(prompt_token_ids=base + ids))
                spans.append((len(base), ids))
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
        outputs = self.engine.generate(requests, params, lora_request=self.lora, use_tqdm=False)
        totals = [
            sum(o.prompt_logprobs[start + j][token].logprob for j, token in enumerate(ids))
            for o, (start, ids) in zip(outputs, spans, strict=True)
        ]
        n = len(options)
        return [
            choice_answer(
                options,
                normalise(totals[i * n : (i + 1) * n]),
                "logprobs",
                prompt_tokens=spans[i * n][0],
                answer_tokens=0,
            )
            for i in range(len(conversations))
        ]


def usage(response) -> tuple[int | None, int | None]:
    """(prompt tokens, answer tokens) as the server reports them; None for what it does not."""
    if response.usage is None:
        return None, None
    return response.usage.prompt_tokens, response.usage.completion_tokens


def vllm_structured(constraint: Constraint) -> dict:
    """A constraint in vLLM's own terms (its ``structured_outputs``, as the offline backend builds them)."""
    if constraint.kind == "json":
        return {"json": constraint.json_schema()}
    if constraint.kind == "choice":
        return {"choice": list(constraint.options)}
    return {"regex": constraint.regex()}


class OpenAIBackend:
    TOP_LOGPROBS = 20  # the most the OpenAI API returns per token

    def __init__(self, config: LLMConfig):
        from openai import OpenAI

        if config.decoding_fields not in ("standard", "vllm"):
            raise ValueError(f"decoding_fields is standard or vllm, not {config.decoding_fields!r}")
        self.fields = config.decoding_fields
        # the API's frequency and presence penalties are another thing: a standard server applies no
        # loop control; vLLM's server takes its repetition penalty
        self.decoding_controls = ("repetition_penalty",) if self.fields == "vllm" else ()

        names = [name.strip() for name in config.api_key_env.split(",") if name.strip()]
        missing = [name for name in names if not os.environ.get(name)]
        if missing or not names:
            raise SystemExit(
                f"error: set the API key in the environment variable {', '.join(missing or names)}"
            )
        self.clients = [  # one per key; request i goes to client i mod keys
            OpenAI(
                base_url=config.base_url,
                api_key=os.environ[name],
                timeout=config.timeout_s,
                max_retries=config.max_retries,
            )
            for name in names
        ]
        self.model, self.concurrency = config.model, config.concurrency
        self.tokenizer = None
        if config.tokenizer:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(resolve_model(config.tokenizer))
        else:
            log.warning(
                "no tokenizer for %s (set tokenizer: in the config): prompts are not fitted to prompt_tokens",
                config.model,
            )
        self.info = {  # never the key
            "backend": "openai",
            "model": config.model,
            "base_url": config.base_url,
            "tokenizer": config.tokenizer,
            "keys": len(self.clients),
            "decoding_fields": self.fields,
        }
        self.structured = True  # until the server refuses response_format
        self.warned_unconstrained = False
        self.logprobs = True  # until the server returns none

    def request(self, conversation: list[dict], sampling: Sampling, index: int) -> dict:
        """A chat request with every decoding setting explicit (vLLM's own fields too, where the server
        is vLLM's, so it fills in none of the model's defaults)."""
        request = {
            "model": self.model,
            "messages": conversation,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed + index,  # per request: identical prompts sample independently
        }
        if self.fields == "vllm":
            request["extra_body"] = {
                "repetition_penalty": sampling.repetition_penalty,
                "top_k": -1,
                "min_p": 0.0,
            }
        if continues_answer([conversation]):
            if self.fields != "vllm":
                raise ValueError(
                    "this conversation gives the answer's beginning (an assistant message last), which only "
                    "vLLM's server continues: set decoding_fields: vllm, or do not decide the stars first"
                )
            request["extra_body"] |= {"continue_final_message": True, "add_generation_prompt": False}
        return request

    def _one(
        self, client, conversation: list[dict], sampling: Sampling, constraint: Constraint | None, index: int
    ) -> Answer:
        from openai import BadRequestError

        request = self.request(conversation, sampling, index)
        if constraint is not None and self.structured and self.fields == "vllm":
            # vLLM's server takes the constraint as it is (structured_outputs: a regular expression for the
            # two-line answer, the options of a choice, the JSON schema), so an adapter trained on the
            # two-line format is not forced into JSON
            request["extra_body"] = {
                **request["extra_body"],
                "structured_outputs": vllm_structured(constraint),
            }
            try:
                response = client.chat.completions.create(**request)
                choice = response.choices[0]
                text = choice.message.content or ""
                # an older vLLM ignores a field it does not know (with a warning, not an error): the answer
                # is checked, and one outside the constraint is not recorded as constrained
                held = constraint.holds(text) or choice.finish_reason == "length"
                if not held and not self.warned_unconstrained:
                    self.warned_unconstrained = True
                    log.warning(
                        "an answer does not follow the constraint sent as structured_outputs: "
                        "is the server's vLLM older than 0.12?"
                    )
                return Answer(text, choice.finish_reason == "length", *usage(response), constrained=held)
            except BadRequestError as err:
                if "structured_outputs" not in str(err):
                    raise  # another problem with this request (too long, ...): the task's error
                self.structured = False  # an older server: parse and retry instead
                log.warning("the server refused structured_outputs (%s); answers are parsed and retried", err)
                del request["extra_body"]["structured_outputs"]
        if constraint is not None and self.structured:
            schema = {"name": f"{constraint.kind}_answer", "schema": constraint.json_schema(), "strict": True}
            try:
                response = client.chat.completions.create(
                    **request, response_format={"type": "json_schema", "json_schema": schema}
                )
                choice = response.choices[0]
                text = constraint.from_json(choice.message.content or "")
                return Answer(text, choice.finish_reason == "length", *usage(response), constrained=True)
            except BadRequestError as err:
                if not any(word in str(err) for word in ("response_format", "json_schema")):
                    raise  # another problem with this request (too long, ...): the task's error
                self.structured = False  # the server has no structured outputs: parse and retry instead
                log.warning("the server refused response_format (%s); answers are parsed and retried", err)
        response = client.chat.completions.create(**request)
        choice = response.choices[0]
        return Answer(choice.message.content or "", choice.finish_reason == "length", *usage(response))

    def parallel(self, work, items: list) -> list:
        """``work(client, item, index)`` for every item, ``concurrency`` per key at once, keys in turn."""
        clients = [self.clients[i % len(self.clients)] for i in range(len(items))]
        with ThreadPoolExecutor(self.concurrency * len(self.clients)) as pool:
            return list(pool.map(work, clients, items, range(len(items))))

    def generate(
        self, conversations: list[list[dict]], sampling: Sampling, constraint: Constraint | None = None
    ) -> list[Answer]:
        refuse_missing_controls(self, sampling)
        return self.parallel(lambda k, c, i: self._one(k, c, sampling, constraint, i), conversations)

    @property
    def continues_answers(self) -> bool:
        """Whether a choice can be read after an answer's given beginning: only vLLM's server continues
        an answer (``decoding_fields: vllm``)."""
        return self.fields == "vllm"

    def one_token_options(self, options: list[str]) -> bool:
        """Whether every option is one token, so the first answer token's top_logprobs can read it: by
        the configured tokenizer, else (not knowing the server's) only single characters."""
        if self.tokenizer is None:
            return all(len(o) == 1 for o in options)
        return all(len(self.tokenizer.encode(o, add_special_tokens=False)) == 1 for o in options)

    def _top(
        self, client, conversation: list[dict], index: int, seed: int, prefix: str
    ) -> tuple[dict | None, tuple]:
        """The first answer token's top log-probabilities by token text (stripped), or None where the
        server gave none; and the usage."""
        messages = conversation
        request = self.request(messages, Sampling(max_new_tokens=1, seed=seed), index)
        if prefix:  # vLLM's server continues the answer's beginning
            request["messages"] = [*conversation, {"role": "assistant", "content": prefix}]
            request["extra_body"] |= {"continue_final_message": True, "add_generation_prompt": False}
        response = client.chat.completions.create(**request, logprobs=True, top_logprobs=self.TOP_LOGPROBS)
        logprobs = response.choices[0].logprobs
        content = getattr(logprobs, "content", None) if logprobs is not None else None
        if not content or not content[0].top_logprobs:
            return None, usage(response)
        top: dict[str, float] = {}
        for entry in content[0].top_logprobs:  # "4" and " 4" are one option: their probabilities add
            token = entry.token.strip()
            top[token] = (
                math.log(math.exp(top[token]) + math.exp(entry.logprob)) if token in top else entry.logprob
            )
        return top, usage(response)

    def option_probs(
        self,
        conversations: list[list[dict]],
        options: list[str],
        samples: int = 8,
        seed: int = 0,
        prefix: str = "",
    ) -> list[Answer]:
        """Each option's probability from the first answer token's ``top_logprobs`` (options of one
        token); a prompt the server gives none for, or where no option is among them, falls back to
        ``samples`` sampled answers (``probs_from="samples"``). An option outside the top ones counts as
        probability 0. ``prefix`` (the answer's given beginning) needs ``decoding_fields: vllm``."""
        options = check_options(options)
        if prefix and not self.continues_answers:
            raise ValueError(
                "a choice after an answer's beginning needs a server that continues an answer "
                "(decoding_fields: vllm); read this rating greedy instead"
            )
        readable = self.one_token_options(options)
        out: list[Answer | None] = [None] * len(conversations)
        if readable and self.logprobs:
            tops = self.parallel(lambda k, c, i: self._top(k, c, i, seed, prefix), conversations)
            if all(top is None for top, _ in tops):
                self.logprobs = False
                log.warning(
                    "the server returned no log-probabilities: choices are sampled (%d answers each)", samples
                )
            for i, (top, used) in enumerate(tops):
                found = [top.get(o) for o in options] if top else []
                if any(x is not None for x in found):
                    logps = [x if x is not None else -math.inf for x in found]
                    tokens = {"prompt_tokens": used[0], "answer_tokens": used[1]} if used else {}
                    out[i] = choice_answer(options, normalise(logps), "top_logprobs", **tokens)
        missing = [i for i, a in enumerate(out) if a is None]
        if missing and prefix:  # no sampled fallback after a given beginning: no probabilities
            for i in missing:
                out[i] = Answer("", probs_from="unavailable")
        elif missing:
            sampled = sampled_choices(self, [conversations[i] for i in missing], options, samples, seed)
            for i, answer in zip(missing, sampled, strict=True):
                out[i] = answer
        return out


class CachedBackend:
    """A backend whose greedy answers are kept in ``answer_cache`` (the module docstring); everything
    else is read from the backend itself (settings too: set them on ``.backend``). Safe to call from
    any thread (the sandbox's web page and plug-in agents generate from their own)."""

    def __init__(self, backend, config: LLMConfig):
        self.backend, self.path = backend, Path(config.answer_cache)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.conn = sqlite3.connect(self.path, timeout=60, check_same_thread=False)
        with self.lock:
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, answer TEXT NOT NULL)"
            )
        self.identity = backend_identity(config, backend)
        if config.backend == "openai":
            log.warning(
                "answer_cache with the openai backend: answers are kept by the served model's name (%s); "
                "if the weights behind it change, delete %s",
                config.model,
                self.path,
            )
        self.adapter_is_off = False
        self.hits = self.misses = 0

    def __getattr__(self, name):
        if name == "backend":  # not yet set (while unpickling, say): not the backend's
            raise AttributeError(name)
        if name == "adapter_off":  # only where the backend has one (openai has none)
            return partial(self._adapter_off, self.backend.adapter_off)
        return getattr(self.backend, name)

    @contextmanager
    def _adapter_off(self, inner):
        with inner():
            was, self.adapter_is_off = self.adapter_is_off, True
            try:
                yield
            finally:
                self.adapter_is_off = was

    def key(self, conversation: list[dict], sampling: Sampling, constraint: Constraint | None) -> str:
        tokenizer = getattr(self.backend, "tokenizer", None)
        settings = asdict(sampling)
        settings.pop("seed"), settings.pop("top_p")  # greedy: neither changes the answer
        what = {
            "backend": self.identity,
            "adapter_off": self.adapter_is_off,
            "conversation": conversation,
            "prompt": render_prompt(tokenizer, conversation) if tokenizer is not None else None,
            "sampling": settings,
            "constraint": asdict(constraint) if constraint is not None else None,  # the written order
        }
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    def lookup(self, keys: list[str]) -> dict[str, dict]:
        found = {}
        with self.lock:
            for start in range(0, len(keys), 500):
                part = keys[start : start + 500]
                rows = self.conn.execute(
                    f"SELECT key, answer FROM answers WHERE key IN ({','.join('?' * len(part))})", part
                )
                found.update((key, json.loads(answer)) for key, answer in rows)
        return found

    def generate(
        self, conversations: list[list[dict]], sampling: Sampling, constraint: Constraint | None = None
    ) -> list[Answer]:
        if sampling.temperature > 0:  # sampled: asked every time
            return self.backend.generate(conversations, sampling, constraint=constraint)
        keys = [self.key(c, sampling, constraint) for c in conversations]
        found = self.lookup(keys)
        kept = {key for key in keys if key in found}
        first: dict[str, int] = {}  # each missing answer asked once, for its first conversation
        for i, key in enumerate(keys):
            if key not in found:
                first.setdefault(key, i)
        if first:
            answers = self.backend.generate(
                [conversations[i] for i in first.values()], sampling, constraint=constraint
            )
            new = {k: asdict(a) for k, a in zip(first, answers, strict=True)}
            with self.lock, self.conn:
                self.conn.executemany(
                    "INSERT OR REPLACE INTO answers VALUES (?, ?)",
                    ((k, json.dumps(v)) for k, v in new.items()),
                )
            found.update(new)
        with self.lock:
            self.hits += sum(key in kept for key in keys)
            self.misses += len(first)
        return [Answer(**{**found[key], "cached": key in kept}) for key in keys]


TOKENIZER_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template*",
    "vocab*",
    "merges.txt",
)


def model_files(name: str) -> list | None:
    """A model's files by name, size and modification time (a 7B model is not hashed on every run): its
    folder's, or for a hub id the snapshot in the local Hugging Face cache (named by its commit); None
    where neither is on this machine (an openai model, say)."""
    path = Path(name)
    if not path.is_dir():
        from huggingface_hub import try_to_load_from_cache

        try:
            found = try_to_load_from_cache(name, "config.json")
        except ValueError:  # not a hub id either (huggingface_hub's HFValidationError)
            return None
        if not isinstance(found, str):
            return None
        path = Path(found).parent  # .../snapshots/COMMIT
    return sorted(
        (str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns)
        for f in path.rglob("*")
        if f.is_file()
    ) + [("snapshot", path.name)]


def backend_identity(config: LLMConfig, backend) -> dict:
    """What a backend's answers depend on besides the request (CachedBackend's key)."""
    from data_prep.fingerprint import adapter_digest, digest_files
    from data_prep.provenance import package_versions

    settings = {
        k: v for k, v in asdict(config).items() if k not in (*EXECUTION_FIELDS, "adapter", "api_key_env")
    }
    tokenizer = None
    if config.adapter:  # the hf backend reads its tokenizer from the adapter's folder
        folder = Path(config.adapter)
        files = sorted({f for pattern in TOKENIZER_FILES for f in folder.glob(pattern) if f.is_file()})
        tokenizer = digest_files(files, folder) if files else None
    return {
        "settings": settings,
        "model_files": model_files(resolve_model(config.model)) if config.backend != "openai" else None,
        "adapter": adapter_digest(config.adapter),
        "adapter_tokenizer": tokenizer,
        "device": backend.info.get("device"),
        "versions": package_versions(["torch", "transformers", "peft", "vllm", "llguidance"]),
        "code": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }


def load_llm(config: LLMConfig):
    backends = {"hf": HFBackend, "vllm": VLLMBackend, "openai": OpenAIBackend}
    if config.backend not in backends:
        raise ValueError(f"unknown LLM backend {config.backend!r}: one of {sorted(backends)}")
    backend = backends[config.backend](config)
    return CachedBackend(backend, config) if config.answer_cache else backend
