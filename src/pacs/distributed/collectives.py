"""Every `torch.distributed` collective pacs calls, as free functions of the `World` they run in:
the identity with one process, and every tensor handed to the backend on a device it serves
(`communication_device`). tests/helpers/collective_audit.py fails a 2-process run that calls a
collective from pacs code anywhere else (package docstring)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist

from pacs.distributed.world import World

T = TypeVar("T")


class NodeError(ValueError):
    """Something that some ranks could not do (`run_on_every_rank`), raised on every rank: the
    message names each rank that failed, its node and host, and its error."""


def communication_device(backend_config: str, tensor_device: torch.device, local_rank: int) -> torch.device:
    """Where a collective must see a tensor that lives on `tensor_device`, for a process group
    configured as `torch.distributed.get_backend_config()` says ("cuda:nccl", "cpu:gloo,cuda:nccl",
    "cpu:gloo,cuda:gloo"): where it is when the backend serves that device type, else the CPU when
    the backend serves it, else this rank's CUDA device (NCCL serves CUDA tensors only)."""
    served = {entry.split(":")[0] for entry in backend_config.split(",")}
    if tensor_device.type in served:
        return tensor_device
    if "cpu" in served:
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def _on_backend_device(world: World, tensor: torch.Tensor) -> torch.Tensor:
    """A copy of `tensor` on a device the process group's backend serves, for a collective to
    work on in place."""
    device = communication_device(dist.get_backend_config(), tensor.device, world.local_rank)
    return tensor.detach().to(device, copy=True)


def sum_over_ranks(world: World, value: torch.Tensor) -> torch.Tensor:
    """The sum of `value` over every rank (a new tensor on `value`'s device; any shape)."""
    if world.world_size == 1:
        return value.clone()
    total = _on_backend_device(world, value)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total.to(value.device)


def max_over_ranks(world: World, value: float) -> float:
    """The largest `value` of any rank."""
    if world.world_size == 1:
        return value
    largest = _on_backend_device(world, torch.tensor(value, dtype=torch.float64))
    dist.all_reduce(largest, op=dist.ReduceOp.MAX)
    return float(largest)


def gather_rows(world: World, rows: torch.Tensor) -> torch.Tensor:
    """(b, ...) rows of every rank, concatenated in rank order: (world_size * b, ...). Every rank
    must pass the same shape."""
    if world.world_size == 1:
        return rows
    local = _on_backend_device(world, rows)
    parts = [torch.empty_like(local) for _ in range(world.world_size)]
    dist.all_gather(parts, local)
    return torch.cat(parts).to(rows.device)


def gather_objects(world: World, value: Any) -> list[Any]:
    """`value` of every rank, in rank order (picklable objects between this job's own processes;
    used for rollout records and evaluation reports)."""
    if world.world_size == 1:
        return [value]
    gathered: list[Any] = [None] * world.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def gather_objects_on_rank0(world: World, value: Any) -> list[Any] | None:
    """`value` of every rank, in rank order, on rank 0 alone (None on the others): for what rank 0
    alone writes (evaluation records), which no other rank needs a copy of."""
    if world.world_size == 1:
        return [value]
    gathered: list[Any] | None = [None] * world.world_size if world.is_writer else None
    dist.gather_object(value, gathered, dst=0)
    return gathered


def broadcast_from_rank0(world: World, tensor: torch.Tensor) -> torch.Tensor:
    """Rank 0's `tensor` (same shape and dtype on every rank), on the caller's device."""
    if world.world_size == 1:
        return tensor
    received = _on_backend_device(world, tensor)
    dist.broadcast(received, src=0)
    return received.to(tensor.device)


def run_on_rank0(world: World, action: Callable[[], T]) -> T:
    """`action()` run by rank 0 alone, its value returned on every rank: for a decision that every
    rank must take alike (which checkpoint to resume, what a file holds) from what rank 0 sees.
    When it raises, every rank raises the same error (none is left waiting)."""
    if world.world_size == 1:
        return action()
    outcome: tuple[bool, Any] | None = None  # (True, the value) or (False, the error); set on rank 0
    if world.is_writer:
        try:
            outcome = (True, action())
        except Exception as error:  # sent to every rank, raised below on each
            outcome = (False, error)
    message = [outcome]
    dist.broadcast_object_list(message, src=0)
    succeeded, value = cast(tuple[bool, Any], message[0])  # rank 0's outcome, on every rank after the broadcast
    if not succeeded:
        raise value
    return value


def run_on_every_rank(world: World, action: Callable[[], T], *, how_to_fix: str = "", node_leader_first: bool = False) -> T:
    """`action()` on every rank, its own value returned to each: for what every node does from its
    own disk (reading the tokenizer, the data). When it raises on any rank, every rank raises one
    `NodeError` that names each failed rank (`World.place`) and its error, then `how_to_fix`, so
    none goes on into a collective that a failed rank will never join. With `node_leader_first`,
    each node's local rank 0 runs it before the node's other ranks: for work that fills a node's
    cache (building a built-in model, a hub download), which the others then find done instead of
    racing to write it."""
    if world.world_size == 1:
        return action()
    value, own_error = None, None
    try:
        with _node_leader_first(world) if node_leader_first else nullcontext():
            value = action()
    except Exception as error:  # every rank learns of it below
        own_error = error
    failure = None if own_error is None else f"{world.place}: {type(own_error).__name__}: {own_error}"
    failures = [failure for failure in gather_objects(world, failure) if failure is not None]
    if failures:
        lines = [f"{len(failures)} of {world.world_size} processes could not go on:", *failures, how_to_fix]
        raise NodeError("\n".join(line for line in lines if line)) from own_error
    return cast(T, value)  # no rank failed, so this rank's action returned it


@contextmanager
def _node_leader_first(world: World) -> Iterator[None]:
    """The body on each node's local rank 0 first, then on the node's other ranks."""
    if world.local_rank != 0:
        barrier(world)
    try:
        yield
    finally:  # a leader that failed still lets the others go (they report their own outcome)
        if world.local_rank == 0:
            barrier(world)


def mean_over_ranks(world: World, metrics: dict[str, float], weights: dict[str, float] | None = None) -> dict[str, float]:
    """Metrics that are means over each rank's own rows or tokens, made global: the mean over the
    ranks that report a key, each rank weighted by `weights[key]` (the count its value is a mean
    over; 1 when absent). Non-finite values stay non-finite."""
    if world.world_size == 1:
        return dict(metrics)
    weights = weights or {}
    per_rank = gather_objects(world, {key: (value, weights.get(key, 1.0)) for key, value in metrics.items()})
    reduced = {}
    for key in dict.fromkeys(key for values in per_rank for key in values):
        pairs = [values[key] for values in per_rank if key in values]
        total_weight = sum(weight for _, weight in pairs)
        if total_weight > 0:
            reduced[key] = sum(value * weight for value, weight in pairs if weight) / total_weight
        else:
            reduced[key] = sum(value for value, _ in pairs) / len(pairs)
    return reduced


def slowest_timings(world: World, timings: dict[str, float], *, by: str) -> dict[str, float]:
    """The timings (seconds) of the rank whose `timings[by]` is the largest, all from that rank so
    that its phases add up as they did there."""
    if world.world_size == 1:
        return dict(timings)
    return max(gather_objects(world, timings), key=lambda values: values[by])


def barrier(world: World) -> None:
    """Wait until every rank gets here."""
    if world.world_size > 1:
        dist.barrier()
