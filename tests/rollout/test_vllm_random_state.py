"""Specification of the vLLM engine's random state (`pacs.rollout.vllm.RandomState`): building it
and generating with it leave the caller's generators as they were, and its samples follow its seed
alone. A stand-in for vLLM seeds and draws from the global generators as vLLM's worker and sampler
do (`set_random_seed` while the engine is built, torch's global generator while sampling); vLLM
itself runs the same checks in tests/rollout/test_rollout_vllm.py."""

from __future__ import annotations

import random
import sys
import types
from dataclasses import dataclass, field

import numpy
import pytest
import torch

from pacs.config import VllmConfig
from pacs.models.loading import load_tokenizer
from pacs.rollout.base import SamplingParams
from pacs.rollout.vllm import VllmEngine


@dataclass
class Completion:
    index: int
    token_ids: list[int]
    logprobs: None = None


@dataclass
class RequestOutput:
    outputs: list[Completion] = field(default_factory=list)


class SeedingLLM:
    """`vllm.LLM` as far as its random state goes: it seeds every global generator when built
    (vLLM's `set_random_seed`) and samples tokens from torch's, Python's and NumPy's."""

    def __init__(self, *, seed: int, **options):
        random.seed(seed)
        numpy.random.seed(seed)
        torch.manual_seed(seed)

    def generate(self, requests, sampling_params, use_tqdm=False):
        random.random(), numpy.random.random()
        return [
            RequestOutput([Completion(k, torch.randint(5, 50, (3,)).tolist()) for k in range(sampling_params.n)])
            for _ in requests
        ]

    def reset_prefix_cache(self) -> None:
        pass


@pytest.fixture
def seeding_vllm(monkeypatch):
    """A `vllm` module whose LLM is `SeedingLLM`, on a CPU platform."""
    vllm = types.ModuleType("vllm")
    vllm.LLM = SeedingLLM
    vllm.SamplingParams = lambda **settings: types.SimpleNamespace(**settings)
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(device_type="cpu")
    vllm.platforms = platforms
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def engine(model_dir, seed: int = 0) -> VllmEngine:
    tokenizer = load_tokenizer(str(model_dir))
    return VllmEngine(str(model_dir), tokenizer, VllmConfig(), dtype="float32", max_model_len=64, seed=seed)


def states() -> tuple:
    numpy_state = numpy.random.get_state()
    return random.getstate(), (numpy_state[0], numpy_state[1].tolist(), *numpy_state[2:]), torch.get_rng_state().tolist()


PARAMS = SamplingParams(n=2, max_new_tokens=3)


def test_building_a_vllm_engine_and_generating_leave_the_callers_generators_as_they_were(seeding_vllm, tiny_model_dir):
    torch.manual_seed(1234), random.seed(1234), numpy.random.seed(1234)
    before = states()
    built = engine(tiny_model_dir)
    assert states() == before
    built.generate([[1, 2, 3]], PARAMS)
    assert states() == before


def test_a_vllm_engines_samples_follow_its_seed_whatever_the_callers_generators_did(seeding_vllm, tiny_model_dir):
    first, second = engine(tiny_model_dir, seed=7), engine(tiny_model_dir, seed=7)
    torch.manual_seed(1)
    from_first = [first.generate([[1, 2]], PARAMS).response_ids.tolist() for _ in range(2)]
    torch.manual_seed(2)
    torch.rand(100)
    from_second = [second.generate([[1, 2]], PARAMS).response_ids.tolist() for _ in range(2)]
    assert from_first == from_second and from_first[0] != from_first[1]
