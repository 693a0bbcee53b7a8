"""Checkpoints in Hugging Face format, written atomically, plus what resuming needs.

    checkpoints/step_N/   config.json, model.safetensors, tokenizer files  (any HF tool reads it)
                          trainer_state.pt: step, optimizer, RNG states, data position (tensors
                          and plain Python values only: read with torch.load(weights_only=True))
                          critic/: PPO's critic (value head), when there is one
                          adapter/: with LoRA, the adapter (adapter_config.json,
                          adapter_model.safetensors); the model files beside it are then the
                          merged model (base + adapter), and resuming loads the base from
                          `model.path` and the adapter from here
    checkpoints/final/    the same after the last step

A checkpoint is assembled in a hidden temporary directory and renamed into place, so a crash
mid-write leaves no `step_N` directory for `resume=auto` to pick up.

Resuming never unpickles arbitrary objects: a crafted `trainer_state.pt` could otherwise run code
on `resume=auto`. The state is loaded with `weights_only=True`, which admits tensors and plain
containers of numbers and strings; a state file of another format (an older pacs wrote NumPy
arrays into it) is refused with `CheckpointError`.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pacs.models.lora import is_lora, save_lora
from pacs.outputs import MARKER, is_pacs_output
from pacs.train.distributed import World
from pacs.train.sampler import PromptSampler

TRAINER_STATE = "trainer_state.pt"
TRAINER_STATE_FORMAT = 2
"""Written into every trainer state as "format"; bumped when its layout changes."""
CRITIC_DIR = "critic"
_STEP_DIR = re.compile(r"step_(\d+)")


def save_checkpoint(
    directory: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    trainer_state: dict[str, Any],
    *,
    model_state: dict[str, torch.Tensor] | None = None,
    critic: PreTrainedModel | None = None,
    critic_state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write model, tokenizer, `trainer_state` (and PPO's critic, in `critic/`) to `directory`,
    replacing it atomically. `model_state` / `critic_state`: the full state dicts to write when
    the modules themselves hold only a shard (FSDP); None: the modules' own. A LoRA `model` is
    written as its merged model plus `adapter/` (`pacs.models.lora.save_lora`). An existing
    `directory` is replaced only if it is a checkpoint or empty (a `pacs.outputs.MARKER` in it
    is kept); anything else raises FileExistsError before a file is written."""
    if directory.is_dir():
        _check_replaceable(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".tmp-{directory.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    if is_lora(model):
        save_lora(model, staging, model_state)
    else:
        model.save_pretrained(staging, state_dict=model_state, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    if critic is not None:
        critic.save_pretrained(staging / CRITIC_DIR, state_dict=critic_state, safe_serialization=True)
    torch.save({**trainer_state, "format": TRAINER_STATE_FORMAT}, staging / TRAINER_STATE)
    if directory.exists():
        if is_pacs_output(directory):
            shutil.copy2(directory / MARKER, staging / MARKER)
        retired = directory.parent / f".old-{directory.name}-{os.getpid()}"
        os.replace(directory, retired)
        os.replace(staging, directory)
        shutil.rmtree(retired)
    else:
        os.replace(staging, directory)
    return directory


def _check_replaceable(directory: Path) -> None:
    """Refuse to replace `directory` unless it is a checkpoint (it holds `TRAINER_STATE`) or holds
    nothing but pacs's output marker: a checkpoint swaps only its own directory."""
    others = sorted(entry.name for entry in directory.iterdir() if entry.name != MARKER)
    if others and not (directory / TRAINER_STATE).is_file():
        raise FileExistsError(
            f"{directory} holds files that are not a pacs checkpoint ({', '.join(others[:5])}); a checkpoint "
            "replaces only a previous checkpoint or an empty folder. Choose another output folder"
        )


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    """The complete `step_N` directory with the largest N, or None."""
    if not checkpoints_dir.is_dir():
        return None
    steps = [
        (int(match.group(1)), path)
        for path in checkpoints_dir.iterdir()
        if (match := _STEP_DIR.fullmatch(path.name)) and (path / TRAINER_STATE).is_file()
    ]
    return max(steps)[1] if steps else None


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
        f"If an older pacs wrote it, start a new run from its weights instead (model.path={checkpoint}, "
        "a new output_dir); the optimizer state and data position are not carried over."
    )
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
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
        "torch": world.gather_rows(torch.get_rng_state().unsqueeze(0)),
    }
    if torch.cuda.is_available():
        states["cuda"] = world.gather_rows(torch.cuda.get_rng_state().unsqueeze(0))
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
        torch.manual_seed(int(states["torch"][0].long().sum()) * 1_000_003 + world.rank)
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
) -> Path:
    """The training checkpoint of every rank: each gathers its shards and random states, rank 0
    writes `directory` (`save_checkpoint`), and all wait until it is in place."""
    model, optimizer = policy
    state = {
        "step": step,
        "optimizer": world.full_optimizer_state(model, optimizer),
        "sampler": sampler.state(),
        "rng": rng_states(world),
    }
    critic_model = critic_state = None
    if critic is not None:
        critic_model, critic_optimizer = critic
        state["critic_optimizer"] = world.full_optimizer_state(critic_model, critic_optimizer)
        critic_state = world.full_model_state(critic_model)
    model_state = world.full_model_state(model)
    if world.is_writer:
        save_checkpoint(
            directory,
            world.unwrap(model),
            tokenizer,
            state,
            model_state=model_state,
            critic=world.unwrap(critic_model) if critic_model is not None else None,
            critic_state=critic_state,
        )
    world.barrier()
    return directory
