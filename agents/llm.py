"""LLM backends behind one interface: a batch of chat conversations in, one text per conversation out.
After each ``generate`` call, ``cut_short[i]`` says whether answer i stopped at ``max_new_tokens``
rather than at its end (so a truncated review is counted, never silent), and ``usage[i]`` is answer i's
(prompt tokens, answer tokens) (None where a server does not say).

**Structured outputs.** ``generate(..., constraint=...)`` makes every answer follow a ``Constraint``:

- ``Constraint.answer(n)``: the renderer's answer format (``stars: S`` with S in 1-5, a newline,
  ``review: `` and 1 to n characters without a newline, then the end), so training and inference keep
  one format and a looping small model still closes its review;
- ``Constraint.json(schema)``: a JSON schema;
- ``Constraint.choice(options)``: exactly one of fixed strings.

``hf`` enforces them with llguidance (``GrammarProcessor``, a logits processor over transformers'
``generate``; why llguidance: README), ``vllm`` with its own structured outputs, ``openai`` with ``response_format`` (a JSON schema:
the answer format is asked as {"stars", "review"} and written back as the two lines). A server that
refuses ``response_format`` is asked without it from then on, and the answers are parsed (and retried)
as before. After each call, ``unconstrained[i]`` says whether answer i was asked for a constraint the
backend could not enforce (the agents count it per answer).

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
gets the first run's answer instead of generating it again (eval.suite: ``tuned`` and ``tuned-mbr`` ask
the same greedy answers and blend stars). The key is everything the answer depends on: the backend's
identity (backend, model, the model's files by name, size and time, from its folder or its snapshot
in the local Hugging Face cache, the adapter's digest and its tokenizer files, device, adapter on or
off, the library versions, this file's digest, so a change to the decoding code asks again), the
conversation and its rendered prompt, the sampling settings (not the seed or top_p, which change no
greedy answer) and the constraint. Sampled answers are never kept (they depend on the batch's random
stream). An openai model is known by its served name only (a warning says so). After each
``generate``, ``cached[i]`` says whether answer i came from the cache (the agents count it;
``count_tokens`` counts no tokens for it). In float32 greedy answers do not depend on the batch they
were made in (tests/test_agents.py on the CPU, tests/test_gpu.py on CUDA); in bf16 on a GPU left
padding can flip a near-tie, so a cached answer can differ from what another batch would give, as
answers from two batch sizes can. So the cache is an execution setting, like the batch size: it is
left out of run fingerprints.

``Sampling``'s ``repetition_penalty`` and ``no_repeat_ngram_size`` reach the backends that have them
(each backend's ``decoding_controls``: hf both, vllm the penalty, openai none). ``adapter_off()`` runs a
block on the base model alone (hf, vllm).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sqlite3
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from data_prep.offline_models import resolve_model
from data_prep.prompt import render_prompt

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Constraint:
    """What every answer must look like; see the module docstring."""

    kind: str  # answer | json | choice
    max_chars: int = 400
    schema: str | None = None  # json: the schema as JSON text (hashable)
    options: tuple[str, ...] = ()

    @staticmethod
    def answer(max_chars: int = 400) -> Constraint:
        if max_chars < 1:
            raise ValueError("the review needs room for at least one character")
        return Constraint("answer", max_chars=max_chars)

    @staticmethod
    def json(schema: dict) -> Constraint:
        return Constraint("json", schema=json.dumps(schema, sort_keys=True))

    @staticmethod
    def json_object(**properties: dict) -> Constraint:
        """A JSON object with exactly these properties (JSON schemas), all required."""
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
        if not options:
            raise ValueError("a choice needs options")
        return Constraint("choice", options=tuple(options))

    def regex(self) -> str:
        """The answer format as a regular expression."""
        if self.kind != "answer":
            raise ValueError(f"a {self.kind} constraint is not a regular expression")
        return f"stars: [1-5]\\nreview: [^\\n]{{1,{self.max_chars}}}"

    def llguidance(self) -> str:
        """The constraint as an llguidance grammar."""
        import llguidance

        if self.kind == "answer":
            return llguidance.LLMatcher.grammar_from_regex(self.regex())
        if self.kind == "choice":
            return llguidance.grammar_from("choice", json.dumps(list(self.options)))
        return llguidance.LLMatcher.grammar_from_json_schema(
            self.schema, defaults={"whitespace_flexible": False}
        )

    def json_schema(self) -> dict:
        """The JSON schema a backend that only offers JSON is asked for."""
        if self.kind == "json":
            return json.loads(self.schema)
        if self.kind == "answer":
            properties = {
                "stars": {"type": "integer", "minimum": 1, "maximum": 5},
                "review": {"type": "string", "minLength": 1, "maxLength": self.max_chars},
            }
            required = ["stars", "review"]
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
            jsonschema.validate(value, self.json_schema())
        except jsonschema.ValidationError:
            return None
        return value

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
        return str(value.get("choice"))


@dataclass
class Sampling:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    # controls against loops, where a backend has them (its ``decoding_controls``); neutral by default
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0


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
            f"(model: in the agent config; eval.suite --set model={base})"
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
        if config.adapter:
            model = load_adapter(model, config.model, config.adapter)
        self.model = model.to(device).eval()
        self.batch_size = config.generation_batch_size
        self.info = {"backend": "hf", "model": config.model, "adapter": config.adapter, "device": device}
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
        self, conversations: list[list[dict]], options: list[list[str]], max_rows: int = 64
    ) -> list[list[tuple[float, int]]]:
        """For each conversation and each of its options: (log-probability, tokens) of the answer
        ``option`` followed by the end of turn, given the conversation's rendered prompt. Each prompt is
        run once; its key-value cache is shared by its options, which run together in one more forward
        pass (``max_rows`` options at most per pass, whole prompts' worth)."""
        import torch

        device = self.model.device
        eos = self.tokenizer.eos_token
        encoded = [
            [self.tokenizer(t + eos, add_special_tokens=False)["input_ids"] for t in o] for o in options
        ]
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
            batch = self.encode(conversations[start:end]).to(device)
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

    def encode(self, conversations: list[list[dict]]):
        """The token ids the model is fed: the chat template's text (it writes any BOS itself), left-padded."""
        texts = [render_prompt(self.tokenizer, c) for c in conversations]
        return self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)

    def generate(
        self, conversations: list[list[dict]], sampling: Sampling, constraint: Constraint | None = None
    ) -> list[str]:
        import torch

        torch.manual_seed(sampling.seed)
        outputs: list[str] = []
        self.cut_short, self.usage = [], []
        for start in range(0, len(conversations), self.batch_size):
            batch = self.encode(conversations[start : start + self.batch_size]).to(self.model.device)
            kwargs = {"do_sample": sampling.temperature > 0}
            if sampling.temperature > 0:
                kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p)
            if sampling.repetition_penalty != 1.0:
                kwargs["repetition_penalty"] = sampling.repetition_penalty
            if sampling.no_repeat_ngram_size:
                kwargs["no_repeat_ngram_size"] = sampling.no_repeat_ngram_size
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
            outputs.extend(self.tokenizer.batch_decode(new, skip_special_tokens=True))
            ended = new == self.tokenizer.eos_token_id
            self.cut_short += ended.any(dim=1).logical_not().tolist()
            # answer tokens up to and including the first end token (the rest is padding)
            lengths = torch.where(ended.any(dim=1), ended.int().argmax(dim=1) + 1, new.shape[1])
            self.usage += list(
                zip(batch["attention_mask"].sum(dim=1).tolist(), lengths.tolist(), strict=True)
            )
        self.unconstrained = [False] * len(outputs)
        return outputs


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
    ) -> list[str]:
        from vllm import SamplingParams

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
        if sampling.repetition_penalty != 1.0:
            extra["repetition_penalty"] = sampling.repetition_penalty
        # one seed per request (seed + its index), so identical prompts in a batch (several samples of
        # one prompt) sample independently, as the hf backend's rows do
        params = [
            SamplingParams(
                max_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                seed=sampling.seed + i,
                **extra,
            )
            for i in range(len(conversations))
        ]
        outputs = self.engine.chat(conversations, params, lora_request=self.lora, use_tqdm=False)
        self.cut_short = [o.outputs[0].finish_reason == "length" for o in outputs]
        self.usage = [(len(o.prompt_token_ids), len(o.outputs[0].token_ids)) for o in outputs]
        self.unconstrained = [False] * len(outputs)
        return [o.outputs[0].text for o in outputs]


def count_tokens(backend, counts: Counter) -> None:
    """Add the last call's prompt and answer tokens (where the backend reports them) to the counts;
    an answer from the answer cache cost none: it is counted as ``cached_answers`` instead."""
    used_all = getattr(backend, "usage", None) or []
    cached = getattr(backend, "cached", None) or [False] * len(used_all)
    for used, kept in zip(used_all, cached, strict=True):
        if kept:
            counts["cached_answers"] += 1
        elif used is not None:  # a server may leave either number out
            counts["prompt_tokens"] += used[0] or 0
            counts["answer_tokens"] += used[1] or 0


def usage(response) -> tuple[int, int] | None:
    """(prompt tokens, answer tokens) as the server reports them; None when it does not."""
    if response.usage is None:
        return None
    return response.usage.prompt_tokens, response.usage.completion_tokens


class OpenAIBackend:
    decoding_controls = ()  # the API's frequency and presence penalties are another thing: none applied

    def __init__(self, config: LLMConfig):
        from openai import OpenAI

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
        }
        self.structured = True  # until the server refuses response_format

    def _one(
        self, client, conversation: list[dict], sampling: Sampling, constraint: Constraint | None, index: int
    ) -> tuple[str, bool, tuple[int, int] | None]:
        from openai import BadRequestError

        request = {
            "model": self.model,
            "messages": conversation,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "seed": sampling.seed + index,  # per request: identical prompts sample independently
        }
        if constraint is not None and self.structured:
            schema = {"name": f"{constraint.kind}_answer", "schema": constraint.json_schema(), "strict": True}
            try:
                response = client.chat.completions.create(
                    **request, response_format={"type": "json_schema", "json_schema": schema}
                )
                choice = response.choices[0]
                text = constraint.from_json(choice.message.content or "")
                return text, choice.finish_reason == "length", usage(response)
            except BadRequestError as err:
                if not any(word in str(err) for word in ("response_format", "json_schema")):
                    raise  # another problem with this request (too long, ...): the task's error
                self.structured = False  # the server has no structured outputs: parse and retry instead
                log.warning("the server refused response_format (%s); answers are parsed and retried", err)
        response = client.chat.completions.create(**request)
        choice = response.choices[0]
        return choice.message.content or "", choice.finish_reason == "length", usage(response)

    def generate(
        self, conversations: list[list[dict]], sampling: Sampling, constraint: Constraint | None = None
    ) -> list[str]:
        clients = [self.clients[i % len(self.clients)] for i in range(len(conversations))]
        with ThreadPoolExecutor(self.concurrency * len(self.clients)) as pool:
            answers = list(
                pool.map(
                    lambda k, c, i: self._one(k, c, sampling, constraint, i),
                    clients,
                    conversations,
                    range(len(conversations)),
                )
            )
        self.cut_short = [cut for _, cut, _ in answers]
        self.usage = [used for _, _, used in answers]
        self.unconstrained = [constraint is not None and not self.structured] * len(answers)
        return [text for text, _, _ in answers]


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
            "constraint": asdict(constraint) if constraint is not None else None,
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
    ) -> list[str]:
        if sampling.temperature > 0:  # sampled: asked every time
            texts = self.backend.generate(conversations, sampling, constraint=constraint)
            self.cut_short, self.usage = self.backend.cut_short, self.backend.usage
            self.unconstrained = getattr(self.backend, "unconstrained", None) or [False] * len(texts)
            self.cached = [False] * len(texts)
            return texts
        keys = [self.key(c, sampling, constraint) for c in conversations]
        found = self.lookup(keys)
        self.cached = [key in found for key in keys]
        first: dict[str, int] = {}  # each missing answer asked once, for its first conversation
        for i, key in enumerate(keys):
            if key not in found:
                first.setdefault(key, i)
        if first:
            texts = self.backend.generate(
                [conversations[i] for i in first.values()], sampling, constraint=constraint
            )
            free = getattr(self.backend, "unconstrained", None) or [False] * len(texts)
            new = {
                k: {"text": t, "cut_short": c, "usage": u, "unconstrained": f}
                for k, t, c, u, f in zip(
                    first, texts, self.backend.cut_short, self.backend.usage, free, strict=True
                )
            }
            with self.lock, self.conn:
                self.conn.executemany(
                    "INSERT OR REPLACE INTO answers VALUES (?, ?)",
                    ((k, json.dumps(v)) for k, v in new.items()),
                )
            found.update(new)
        self.hits += sum(self.cached)
        self.misses += len(first)
        answers = [found[k] for k in keys]
        self.cut_short = [a["cut_short"] for a in answers]
        self.usage = [tuple(a["usage"]) if a["usage"] is not None else None for a in answers]
        self.unconstrained = [a["unconstrained"] for a in answers]
        return [a["text"] for a in answers]


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
