"""The trainer's side of its rollout engine: which engine a run builds, the policy's weights as an
engine that holds its own copy (vLLM) takes them, and how far that sampler is from the trainer.

`transformers` generates with the trained module itself, so it never needs weights pushed. vLLM
holds a copy; before every rollout that follows an update the trainer pushes `policy_weights`:
under FSDP2 each tensor gathered when its turn comes (never a second whole model), with LoRA the
adapters merged into their base weights one decoder layer at a time, a tied `lm_head.weight`
pushed under its own name. vLLM's log-probs are those of the distribution it sampled from;
`sampler_mismatch` compares them with the trainer's recomputed old log-probs every step.
"""

from __future__ import annotations

import itertools
import re
from typing import Iterator

import torch

from pacs.config import Config
from pacs.models.loading import resolve_model_path
from pacs.models.lora import is_adapter_weight, is_lora, merged_tensors
from pacs.models.precision import Precision
from pacs.rollout.base import RolloutEngine, rank_seed
from pacs.rollout.hf import TransformersEngine
from pacs.rollout.vllm import VllmEngine
from pacs.train.distributed.collectives import max_over_ranks, sum_over_ranks
from pacs.train.distributed.state_dict import full_tensors
from pacs.train.distributed.world import World
from pacs.train.distributed.wrapping import unwrap

_DECODER_LAYER = re.compile(r"\.layers\.(\d+)\.")


def build_engine(config: Config, world: World, policy_module: torch.nn.Module, tokenizer) -> TransformersEngine | VllmEngine:
    """`rollout.engine`'s engine for this process: transformers' generate on `policy_module`
    (the unwrapped language model), or a vLLM engine built from `model.path` in the run's compute
    dtype, seeded per rank (its weights are pushed before the first rollout), one in each process."""
    if config.rollout.engine == "hf":
        return TransformersEngine(policy_module, tokenizer, max_sequences_per_call=config.rollout.generation_batch_size)
    settings = config.rollout.vllm
    return VllmEngine(
        resolve_model_path(config.model.path),
        tokenizer,
        settings,
        dtype=Precision(config.model.dtype).engine,
        max_model_len=settings.max_model_len or config.data.max_prompt_length + config.data.max_response_length,
        seed=rank_seed(config.seed, world.rank),
    )


def pushes_weights(engine: RolloutEngine, config: Config) -> bool:
    """Whether the trainer pushes the policy's weights into `engine` (`RolloutEngine.load_weights`)
    after every update: when it holds its own copy (vLLM), unless `rollout.vllm.sync_weights` is off."""
    return engine.holds_own_weights and config.rollout.vllm.sync_weights


def policy_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights as a Hugging Face model names them, whole, one at a time on every
    rank (`full_tensors`); with LoRA, W + (alpha / r) B A for each adapted weight, merged a
    decoder layer at a time (`pacs.models.lora.merged_tensors`) and without the adapters."""
    state = full_tensors(model)
    module = unwrap(model)
    if not is_lora(module):
        yield from state
        return
    for _, layer in itertools.groupby(state, key=lambda item: _layer_of(item[0])):
        named = list(layer)
        adapters = {name: tensor for name, tensor in named if is_adapter_weight(name)}
        yield from merged_tensors(module, ((name, tensor) for name, tensor in named if name not in adapters), adapters)


def _layer_of(name: str) -> str:
    """The decoder layer a state-dict key belongs to ("layers.3"), or the key itself."""
    match = _DECODER_LAYER.search(name)
    return f"layers.{match.group(1)}" if match else name


def sampler_mismatch(
    world: World, sampler_logprobs: torch.Tensor, old_logprobs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """How far the engine's sampling distribution is from the trainer's rollout policy, over
    every response token of every rank:

        d_t = |log π_old(y_t) − log μ(y_t)|,   ρ_t = π_old(y_t) / μ(y_t) = exp(log π_old − log μ)

    `rollout/logprob_abs_diff_mean` (token mean of d), `..._max`, and the importance ratio's range
    `rollout/importance_ratio_min` / `_max` (μ: the sampler, π_old: the trainer's recomputation of
    the same weights; equal up to kernel rounding when the weights are in sync).

    sampler_logprobs, old_logprobs, response_mask: (B, R), this rank's rows.
    """
    on_tokens = response_mask > 0
    log_ratio = (old_logprobs.double() - sampler_logprobs.to(old_logprobs.device).double())[on_tokens]
    totals = sum_over_ranks(world, torch.tensor([float(log_ratio.abs().sum()), float(log_ratio.numel())], dtype=torch.float64))
    none = log_ratio.numel() == 0
    return {
        "rollout/logprob_abs_diff_mean": float(totals[0] / totals[1].clamp(min=1)),
        "rollout/logprob_abs_diff_max": max_over_ranks(world, 0.0 if none else float(log_ratio.abs().max())),
        "rollout/importance_ratio_min": -max_over_ranks(world, -1.0 if none else -float(log_ratio.min().exp())),
        "rollout/importance_ratio_max": max_over_ranks(world, 1.0 if none else float(log_ratio.max().exp())),
    }
