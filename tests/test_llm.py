"""The shared LLM layer on its own: answers as records, schemas decoded in their written order, choices
read from probabilities, decoding that comes from the call alone. The tiny random model and scripted
backends; the OpenAI-compatible server's side is in test_agents.py."""

import json
import math
import sys
import types

import pytest

from agents.llm import (
    Answer,
    Constraint,
    HFBackend,
    LLMConfig,
    Sampling,
    normalise,
    option_probs,
    read_choice,
)

STARS = ["1", "2", "3", "4", "5"]
PROMPTS = [
    [{"role": "user", "content": t}] for t in ("Rate it 1 to 5.", "A longer question about tacos?", "ok")
]


@pytest.fixture(scope="module")
def hf(tiny_model):
    return HFBackend(LLMConfig(model=str(tiny_model), generation_batch_size=2, device="cpu"))


# -- schemas in their written order ----------------------------------------------------------------------


def test_a_json_constraint_keeps_its_written_order_and_the_cache_keys_it_so():
    first = Constraint.json_object(rationale={"type": "string"}, score={"type": "integer"})
    second = Constraint.json_object(score={"type": "integer"}, rationale={"type": "string"})
    assert list(first.json_schema()["properties"]) == ["rationale", "score"]
    assert list(second.json_schema()["properties"]) == ["score", "rationale"]
    # the same content in another order: another constraint, decoded differently, cached apart
    assert json.loads(first.schema)["properties"] == json.loads(second.schema)["properties"]
    assert first != second and first.schema != second.schema


@pytest.mark.parametrize("schema", [{}, {"type": "object"}, {"type": "object", "properties": {}}, "x"])
def test_a_schema_without_properties_is_refused(schema):
    with pytest.raises(ValueError, match="schema|properties"):
        Constraint.json(schema)


def test_the_tiny_model_decodes_a_rationale_first_schema_rationale_first(hf):
    constraint = Constraint.json_object(
        rationale={"type": "string", "minLength": 1, "maxLength": 20},
        action_quality={"type": "integer", "minimum": 1, "maximum": 5},
    )
    for answer in hf.generate(PROMPTS, Sampling(max_new_tokens=60), constraint=constraint):
        assert answer.text.startswith('{"rationale":'), answer.text
        value = json.loads(answer.text)
        assert list(value) == ["rationale", "action_quality"] and answer.constrained


# -- choices from probabilities ----------------------------------------------------------------------


def test_hf_option_probs_reads_the_options_probabilities_and_their_expected_value(hf):
    answers = option_probs(hf, PROMPTS, STARS)
    scored = hf.score(PROMPTS, [STARS] * len(PROMPTS), end=False)  # the slower path, option by option
    for answer, row in zip(answers, scored, strict=True):
        assert answer.probs_from == "logprobs" and set(answer.probs) == set(STARS)
        assert math.isclose(sum(answer.probs.values()), 1.0, abs_tol=1e-9)
        assert answer.probs == pytest.approx(
            dict(zip(STARS, normalise([lp for lp, _ in row]), strict=True)), abs=1e-5
        )
        expected = sum(int(o) * p for o, p in answer.probs.items())
        assert answer.expected == pytest.approx(expected) and 1 <= answer.expected <= 5
        assert answer.text == max(answer.probs, key=answer.probs.get)
        assert answer.prompt_tokens > 0 and answer.answer_tokens == 0
    # the greedy reading is the greedy constrained pick
    picked = hf.generate(PROMPTS, Sampling(max_new_tokens=4), constraint=Constraint.choice(STARS))
    assert [read_choice(a, "greedy") for a in answers] == [float(p.text) for p in picked]
    assert [read_choice(a, "expected") for a in answers] == [a.expected for a in answers]


def test_hf_option_probs_scores_options_of_several_tokens_and_after_an_answers_beginning(hf):
    options = ["watch it", "skip", "chat with a friend"]
    answers = option_probs(hf, PROMPTS, options)
    assert all(a.expected is None and len(a.probs) == 3 for a in answers)  # not numbers: no expected value
    after = option_probs(hf, PROMPTS, STARS, prefix="stars: ")
    plain = option_probs(hf, PROMPTS, STARS)
    assert [a.probs for a in after] != [a.probs for a in plain]  # the beginning is part of the prompt


@pytest.mark.parametrize(
    "options, message",
    [([], "needs options"), (["1", "1", "2"], "appear more than once"), (["1", ""], "non-empty")],
)
def test_a_choice_of_bad_options_is_refused(hf, options, message):
    with pytest.raises(ValueError, match=message):
        option_probs(hf, PROMPTS, options)
    with pytest.raises(ValueError, match=message):
        Constraint.choice(options)


def test_a_backend_without_probabilities_falls_back_to_sampled_answers_labelled():
    class Scripted:
        def __init__(self):
            self.asked = []

        def generate(self, conversations, sampling, constraint=None):
            self.asked.append((len(conversations), sampling.temperature, constraint))
            # the first prompt's samples: 4, 4, 2, 4; the second's: answers outside the options only
            texts = ["4", "4", "2", "4", "maybe", "maybe", "maybe", "maybe"]
            return [Answer(t, prompt_tokens=5, answer_tokens=1) for t in texts[: len(conversations)]]

    backend = Scripted()
    first, second = option_probs(backend, PROMPTS[:2], STARS, samples=4)
    ((rows, temperature, constraint),) = backend.asked
    assert rows == 8 and temperature == 1.0 and constraint == Constraint.choice(STARS)
    assert first.probs_from == "samples" and first.probs == {"1": 0, "2": 0.25, "3": 0, "4": 0.75, "5": 0}
    assert first.expected == pytest.approx(3.5) and first.text == "4"
    assert (
        second.probs is None and read_choice(second, "expected") is None
    )  # no silent 1: the caller's fallback
    assert first.prompt_tokens == 20


# -- decoding comes from the call alone --------------------------------------------------------------


def test_the_hf_backend_sets_the_models_generation_config_aside(tiny_model, tmp_path):
    import shutil

    from transformers import GenerationConfig

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    GenerationConfig(repetition_penalty=1.05, do_sample=True, temperature=0.7, top_k=20).save_pretrained(
        model
    )
    backend = HFBackend(LLMConfig(model=str(model), device="cpu"))
    assert backend.info["model_generation_config"] == {
        "do_sample": True,
        "temperature": 0.7,
        "top_k": 20,
        "repetition_penalty": 1.05,
    }
    config = backend.model.generation_config
    assert (config.repetition_penalty, config.do_sample, config.top_k) in (
        (1.0, False, None),
        (None, None, None),
    )
    plain = HFBackend(LLMConfig(model=str(tiny_model), device="cpu"))
    greedy = Sampling(max_new_tokens=12)
    assert backend.generate(PROMPTS, greedy) == plain.generate(PROMPTS, greedy)  # the same decoding


def test_a_control_a_backend_cannot_apply_is_refused_not_dropped(monkeypatch):
    from agents.llm import OpenAIBackend

    monkeypatch.setenv("TEST_LLM_KEY", "k")
    standard = OpenAIBackend(
        LLMConfig(backend="openai", model="m", base_url="http://127.0.0.1:9/v1", api_key_env="TEST_LLM_KEY")
    )
    with pytest.raises(ValueError, match="cannot apply repetition_penalty"):
        standard.generate(PROMPTS[:1], Sampling(repetition_penalty=1.2))
    vllm_server = OpenAIBackend(
        LLMConfig(
            backend="openai",
            model="m",
            base_url="http://127.0.0.1:9/v1",
            api_key_env="TEST_LLM_KEY",
            decoding_fields="vllm",
        )
    )
    request = vllm_server.request(
        PROMPTS[0], Sampling(max_new_tokens=9, repetition_penalty=1.2, top_p=0.9), 2
    )
    assert request["extra_body"] == {"repetition_penalty": 1.2, "top_k": -1, "min_p": 0.0}
    assert (request["max_tokens"], request["top_p"], request["temperature"], request["seed"]) == (
        9,
        0.9,
        0.0,
        2,
    )
    with pytest.raises(ValueError, match="decoding_fields: vllm"):
        standard.option_probs(PROMPTS[:1], STARS, prefix="stars: ")


def test_vllm_option_probs_reads_each_options_tokens_from_prompt_logprobs(monkeypatch):
    """With a fake engine: each option is scored after the rendered prompt (prompt_logprobs of the
    option's tokens), and the probabilities are normalised over the options."""
    from agents.llm import VLLMBackend

    class Tokenizer:
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
            return "".join(m["content"] for m in messages) + ">"

    seen = {}
    # the log-probability of token t anywhere: the option "2" likelier than "1", "ab" two tokens
    logprob = {ord("1"): -2.0, ord("2"): -1.0, ord("a"): -0.5, ord("b"): -0.5}

    class Engine:
        def generate(self, requests, params, lora_request=None, use_tqdm=True):
            seen.update(requests=requests, params=params)
            return [
                types.SimpleNamespace(
                    prompt_logprobs=[None]
                    + [
                        {t: types.SimpleNamespace(logprob=logprob.get(t, -9.0))}
                        for t in r["prompt_token_ids"][1:]
                    ]
                )
                for r in requests
            ]

    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = lambda **kw: kw
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    backend = VLLMBackend.__new__(VLLMBackend)
    backend.engine, backend.tokenizer, backend.lora = Engine(), Tokenizer(), None
    (answer,) = option_probs(backend, [[{"role": "user", "content": "q"}]], ["1", "2", "ab"])
    assert seen["params"] == {"max_tokens": 1, "temperature": 0.0, "prompt_logprobs": 0}
    assert [r["prompt_token_ids"] for r in seen["requests"]] == [
        [ord("q"), ord(">"), ord("1")],
        [ord("q"), ord(">"), ord("2")],
        [ord("q"), ord(">"), ord("a"), ord("b")],
    ]
    assert answer.probs == pytest.approx(
        dict(zip(["1", "2", "ab"], normalise([-2.0, -1.0, -1.0]), strict=True))
    )
    assert answer.probs_from == "logprobs" and answer.expected is None and answer.prompt_tokens == 2


def test_an_answer_is_checked_against_its_constraint():
    from agents.llm import Constraint

    answer = Constraint.answer(10)
    assert answer.holds("stars: 4\nreview: fine food") and not answer.holds(
        "stars: 4\nreview: far too long a review"
    )
    assert not answer.holds('{"stars": 4, "review": "json"}')
    assert Constraint.choice(["watch", "next"]).holds("next") and not Constraint.choice(["watch"]).holds(
        "leave"
    )
    schema = Constraint.json_object(say={"type": "string", "minLength": 1})
    assert schema.holds('{"say": "hi"}') and not schema.holds('{"say": ""}')


def test_a_schema_is_checked_once_and_every_answer_against_it():
    """Constraint.parse validates each answer (range, extra keys) with a validator built once per schema;
    a schema that is itself wrong is still an error, not a pass."""
    import jsonschema

    from agents.llm import Constraint, schema_validator

    scored = Constraint.json_object(n={"type": "integer", "minimum": 1, "maximum": 5})
    schema_validator.cache_clear()
    assert scored.parse('{"n": 3}') == {"n": 3}
    assert scored.parse('{"n": 9}') is None and scored.parse('{"n": 3, "x": 1}') is None
    assert schema_validator.cache_info().misses == 1  # one validator for the three answers
    wrong = Constraint.json({"type": "object", "properties": {"n": {"type": "integer", "minimum": "one"}}})
    with pytest.raises(jsonschema.SchemaError, match="'one' is not of type 'number'"):
        wrong.parse('{"n": 1}')
