"""The hf backend on a CUDA device: what the CPU tests check, on the GPU. Skipped, with its reason, where
no CUDA device is present; bench/gpu_check.sh runs them on the borrowed GPU machine (`pytest -m gpu`,
with USERSIM_TINY_MODEL naming the carried tiny model; elsewhere the conftest's tiny model)."""

import os
import re
from pathlib import Path

import pytest

from agents.llm import Constraint, HFBackend, LLMConfig, Sampling

pytestmark = pytest.mark.gpu

CONVERSATIONS = [[{"role": "user", "content": t}] for t in ("hi", "a longer question about tacos", "ok")]


@pytest.fixture
def model(request) -> Path:
    named = os.environ.get("USERSIM_TINY_MODEL")
    return Path(named) if named else request.getfixturevalue("tiny_model")


def test_cuda_batched_generation_equals_one_at_a_time(model):
    """In float32: with bf16 weights, left padding changes the kernels' shapes and their rounding, which
    can flip a near-tie argmax of a random model; float32's rounding is far below any real gap, so a
    difference here is a padding or masking bug."""
    batched = HFBackend(LLMConfig(model=str(model), generation_batch_size=3, device="cuda"))
    single = HFBackend(LLMConfig(model=str(model), generation_batch_size=1, device="cuda"))
    for backend in (batched, single):
        backend.model.float()
    assert batched.model.device.type == "cuda"
    sampling = Sampling(max_new_tokens=8)
    together = batched.generate(CONVERSATIONS, sampling)
    assert together == single.generate(CONVERSATIONS, sampling) and all(a.text for a in together)


def test_cuda_constrained_answers_follow_the_format(model):
    backend = HFBackend(LLMConfig(model=str(model), generation_batch_size=3, device="cuda"))
    answers = backend.generate(CONVERSATIONS, Sampling(max_new_tokens=60), constraint=Constraint.answer(12))
    assert all(re.fullmatch(r"stars: [1-5]\nreview: [^\n]{1,12}", a.text) for a in answers), answers
    assert [a.cut_short for a in answers] == [False, False, False]
