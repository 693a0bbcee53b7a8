"""Models for the strategy: loaded once (by rank 0, sent to the others as an empty skeleton),
wrapped for training (DDP, or FSDP2 on each decoder layer then the root) or for forward passes
alone (the frozen KL reference), and unwrapped again."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol, cast

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from pacs.distributed.collectives import broadcast_from_rank0, run_on_rank0
from pacs.distributed.world import DistributedConfigError, World
from pacs.models.lora import language_model


class _TiesWeights(Protocol):
    """A Hugging Face model: `tie_weights` makes its output layer the input embeddings' tensor again."""

    def tie_weights(self) -> None: ...


@dataclass(frozen=True)
class Rank0Weights:
    """Rank 0's loaded tensors, kept while its model is sent to every rank as a skeleton
    (`load_on_rank0`): the state dict, and every buffer (non-persistent ones, like rotary
    frequencies, included). Empty on the other ranks, whose skeletons rank 0's tensors fill."""

    state: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


def load_on_rank0(world: World, load: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, Rank0Weights | None]:
    """A model for `wrap_model` or `wrap_frozen_model`, read by rank 0 alone: rank 0 runs `load()`
    (on the CPU), keeps its tensors aside and sends every rank the model as an empty skeleton on the
    meta device, which the wrapping fills from rank 0's tensors (each rank its shard under FSDP, the
    whole model under DDP). So no node holds one copy per rank while loading, and only rank 0 needs
    to see what `load` reads (a checkpoint on its own disk). With one process: `load()` and None.
    Every rank must call it."""
    if world.strategy == "none":
        return load(), None
    weights = Rank0Weights({}, {})  # rank 0 fills it; elsewhere it says "a skeleton to fill"

    def skeleton_of_loaded() -> torch.nn.Module:
        model = load()
        weights.state.update(model.state_dict())
        weights.buffers.update(model.named_buffers())
        return model.to("meta")  # the tensors kept in `weights` keep their data; the model is now a skeleton

    skeleton = run_on_rank0(world, skeleton_of_loaded)
    cast(_TiesWeights, skeleton).tie_weights()  # moving to the meta device gave tied weights a parameter each
    return skeleton, weights


def wrap_model(
    world: World,
    model: torch.nn.Module,
    *,
    compute_dtype: torch.dtype | None = None,
    rank0_weights: Rank0Weights | None = None,
) -> torch.nn.Module:
    """`model` on this rank's device, wrapped for the strategy: DDP, or FSDP2 with each decoder
    layer and then the root sharded (bf16 compute with fp32 sharded master weights when
    `compute_dtype` is bfloat16). For a LoRA model the FSDP root is the Hugging Face model inside
    peft's wrapper, the module that generation calls as well. A skeleton from `load_on_rank0` is
    filled from `rank0_weights`: under FSDP sharded empty first, each rank then keeping its shard;
    under DDP whole (DDP's own broadcast of rank 0's tensors at construction is then skipped: they
    are there already)."""
    if world.strategy == "ddp":
        device_ids = [world.device.index] if world.device.type == "cuda" else None
        model = _on_device(world, model, rank0_weights)
        return DistributedDataParallel(model, device_ids=device_ids, init_sync=rank0_weights is None)
    if world.strategy == "fsdp":
        return _fully_shard(world, model, compute_dtype, reshard_root=False, rank0_weights=rank0_weights)
    return model.to(world.device)


def wrap_frozen_model(
    world: World,
    model: torch.nn.Module,
    *,
    compute_dtype: torch.dtype | None = None,
    rank0_weights: Rank0Weights | None = None,
) -> torch.nn.Module:
    """A model that is never trained (the KL reference), ready for forward passes: sharded like
    `wrap_model` under FSDP, the root resharded after forward too (no rank holds it whole between
    passes: no backward follows), on this rank's device otherwise."""
    model.requires_grad_(False)
    if world.strategy == "fsdp":
        return _fully_shard(world, model, compute_dtype, reshard_root=True, rank0_weights=rank0_weights).eval()
    return _on_device(world, model, rank0_weights).eval()


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model inside a DDP wrapper (FSDP2 shards in place: no wrapper)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def gradient_sync(world: World, model: torch.nn.Module, sync: bool):
    """A context in which backward passes synchronise gradients across ranks only when `sync` (the
    last micro-batch of an optimizer update). Under FSDP2 every backward synchronises: its
    reduce-scatter keeps each rank's gradients a shard, where skipping it would hold the whole
    unsharded gradient until the update's last micro-batch."""
    if sync or world.strategy != "ddp":
        return nullcontext()
    return cast(DistributedDataParallel, model).no_sync()  # wrapped by wrap_model under ddp


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a Hugging Face model (the units FSDP2 shards): the
    children of its first `ModuleList` (`model.model.layers` for Qwen2 and Llama)."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            return list(module)
    raise DistributedConfigError(f"{type(model).__name__} has no list of decoder layers to shard with FSDP")


def _on_device(world: World, model: torch.nn.Module, rank0_weights: Rank0Weights | None) -> torch.nn.Module:
    """`model` on this rank's device; a skeleton (`load_on_rank0`) given storage there and filled."""
    if rank0_weights is None:
        return model.to(world.device)
    model.to_empty(device=world.device)
    cast(_TiesWeights, model).tie_weights()  # to_empty gave tied weights a tensor each
    _fill_from_rank0(world, model, rank0_weights)
    return model


def _fully_shard(
    world: World,
    model: torch.nn.Module,
    compute_dtype: torch.dtype | None,
    *,
    reshard_root: bool,
    rank0_weights: Rank0Weights | None,
) -> torch.nn.Module:
    """FSDP2 on each decoder layer, then on the root; the root of a trained model keeps its
    parameters gathered after forward (FSDP2's own choice for a root: backward needs them right
    away), which `unsharded_for_generation` restores. A skeleton (`load_on_rank0`) is sharded on
    the meta device, given storage for its shards only, and filled: each tensor is broadcast from
    rank 0, every rank keeping its shard."""
    policy = (
        MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32) if compute_dtype else MixedPrecisionPolicy()
    )
    if rank0_weights is None:
        model = model.to(world.device)
    for layer in decoder_layers(model):
        fully_shard(layer, mp_policy=policy)
    fully_shard(language_model(model), mp_policy=policy, reshard_after_forward=reshard_root)
    if rank0_weights is not None:
        model.to_empty(device=world.device)
        _fill_from_rank0(world, model, rank0_weights)
    return model


def _fill_from_rank0(world: World, model: torch.nn.Module, rank0_weights: Rank0Weights) -> None:
    """Every tensor of a skeleton that has storage, filled from rank 0's `rank0_weights`: each
    state tensor broadcast, every rank keeping what it holds of it (its shard of a sharded one),
    then every buffer (non-persistent ones, like rotary frequencies, included)."""
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, cast(dict[str, Any], rank0_weights.state), options=options)
    for name, buffer in model.named_buffers():
        buffer.copy_(broadcast_from_rank0(world, rank0_weights.buffers[name] if world.is_writer else buffer))
