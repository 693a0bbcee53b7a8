"""FSDP2 behaviours that only show with several processes, checked in the exactness tests' launch.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 tests/helpers/distributed_update.py MODEL_DIR OUT_DIR ... --checks OUT.json

runs `observe` after the update cases, and rank 0 writes OUT.json with what it saw:
- "all_gathers_per_forward_before" / "_after_generation": all-gathers that one forward pass of the
  policy costs, before and after `unsharded_for_generation` (its root keeps its parameters gathered after
  forward, as FSDP2 sets a root, and generation must leave it so);
- "sharded_gradients_between_micro_batches": every trainable parameter holds a sharded gradient
  after a backward pass that does not synchronise (`gradient_sync(world, model, sync=False)`);
- "reference_sharded": the frozen reference's parameters are shards, not whole tensors;
- "loads_per_rank": how many times each rank read the model from disk (`load_on_rank0`: rank 0
  alone), and "loaded_max_difference": the largest difference of the sharded model's gathered
  weights and every rank's buffers (rotary frequencies) from the model on disk;
  "parameters_of_skeleton_and_disk": parameter counts (tied weights once) of both;
- "ddp_loaded": under DDP (same launch), how many times each rank read the model, whether the
  filled skeleton's output embedding is still its input embedding (tied), and the largest
  difference of its weights from the model on disk;
- "errors_of_a_failed_decision": what each rank raised when the decision rank 0 alone takes
  (`run_on_rank0`) failed;
- "errors_of_a_failure_on_rank_1": the message each rank raised when an action that every rank
  takes (`run_on_every_rank`) failed on rank 1 alone.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from pacs.distributed.collectives import NodeError, gather_objects, run_on_every_rank, run_on_rank0
from pacs.distributed.generation import unsharded_for_generation
from pacs.distributed.state_dict import full_tensors_on_rank0, named_state
from pacs.distributed.world import World
from pacs.distributed.wrapping import gradient_sync, load_on_rank0, unwrap, wrap_frozen_model, wrap_model
from pacs.models.loading import load_causal_lm

ALL_GATHERS = ("all_gather_single", "all_gather_into_tensor")
"""The entry points FSDP's all-gathers take: `all_gather_single` where torch has it (2.13), otherwise
`all_gather_into_tensor` (torch 2.11, the GPU machines' torch, has no `all_gather_single`)."""


def count_all_gathers(run) -> int:
    calls = 0
    originals = {name: getattr(dist, name) for name in ALL_GATHERS if hasattr(dist, name)}

    def counting(original):
        def wrapper(*args, **kwargs):
            nonlocal calls
            calls += 1
            return original(*args, **kwargs)

        return wrapper

    for name, original in originals.items():
        setattr(dist, name, counting(original))
    try:
        run()
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
    return calls


class CountedLoad:
    """The model at `model_dir` in float32, for `load_on_rank0`, counting how often it was read."""

    def __init__(self, model_dir: str) -> None:
        self.model_dir, self.count = model_dir, 0

    def __call__(self) -> torch.nn.Module:
        self.count += 1
        return load_causal_lm(self.model_dir, dtype="float32")


def ddp_load_check(model_dir: str, on_disk: torch.nn.Module) -> dict:
    """`load_on_rank0` + `wrap_model` under DDP on the process group the FSDP world opened."""
    world = World.from_environment("ddp")
    load = CountedLoad(model_dir)
    skeleton, rank0_weights = load_on_rank0(world, load)
    model = unwrap(wrap_model(world, skeleton, rank0_weights=rank0_weights))
    on_disk_state = on_disk.state_dict()
    return {
        "loads_per_rank": gather_objects(world, load.count),
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "max_difference": max(float((value - on_disk_state[name]).abs().max()) for name, value in model.state_dict().items()),
    }


def observe(world: World, model_dir: str) -> dict | None:
    """What every rank saw of the checks above, on rank 0 (None elsewhere); `world` is FSDP's."""
    load = CountedLoad(model_dir)
    skeleton, rank0_weights = load_on_rank0(world, load)
    model = wrap_model(world, skeleton, rank0_weights=rank0_weights)
    on_disk = load_causal_lm(model_dir, dtype="float32")
    buffers = {name: buffer for name, buffer in on_disk.named_buffers()}
    buffer_difference = max(float((buffer - buffers[name]).abs().max()) for name, buffer in model.named_buffers())
    gathered = dict(full_tensors_on_rank0(world, named_state(model)))
    seen: dict = {
        "loads_per_rank": gather_objects(world, load.count),
        "parameters_of_skeleton_and_disk": [sum(p.numel() for p in m.parameters()) for m in (skeleton, on_disk)],
    }
    buffer_differences = gather_objects(world, buffer_difference)
    if world.is_writer:
        on_disk_state = on_disk.state_dict()
        weight_difference = max(float((value - on_disk_state[name]).abs().max()) for name, value in gathered.items())
        seen["loaded_max_difference"] = max(weight_difference, *buffer_differences)
    seen["ddp_loaded"] = ddp_load_check(model_dir, on_disk)
    tokens = torch.arange(1, 9).unsqueeze(0)

    def forward():
        with torch.no_grad():
            model(input_ids=tokens)

    forward()  # the first forward initialises FSDP
    seen["all_gathers_per_forward_before"] = count_all_gathers(forward)
    with unsharded_for_generation(model) as unwrapped:
        unwrapped.generate(input_ids=tokens, max_new_tokens=2, do_sample=False, synced_gpus=False)
    seen["all_gathers_per_forward_after_generation"] = count_all_gathers(forward)

    with gradient_sync(world, model, sync=False):
        model(input_ids=tokens).logits.sum().backward()
    trainable = [parameter for parameter in model.parameters() if parameter.requires_grad]
    seen["sharded_gradients_between_micro_batches"] = all(
        isinstance(parameter.grad, DTensor) and parameter.grad.to_local().numel() < parameter.grad.numel()
        for parameter in trainable
        if parameter.numel() >= world.world_size
    )
    reference = wrap_frozen_model(world, load_causal_lm(model_dir, dtype="float32"))
    seen["reference_sharded"] = all(
        isinstance(parameter, DTensor) and parameter.to_local().numel() < parameter.numel()
        for parameter in reference.parameters()
        if parameter.numel() >= world.world_size
    )
    try:
        run_on_rank0(world, lambda: Path(model_dir, "no-such-file").read_text())
        raised = None
    except FileNotFoundError as error:
        raised = type(error).__name__
    seen["errors_of_a_failed_decision"] = gather_objects(world, raised)
    try:
        run_on_every_rank(world, lambda: Path(model_dir, "no-such-file").read_text() if world.rank == 1 else "")
        message = None
    except NodeError as error:
        message = str(error)
    seen["errors_of_a_failure_on_rank_1"] = gather_objects(world, message)
    return seen if world.is_writer else None
