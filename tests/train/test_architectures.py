"""The table of docs/architectures.md, as tested: tiny random models of each, built here
(`tiny_architectures`).

- pacs's per-token log-probs and entropy are those of the model's own forward logits (softcapped
  or scaled where the model does so), for every architecture;
- every architecture trains 2 steps with PACS and with PPO in one process (`pacs train`'s loop);
- four of them train with LoRA, and for three (one a mixture of experts) a step with 2 FSDP
  processes gives the weights of the step with one.

The training tests are marked slow.
"""

from __future__ import annotations

import pytest
import torch
from distributed_update import run_case
from mixed_rewards import MIXED_GROUPS
from safetensors.torch import load_file
from test_train_logprobs import CHUNK_TOKENS, full_logits_reference, gradients, make_group_batch
from test_train_loop import max_weight_difference
from tiny_architectures import ARCHITECTURES, LOGIT_MAP_VARIANTS, save_tiny_model, tiny_causal_lm
from torchrun_jobs import EXACT, WORKER, max_difference, torchrun
from transformers import AutoConfig, AutoModelForCausalLM

from pacs.config import load_config
from pacs.distributed.world import World
from pacs.models.loading import load_value_model
from pacs.train import logprobs as logprobs_module
from pacs.train.logprobs import response_logprobs
from pacs.train.metrics import read_metrics
from pacs.train.trainer import train

FSDP_CASES = ["gemma3/pacs:token-mean", "granite/ppo:seq-mean-token-sum-norm", "qwen3_moe/pacs:token-mean"]
"""Architectures whose step with 2 FSDP processes is compared with the step in one: two without a
token-classification class in transformers (their critic is built by pacs; Granite's trains
here), one of them scaling its logits, and a mixture of experts. (The comparison runs in
float64, where transformers' Gemma 2 turns left-padded rows into NaN.)"""
ROUTED_IN_FLOAT32 = 1e-5
"""Largest weight difference accepted between 2 processes and 1 for Qwen3-MoE: its router takes
its softmax in float32 whatever the model's dtype, so routing weights, and the weights after the
step, agree to float32 precision; the others agree to `EXACT`."""
LORA_ARCHITECTURES = ("gemma2", "gemma3", "granite", "qwen3_moe")
"""Architectures also trained with LoRA: those of FSDP_CASES, and Gemma 2, which softcaps its logits."""
TRAIN_OPTIONS = [
    "data.train=builtin:arithmetic?size=16",
    "data.val=null",
    "data.max_response_length=8",
    "rollout.n=4",
    "train.steps=2",
    "train.batch_size=2",
    "train.mini_batch_size=2",
    "train.micro_batch_size=4",
    "train.eval_every=0",
    *MIXED_GROUPS,  # random models never solve the task, and groups of equal rewards give PACS no gradient
]


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(logprobs_module, "LOGITS_CHUNK_BYTES", CHUNK_TOKENS * 4 * 101)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("name", [*ARCHITECTURES, *LOGIT_MAP_VARIANTS])
def test_logprobs_and_entropy_are_those_of_the_models_own_logits(name, temperature, small_chunks):
    model = tiny_causal_lm(name)
    batch = make_group_batch()
    with torch.no_grad():
        logprobs, entropy = response_logprobs(model, batch, temperature=temperature, with_entropy=True)
        expected_logprobs, expected_entropy = full_logits_reference(model, batch, temperature)
    assert logprobs.dtype == entropy.dtype == torch.float32
    torch.testing.assert_close(logprobs.double(), expected_logprobs, atol=1e-6, rtol=0)
    torch.testing.assert_close(entropy.double(), expected_entropy, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["gemma3-softcapped", "granite", "cohere"])
def test_gradients_through_the_logit_map_are_those_of_the_models_own_logits(name, small_chunks):
    """In float64; these models normalise in float32 whatever their dtype, so gradients agree to
    float32 precision (relative to the largest)."""
    model = tiny_causal_lm(name).double()
    batch = make_group_batch()
    logprobs, entropy = response_logprobs(model, batch, temperature=0.7, with_entropy=True)
    chunked = gradients(model, (logprobs + 0.1 * entropy).sum())
    expected_logprobs, expected_entropy = full_logits_reference(model, batch, 0.7)
    expected = gradients(model, (expected_logprobs + 0.1 * expected_entropy).sum())
    largest = max(float(gradient.abs().max()) for gradient in expected.values())
    for parameter, gradient in expected.items():
        torch.testing.assert_close(chunked[parameter], gradient, atol=1e-6 * largest, rtol=0, msg=parameter)


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    """A directory holding a saved tiny model (with the character tokenizer) per architecture."""
    root = tmp_path_factory.mktemp("architectures")
    for name in ARCHITECTURES:
        save_tiny_model(name, root / name)
    return root


def train_two_steps(output_dir, model_dir, *overrides):
    config = load_config("builtin:demo", [f"output_dir={output_dir}", f"model.path={model_dir}", *TRAIN_OPTIONS, *overrides])
    return train(config, show_progress=False)


def assert_trained_two_steps(output_dir, model_dir, final_checkpoint):
    rows = read_metrics(output_dir)
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["updates/skipped"] == 0 for row in rows)
    model_type = AutoConfig.from_pretrained(model_dir).model_type
    assert AutoModelForCausalLM.from_pretrained(final_checkpoint).config.model_type == model_type
    initial = load_file(model_dir / "model.safetensors")
    assert max_difference(load_file(final_checkpoint / "model.safetensors"), initial) > 0


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["pacs", "ppo"])
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_each_architecture_trains_in_one_process(name, algorithm, model_root, tmp_path):
    result = train_two_steps(tmp_path, model_root / name, f"algorithm.name={algorithm}")
    assert_trained_two_steps(tmp_path, model_root / name, result.final_checkpoint)
    if algorithm == "ppo":
        assert all("critic/value_loss" in row for row in read_metrics(tmp_path))
        critic = load_value_model(str(result.final_checkpoint / "critic"))
        assert critic.config.model_type == AutoConfig.from_pretrained(model_root / name).model_type


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["pacs", "ppo"])
@pytest.mark.parametrize("name", LORA_ARCHITECTURES)
def test_lora_adapters_train_on_each_architecture(name, algorithm, model_root, tmp_path):
    result = train_two_steps(tmp_path, model_root / name, f"algorithm.name={algorithm}", "model.lora_rank=4")
    assert_trained_two_steps(tmp_path, model_root / name, result.final_checkpoint)
    adapter = load_file(result.final_checkpoint / "adapter" / "adapter_model.safetensors")
    assert any(float(value.abs().max()) > 0 for key, value in adapter.items() if "lora_B" in key)


@pytest.fixture(scope="module")
def fsdp_weights(model_root, tmp_path_factory):
    """OUT/NAME/CASE.safetensors: the weights after each of FSDP_CASES' steps, with 2 FSDP processes."""
    out = tmp_path_factory.mktemp("fsdp-architectures")
    torchrun(str(WORKER), str(model_root), str(out), "fsdp", *FSDP_CASES)
    return out / "fsdp"


@pytest.mark.slow
@pytest.mark.parametrize("case", FSDP_CASES)
def test_two_fsdp_processes_update_each_architecture_like_one(case, model_root, fsdp_weights):
    expected, _ = run_case(World.single(), str(model_root), case)
    tolerance = ROUTED_IN_FLOAT32 if case.startswith("qwen3_moe/") else EXACT
    assert max_difference(load_file(fsdp_weights / f"{case}.safetensors"), expected) <= tolerance


@pytest.mark.slow
def test_ppo_with_a_critic_built_by_pacs_resumes_to_the_weights_of_a_straight_run(model_root, tmp_path):
    ppo = ["algorithm.name=ppo", "critic.lr=1e-3", "train.save_every=1"]
    straight = train_two_steps(tmp_path / "straight", model_root / "granite", *ppo)
    train_two_steps(tmp_path / "stopped", model_root / "granite", *ppo, "train.steps=1")
    resumed = train_two_steps(tmp_path / "stopped", model_root / "granite", *ppo, "resume=auto")
    assert max_weight_difference(straight.final_checkpoint, resumed.final_checkpoint) <= 1e-6
