"""The trainer's side of its rollout engine: which engine a run builds, the policy's weights as an
engine that holds its own copy (vLLM) takes them, and how far that sampler is from the trainer.

`transformers` generates with the trained module itself, so it never needs weights pushed. vLLM
holds a copy; before every rollout that follows an update (or a sleep that dropped it) the
trainer pushes `policy_weights`: under FSDP2 each tensor cast to the engine's dtype and gathered
when its turn comes (never a second whole model), with LoRA the adapters merged into their base
weights on the device one decoder layer at a time, a tied `lm_head.weight` pushed under its own
name. With tensor parallelism the ranks of a `generation_group` generate together. vLLM's
log-probs are those of the distribution it sampled from; `sampler_mismatch` compares them with
the trainer's recomputed old log-probs every step, and with `algorithm.rollout_is_cap`
`sampler_correction` says how much the correction reweights.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator

import torch

from pacs.algos.importance import sampler_correction_metrics, sampler_correction_sums
from pacs.config import Config
from pacs.distributed.collectives import (
    max_over_ranks,
    run_on_every_rank,
    sum_over_ranks,
)
from pacs.distributed.state_dict import full_tensors
from pacs.distributed.world import World
from pacs.distributed.wrapping import unwrap
from pacs.models.lora import is_adapter_weight, is_lora, merged_tensors
from pacs.models.precision import Precision
from pacs.rollout.base import GenerationGroup, RolloutEngine, rank_seed
from pacs.rollout.continuous_batching import continuous_batching_on
from pacs.rollout.hf import TransformersEngine
from pacs.rollout.vllm import EnginePlace, VllmEngine, local_model_dir

_DECODER_LAYER = re.compile(r"\.layers\.(\d+)\.")
MODEL_ON_EVERY_NODE = "Every node needs model.path at the same path on its own disk (or the hub id reachable from it)."


def generation_group(config: Config, world: World) -> GenerationGroup:
    """The ranks that generate with this rank (`GenerationGroup`): `rollout.vllm.tensor_parallel_size`
    consecutive ones with vLLM, each rank alone with `hf`. Refuses (ValueError) a size that does not
    divide the processes of a node, before anything starts."""
    size = config.rollout.vllm.tensor_parallel_size if config.rollout.engine == "vllm" else 1
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world.world_size)))
    return GenerationGroup.of(world.rank, world.world_size, size, processes_per_node=per_node)


def build_engine(config: Config, world: World, policy_module: torch.nn.Module, tokenizer) -> TransformersEngine | VllmEngine:
    """`rollout.engine`'s engine for this process (transformers' with `rollout.max_staleness`, where
    the generator process holds the configured one and this one only validates): transformers' generate on `policy_module`
    (the unwrapped language model), or a vLLM engine in the run's compute dtype, attached to the
    job (`EnginePlace`: each rank's engine on its own device), seeded per generation group, started
    without reading the checkpoint when the trainer pushes the weights before the first rollout.
    Every node first gets what vLLM reads of `model.path` (`local_model_dir`), so that a node that
    cannot stops every rank with its error; then every rank starts its engine at once."""
    if config.rollout.engine == "hf" or config.rollout.max_staleness:
        return TransformersEngine(
            policy_module,
            tokenizer,
            max_sequences_per_call=config.rollout.generation_batch_size,
            continuous_batching=continuous_batching_on(config.rollout.hf.continuous_batching, world.device),
        )
    settings = config.rollout.vllm
    pushed = settings.sync_weights
    model_dir = run_on_every_rank(
        world,
        lambda: local_model_dir(config.model.path, with_weights=not pushed),
        how_to_fix=MODEL_ON_EVERY_NODE,
        node_leader_first=True,
    )
    return VllmEngine(
        model_dir,
        tokenizer,
        settings,
        dtype=Precision(config.model.dtype).engine,
        max_model_len=settings.max_model_len or config.data.max_prompt_length + config.data.max_response_length,
        seed=rank_seed(config.seed, generation_group(config, world).index),
        place=EnginePlace(world.rank, world.world_size, world.device.index or 0),
        max_num_seqs=config.rollout.generation_batch_size,
        weights_pushed=pushed,
    )


def pushes_weights(engine: RolloutEngine, config: Config) -> bool:
    """Whether the trainer pushes the policy's weights into `engine` (`RolloutEngine.load_weights`)
    after every update: when it holds its own copy (vLLM), unless `rollout.vllm.sync_weights` is off."""
    return engine.holds_own_weights and config.rollout.vllm.sync_weights


def policy_weights(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The policy's weights as a Hugging Face model names them, whole, one at a time on every
    rank, on the rank's device (`full_tensors`; under FSDP each shard cast to `dtype`, the
    engine's, before it is gathered); with LoRA, W + (alpha / r) B A for each adapted weight,
    merged a decoder layer at a time (`pacs.models.lora.merged_tensors`) and without the
    adapters (whose product is computed in float32 whatever `dtype`)."""
    module = unwrap(model)
    state = full_tensors(model, dtype=None if is_lora(module) else dtype)
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


def sampler_correction(
    world: World,
    weights: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
) -> dict[str, float]:
    """The sampler correction's diagnostics over every rank's rows (`importance.sampler_correction_metrics`:
    `rollout_is/weight_mean`, `ratio_max`, `truncated_fraction`, `masked_fraction`, `ess`,
    `sampler_kl`), per response for (B,) weights (PACS, the sequence level), per token for (B, R)
    weights (the token level); truncated and masked units are read off the applied weights, so any
    `algorithm.rollout_is_mode` is reported without being named here.

    weights: the algorithm's "rollout_is_weight"; sampler_logprobs, old_logprobs, response_mask: (B, R).
    """
    sums, log_ratio_max = sampler_correction_sums(weights, old_logprobs, sampler_logprobs, response_mask, cap)
    return sampler_correction_metrics(sum_over_ranks(world, sums), max_over_ranks(world, log_ratio_max))
