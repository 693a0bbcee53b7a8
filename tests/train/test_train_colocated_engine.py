"""Specification of how the trainer uses an engine that holds its own copy of the weights (vLLM's
colocated engine, `pacs.train.colocated_engine`) where sleep mode is on, as on a GPU: a recording
stand-in for vLLM whose level-2 sleep drops the weights, as vLLM's does (a CPU cannot turn vLLM's
sleep mode on). vLLM itself runs in tests/rollout/test_rollout_vllm.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from pacs.config import load_config
from pacs.rollout.hf import TransformersEngine
from pacs.train import trainer as trainer_module
from pacs.train.trainer import train

pytestmark = pytest.mark.slow


class SleepingEngine:
    """vLLM as the trainer sees it with sleep mode on and the weights pushed: its own copy of the
    weights (`load_weights`), dropped by every `sleep` (level 2); `generate` refuses to run without
    them, as `VllmEngine.generate` does. Generates with transformers on the policy module, and
    records every call (with whether torch's autocast was on while it generated)."""

    holds_own_weights = True

    def __init__(self, inner: TransformersEngine):
        self.inner = inner
        self.has_weights = False
        self.calls: list[str] = []
        self.autocast_while_generating: list[bool] = []

    def load_weights(self, weights) -> None:
        for _ in weights:
            pass
        self.has_weights = True
        self.calls.append("reload_weights")

    def sleep(self) -> None:
        self.has_weights = False
        self.calls.append("sleep2")

    def generate(self, prompt_token_ids, params):
        if not self.has_weights:
            raise RuntimeError("this vLLM engine holds no weights (dropped them asleep)")
        self.calls.append("generate")
        self.autocast_while_generating.append(torch.is_autocast_enabled("cpu"))
        with torch.autocast("cpu", enabled=False):
            return self.inner.generate(prompt_token_ids, dataclasses.replace(params, return_logprobs=False))

    def close(self) -> None:
        self.calls.append("close")


@pytest.fixture
def sleeping_engines(monkeypatch) -> list[SleepingEngine]:
    """Every engine the trainer builds, a `SleepingEngine`."""
    engines: list[SleepingEngine] = []

    def build_sleeping_engine(config, world, policy_module, tokenizer):
        engines.append(SleepingEngine(TransformersEngine(policy_module, tokenizer, max_sequences_per_call=64)))
        return engines[-1]

    monkeypatch.setattr(trainer_module, "build_engine", build_sleeping_engine)
    return engines


def two_step_config(output_dir, model_dir, *extra: str):
    return load_config(
        "builtin:demo",
        [
            f"output_dir={output_dir}",
            f"model.path={model_dir}",
            "data.train=builtin:arithmetic?size=64",
            "data.val=null",
            "train.steps=2",
            "train.batch_size=4",
            "train.mini_batch_size=4",
            "train.micro_batch_size=8",
            "train.save_every=0",
            "rollout.n=2",
            "data.max_response_length=8",
            "reward.num_workers=0",
            *extra,
        ],
    )


def test_every_round_of_dynamic_sampling_generates_with_the_steps_weights_although_sleep_drops_them(
    tmp_path, tiny_model_dir, sleeping_engines, monkeypatch
):
    """Three rounds a step (the first two forced: their groups are set aside), one push before
    them and one sleep after the last: no round meets an engine that dropped its weights."""
    sample_mixed_groups = trainer_module.sample_mixed_groups

    def three_rounds(draw, world, **settings):
        draw(), draw()
        return sample_mixed_groups(draw, world, **settings)

    monkeypatch.setattr(trainer_module, "sample_mixed_groups", three_rounds)
    config = two_step_config(tmp_path / "run", tiny_model_dir, "rollout.dynamic_sampling=true", "rollout.max_sampling_rounds=1")
    train(config, show_progress=False)
    step = ["reload_weights", "generate", "generate", "generate", "sleep2"]
    assert sleeping_engines[0].calls == [*step, *step, "close"]


def test_an_engine_with_its_own_weights_generates_outside_the_trainers_bf16_autocast(tmp_path, tiny_model_dir, sleeping_engines):
    config = two_step_config(tmp_path / "run", tiny_model_dir, "model.dtype=bfloat16", "train.steps=1")
    train(config, show_progress=False)
    assert sleeping_engines[0].autocast_while_generating == [False]
