"""A wrapped model's and its optimizer's state, streamed one tensor at a time: to rank 0 for a
checkpoint (`named_state`, `full_tensors_on_rank0`), whole on every rank for a weight push
(`full_tensors`), and from rank 0 back to every rank as its shard on resume (`from_rank0_like`).
No rank ever holds more than one gathered tensor beyond what the consumer keeps."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor

from pacs.distributed.collectives import broadcast_from_rank0
from pacs.distributed.world import World
from pacs.distributed.wrapping import unwrap


def named_state(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """(key, tensor) of the state dict of the model inside any wrapper, each tensor once: a tied
    weight (shared by two modules) under its first key only, the one `save_pretrained` keeps.
    Under FSDP2 the tensors are the shards (DTensors; the root is resharded first, see `reshard`),
    for `full_tensors_on_rank0` to gather one at a time."""
    reshard(model)
    seen: set[int] = set()
    named = []
    for key, tensor in unwrap(model).state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            named.append((key, tensor))
    return named


def parameters_by_name(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of the model inside any wrapper, as its optimizer holds them: under FSDP2
    the shards (the root is resharded first, see `reshard`)."""
    reshard(model)
    return list(unwrap(model).named_parameters())


def full_tensors(model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """Each (name, tensor) of the state dict of the model inside any wrapper, whole, on every
    rank, one at a time, in `dtype` when given (floating-point tensors): under FSDP2 a shard is
    cast, then all-gathered when its turn comes (every rank must iterate to the end, in step), so
    no rank holds more than one gathered tensor beyond what the consumer keeps, and a bf16
    consumer gathers half the bytes of the fp32 masters. Tied weights appear under each of their
    names."""
    reshard(model)
    for name, tensor in unwrap(model).state_dict().items():
        tensor = tensor.detach()
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_tensors_on_rank0(world: World, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each (name, tensor) whole, on rank 0's CPU, one at a time: a sharded tensor (DTensor, FSDP)
    is gathered when its turn comes, so no rank ever holds more than one of them whole. Yields
    nothing on other ranks, which must still iterate to take part."""
    for name, tensor in named_tensors:
        whole = tensor.detach()
        if isinstance(whole, DTensor):
            whole = whole.full_tensor()
        if world.is_writer:
            yield name, whole.detach().to("cpu", copy=True)


def from_rank0_like(
    world: World, whole: torch.Tensor | None, like: torch.Tensor, *, shape: torch.Size, dtype: torch.dtype
) -> torch.Tensor:
    """Rank 0's `whole` tensor (of `shape` and `dtype`; None on other ranks) as this rank holds
    tensors like `like`: its shard, placed as `like` is, for a DTensor; the whole tensor on
    `like`'s device otherwise."""
    if world.is_writer and whole is None:
        raise ValueError("from_rank0_like: rank 0 gives the whole tensor, got None")
    source = whole if world.is_writer and whole is not None else torch.empty(shape, dtype=dtype)
    if isinstance(like, DTensor):
        return distribute_tensor(source.to(like.device), like.device_mesh, like.placements, src_data_rank=0)
    return broadcast_from_rank0(world, source).to(like.device)


def reshard(model: torch.nn.Module) -> None:
    """Every FSDP2 module of `model` back to its shards: the root stays gathered after a forward
    pass until the next backward ends, and while it is, the model's registered parameters are its
    gathered tensors, not the sharded ones that the optimizer and state dicts name."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
