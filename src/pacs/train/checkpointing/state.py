"""Checkpoints in Hugging Face format, written atomically, plus what resuming needs.

    checkpoints/step_N/   config.json, model.safetensors (or model-0000i-of-0000N.safetensors and
                          model.safetensors.index.json), tokenizer files (any HF tool reads it)
                          pacs-provenance.json: for a model converted by pacs (from GGUF), where
                          its base weights come from (`pacs.models.gguf.write_trained_provenance`)
                          trainer_state.pt: step, RNG states, data position, the tracker runs'
                          ids, with rollout.max_staleness the batches sampled ahead (tensors
                          and plain Python values only: read with torch.load(weights_only=True))
                          optimizer/: the AdamW state, "<parameter name>:<key>" -> the whole
                          tensor, in safetensors files of at most 1 GiB each (none before the
                          first update)
                          critic/, critic_optimizer/: PPO's critic (value head) and its optimizer
                          reference/: with `train.reference_reset_every`, the reference model as
                          last reset (a snapshot of the policy, which resuming starts from)
                          adapter/: with LoRA, the adapter (adapter_config.json,
                          adapter_model.safetensors); the model files beside it are then the
                          merged model (base + adapter), and resuming loads the base from
                          `model.path` and the adapter from here
    checkpoints/final/    the same after the last step

Every tensor is written as it is gathered: a sharded (FSDP) model or optimizer state reaches rank
0 one tensor at a time and is written in files of at most `MODEL_FILE_BYTES` /
`OPTIMIZER_FILE_BYTES`, so rank 0 never holds a whole model or optimizer state in memory.

A checkpoint is assembled in a hidden staging folder, fsynced, given a manifest and renamed into
place (`pacs.train.checkpointing.folders`), so neither a kill nor a machine crash mid-write leaves a
partial `step_N` for `resume=auto` to pick up.

Resuming never unpickles arbitrary objects: a crafted `trainer_state.pt` could otherwise run code
on `resume=auto`. The state is loaded with `weights_only=True`, which admits tensors and plain
containers of numbers and strings; a state file holding anything else, or of another format than
`TRAINER_STATE_FORMAT`, is refused with `CheckpointError`, whose message says how to go on from the
checkpoint's weights.
"""

from __future__ import annotations

import pickle
import random
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from transformers import PreTrainedTokenizerBase

from pacs.config import Config
from pacs.distributed.collectives import barrier, gather_rows, run_on_rank0
from pacs.distributed.state_dict import (
    from_rank0_like,
    full_tensors_on_rank0,
    named_state,
    parameters_by_name,
)
from pacs.distributed.world import World
from pacs.distributed.wrapping import unwrap
from pacs.models.gguf import write_trained_provenance
from pacs.models.lora import (
    ADAPTER_DIR,
    is_adapter_weight,
    is_lora,
    language_model,
    merged_tensors,
    save_adapter,
)
from pacs.models.saving import save_streamed, with_umask_modes, write_safetensors_files
from pacs.outputs import size_text
from pacs.rollout.base import rank_seed
from pacs.train.checkpointing.folders import (
    TRAINER_STATE,
    put_in_place,
    removed_on_error,
    seal,
    staging_directory,
)
from pacs.train.sampler import PromptSampler

TRAINER_STATE_FORMAT = 3
"""Written into every trainer state as "format"; bumped when its layout changes."""
CRITIC_DIR = "critic"
REFERENCE_DIR = "reference"
OPTIMIZER_DIR = "optimizer"
CRITIC_OPTIMIZER_DIR = "critic_optimizer"
OPTIMIZER_FILE_BYTES = 1 << 30
"""Largest optimizer-state file rank 0 holds in memory while writing a checkpoint."""
MODEL_FILE_BYTES = 1 << 30
"""Largest model-weights file rank 0 holds in memory while writing a checkpoint."""


def save_checkpoint(
    directory: Path,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    trainer_state: dict[str, Any],
    *,
    world: World | None = None,
    critic: torch.nn.Module | None = None,
    staging: Path | None = None,
) -> Path:
    """Write model, tokenizer, `trainer_state` (and PPO's critic, in `critic/`) to `directory`,
    replacing it atomically once every file is on disk (`seal`, `put_in_place`); every rank of
    `world` (None: this process alone) must call it, and rank 0 writes. The models are written
    one tensor at a time (`save_model`), whatever wraps them. `staging`: a directory from
    `staging_directory` that already holds other files of the checkpoint (rank 0). An existing
    `directory` is replaced only if it is a checkpoint or empty (a `pacs.outputs.MARKER` in it is
    kept); anything else raises FileExistsError before a file is written."""
    world = world or World.single()
    if world.is_writer:
        staging = staging or staging_directory(directory)
    with removed_on_error(staging):
        save_model(world, model, staging)
        if critic is not None:
            save_model(world, critic, staging and staging / CRITIC_DIR)
        if not world.is_writer:
            return directory
        tokenizer.save_pretrained(staging)
        write_trained_provenance(tokenizer.name_or_path, staging)
        torch.save({**trainer_state, "format": TRAINER_STATE_FORMAT}, staging / TRAINER_STATE)
        seal(with_umask_modes(staging), trainer_state.get("step"))
    return put_in_place(staging, directory)


def save_model(world: World, model: torch.nn.Module, directory: Path | None) -> None:
    """`model` (inside any wrapper) as a Hugging Face directory in `directory` (rank 0; None
    elsewhere), its state gathered one tensor at a time and written in files of at most
    `MODEL_FILE_BYTES`, in the dtype the model holds it in: rank 0 holds at most
    one file's worth of tensors, never the whole model (`pacs.models.saving.save_streamed`). A
    LoRA model is written as its merged model (`merged_tensors`) plus `ADAPTER_DIR`; its adapter
    tensors (small) are gathered first. Every rank must call it."""
    state = named_state(model)
    inner = unwrap(model)
    adapters: dict[str, torch.Tensor] = {}
    if is_lora(inner):
        adapters = dict(full_tensors_on_rank0(world, ((key, value) for key, value in state if is_adapter_weight(key))))
        base = full_tensors_on_rank0(world, ((key, value) for key, value in state if not is_adapter_weight(key)))
        tensors = merged_tensors(inner, base, adapters)
    else:
        tensors = full_tensors_on_rank0(world, state)
    _written_on_writer(world, tensors, lambda stream: save_streamed(language_model(inner), directory, stream, MODEL_FILE_BYTES))
    if is_lora(inner) and world.is_writer:
        save_adapter(inner, directory / ADAPTER_DIR, adapters)


def _written_on_writer(world: World, tensors: Iterator[tuple[str, torch.Tensor]], write: Callable[[Iterator], object]) -> None:
    """`write(tensors)` on rank 0. The other ranks run through `tensors` without writing: each
    of them takes part in the gather of every tensor that rank 0 receives."""
    if world.is_writer:
        write(tensors)
        return
    for _ in tensors:
        pass


def _optimized_parameters(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of every parameter `optimizer` updates, in the model's order."""
    updated = {id(parameter) for group in optimizer.param_groups for parameter in group["params"]}
    return [(name, parameter) for name, parameter in parameters_by_name(model) if id(parameter) in updated]


def save_optimizer_state(world: World, model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path | None) -> None:
    """The optimizer's state, whole, as "<parameter name>:<key>" tensors in safetensors files in
    `directory` (rank 0; None elsewhere). Every rank must call it: sharded states are gathered
    one tensor at a time, and rank 0 holds at most `OPTIMIZER_FILE_BYTES` of them. An optimizer
    that has not stepped writes nothing (and is not stepped to fill its state)."""
    named_states = (
        (f"{name}:{key}", value)
        for name, parameter in _optimized_parameters(model, optimizer)
        for key, value in optimizer.state.get(parameter, {}).items()
    )
    _written_on_writer(
        world,
        full_tensors_on_rank0(world, named_states),
        lambda stream: write_safetensors_files(stream, directory, "optimizer", OPTIMIZER_FILE_BYTES),
    )


def load_optimizer_state(world: World, model: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Put back what `save_optimizer_state` wrote: rank 0 alone reads `directory` (memory-mapped,
    one tensor at a time) and each rank receives its shard of every state tensor (the whole
    tensor where parameters are not sharded). 0-dim states (AdamW's step) stay on the CPU.
    Every rank must call it."""
    files = sorted(directory.glob("*.safetensors")) if world.is_writer and directory.is_dir() else []
    readers = {key: reader for reader in (safe_open(str(file), "pt") for file in files) for key in reader.keys()}
    layouts = run_on_rank0(
        world,
        lambda: {key: (reader.get_slice(key).get_shape(), reader.get_slice(key).get_dtype()) for key, reader in readers.items()},
    )
    for name, parameter in _optimized_parameters(model, optimizer):
        state = {}
        for key, (shape, dtype) in layouts.items():
            parameter_name, state_name = key.rsplit(":", 1)
            if parameter_name != name:
                continue
            whole = readers[key].get_tensor(key) if world.is_writer else None
            like = parameter if shape else torch.empty(())
            state[state_name] = from_rank0_like(world, whole, like, shape=torch.Size(shape), dtype=SAFETENSORS_DTYPES[dtype])
        if state:
            optimizer.state[parameter] = state


SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
"""torch dtypes of safetensors' dtype names, for the floating-point optimizer states."""


class CheckpointError(ValueError):
    """A checkpoint that resuming cannot use; the message says why and what to do instead."""


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state saved in `checkpoint`, loaded without unpickling arbitrary objects.

    Raises:
        CheckpointError: the file holds anything but tensors and plain values, or is not of
            format `TRAINER_STATE_FORMAT`.
    """
    path = checkpoint / TRAINER_STATE
    refusal = (
        f"{path} cannot be resumed: pacs loads trainer states with torch.load(weights_only=True) and "
        f"format {TRAINER_STATE_FORMAT} only, because unpickling arbitrary objects could run code from the file"
    )
    advice = (
        f"Its weights still load: start a new run from its weights instead (model.path={checkpoint}, "
        "a new output_dir); the optimizer state and data position are not carried over."
    )
    try:
        state = torch.load(path, weights_only=True, map_location="cpu", mmap=True)
    except pickle.UnpicklingError as error:
        first_line = str(error).strip().splitlines()[0]
        raise CheckpointError(f"{refusal}. It holds other objects ({first_line}). {advice}") from None
    if not isinstance(state, dict) or state.get("format") != TRAINER_STATE_FORMAT:
        found = state.get("format", "none") if isinstance(state, dict) else type(state).__name__
        raise CheckpointError(f"{refusal}; its format is {found}. {advice}")
    return state


def rng_states(world: World) -> dict[str, Any]:
    """Every random-number state the loop draws from, as tensors and plain Python values: Python's
    and NumPy's (rank 0's; the loop draws from them identically on every rank) and torch's CPU and
    CUDA generators of every rank, stacked in rank order ((world_size, state bytes) each). Every
    rank must call it."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    states = {
        "python": random.getstate(),
        "numpy": [name, keys.tolist(), position, has_gauss, cached_gaussian],
        "torch": gather_rows(world, torch.get_rng_state().unsqueeze(0)),
    }
    if torch.cuda.is_available():
        states["cuda"] = gather_rows(world, torch.cuda.get_rng_state().unsqueeze(0))
    return states


def restore_rng_states(states: dict[str, Any], world: World) -> None:
    """Put back what `rng_states` saved, each rank taking its own torch states. A checkpoint of
    another process count cannot give every rank its stream back: each rank is then seeded from
    rank 0's saved state and its own rank (so ranks still sample differently), and a warning says
    that the run will not be bit-identical to an uninterrupted one."""
    random.setstate(states["python"])
    name, keys, position, has_gauss, cached_gaussian = states["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), position, has_gauss, cached_gaussian))
    saved_ranks = states["torch"].shape[0]
    if saved_ranks != world.world_size:
        warnings.warn(
            f"the checkpoint was written by {saved_ranks} processes and is resumed by {world.world_size}: "
            "training continues, but its random sampling differs from an uninterrupted run",
            stacklevel=2,
        )
        torch.manual_seed(rank_seed(int(states["torch"][0].long().sum()), world.rank))
        return
    # clone: a row of the stacked states is a view at an offset, which set_rng_state cannot read
    torch.set_rng_state(states["torch"][world.rank].clone())
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"][world.rank].clone())


def write_checkpoint(
    world: World,
    directory: Path,
    tokenizer: PreTrainedTokenizerBase,
    *,
    step: int,
    sampler: PromptSampler,
    policy: tuple[torch.nn.Module, torch.optim.Optimizer],
    critic: tuple[torch.nn.Module, torch.optim.Optimizer] | None = None,
    tracker_runs: dict[str, str] | None = None,
    reference: torch.nn.Module | None = None,
    rollouts_in_flight: list[dict[str, Any]] | None = None,
) -> Path:
    """The training checkpoint of every rank: the optimizers' states, then the models (with the
    random states, `save_checkpoint`), each gathered one tensor at a time into rank 0's files;
    all wait until it is in place. `tracker_runs`: tracker name -> run id (rank 0's), which
    resuming continues (`pacs.train.trackers`). `reference`: a reference model that moves during
    the run (`train.reference_reset_every`), written to `REFERENCE_DIR`. `rollouts_in_flight`: with
    asynchronous generation, every rank's batches sampled ahead (`pacs.train.async_generator`), in
    rank order, kept in the trainer state."""
    staging = staging_directory(directory) if world.is_writer else None
    model, optimizer = policy
    critic_model = None
    with removed_on_error(staging):
        if reference is not None:
            save_model(world, reference, staging and staging / REFERENCE_DIR)
        save_optimizer_state(world, model, optimizer, staging and staging / OPTIMIZER_DIR)
        if critic is not None:
            critic_model, critic_optimizer = critic
            save_optimizer_state(world, critic_model, critic_optimizer, staging and staging / CRITIC_OPTIMIZER_DIR)
        state = {"step": step, "sampler": sampler.state(), "rng": rng_states(world), "trackers": dict(tracker_runs or {})}
        if rollouts_in_flight is not None:
            state["rollouts_in_flight"] = rollouts_in_flight
    save_checkpoint(directory, model, tokenizer, state, world=world, critic=critic_model, staging=staging)
    barrier(world)
    return directory


def checkpoint_size_estimate(models: list[torch.nn.Module]) -> int:
    """About the bytes a checkpoint of `models` takes: each parameter as stored, and AdamW's two
    float32 moments of each trainable one (the tokenizer and trainer state, small, left out)."""
    return sum(
        parameter.numel() * (parameter.element_size() + (8 if parameter.requires_grad else 0))
        for model in models
        for parameter in model.parameters()
    )


def checkpoint_space_warning(config: Config, output_dir: Path, checkpoint_bytes: int, free: int) -> str | None:
    """A warning when the disk holding `output_dir`, with `free` bytes free, cannot hold the
    checkpoints `config` keeps at once, of about `checkpoint_bytes` each: the step checkpoints
    `train.keep_checkpoints` keeps (every one without it), `final` (links to the last step's
    when that one is saved) and the one being written; None when it can."""
    train = config.train
    saves = train.steps // train.save_every if train.save_every else 0
    kept = min(saves, train.keep_checkpoints or saves) + 1 + (0 if saves and train.steps % train.save_every == 0 else 1)
    needed = kept * checkpoint_bytes
    if needed <= free:
        return None
    return (
        f"the disk holding {output_dir} has {size_text(free)} free, and these settings keep up to {kept} checkpoints of "
        f"about {size_text(checkpoint_bytes)} at once ({size_text(needed)}): the run will stop when a save finds the "
        "disk full (the checkpoints before it kept). Free space, lower train.keep_checkpoints, raise train.save_every, "
        "or choose an output_dir on a larger disk"
    )


def restore_training_state(
    world: World,
    checkpoint: Path,
    policy: tuple[torch.nn.Module, torch.optim.Optimizer],
    critic: tuple[torch.nn.Module, torch.optim.Optimizer] | None = None,
) -> dict[str, Any]:
    """The optimizers' states and every rank's random states put back from `checkpoint`, which
    rank 0 alone reads; returns the trainer state (step, sampler, tracker run ids: "trackers",
    empty for a checkpoint written before pacs kept them) on every rank."""
    state = run_on_rank0(world, lambda: load_trainer_state(checkpoint))
    load_optimizer_state(world, *policy, checkpoint / OPTIMIZER_DIR)
    if critic is not None:
        load_optimizer_state(world, *critic, checkpoint / CRITIC_OPTIMIZER_DIR)
    restore_rng_states(state["rng"], world)
    return {"trackers": {}, **state}
