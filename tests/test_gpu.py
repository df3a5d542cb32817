"""The hf backend on a CUDA device: what the CPU tests check, on the GPU (bf16 weights). Skipped, with
its reason, where no CUDA device is present; run them on a GPU machine with `pytest -m gpu`."""

import re

import pytest

from agents.llm import Constraint, HFBackend, LLMConfig, Sampling

pytestmark = pytest.mark.gpu

CONVERSATIONS = [[{"role": "user", "content": t}] for t in ("hi", "a longer question about tacos", "ok")]


def test_cuda_batched_generation_equals_one_at_a_time(tiny_model):
    batched = HFBackend(LLMConfig(model=str(tiny_model), generation_batch_size=3, device="cuda"))
    single = HFBackend(LLMConfig(model=str(tiny_model), generation_batch_size=1, device="cuda"))
    assert batched.model.device.type == "cuda"
    sampling = Sampling(max_new_tokens=8)
    together = batched.generate(CONVERSATIONS, sampling)
    assert together == single.generate(CONVERSATIONS, sampling) and all(together)


def test_cuda_constrained_answers_follow_the_format(tiny_model):
    backend = HFBackend(LLMConfig(model=str(tiny_model), generation_batch_size=3, device="cuda"))
    answers = backend.generate(CONVERSATIONS, Sampling(max_new_tokens=60), constraint=Constraint.answer(12))
    assert all(re.fullmatch(r"stars: [1-5]\nreview: [^\n]{1,12}", a) for a in answers), answers
    assert backend.cut_short == [False, False, False]
