"""Checkpoints in Hugging Face format, written atomically, plus what resuming needs.

    checkpoints/step_N/   config.json, model.safetensors, tokenizer files  (any HF tool reads it)
                          trainer_state.pt: step, optimizer, RNG states, data position
                          critic/: PPO's critic (value head), when there is one
    checkpoints/final/    the same after the last step

A checkpoint is assembled in a hidden temporary directory and renamed into place, so a crash
mid-write leaves no `step_N` directory for `resume=auto` to pick up.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

TRAINER_STATE = "trainer_state.pt"
CRITIC_DIR = "critic"
_STEP_DIR = re.compile(r"step_(\d+)")


def save_checkpoint(
    directory: Path,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    trainer_state: dict[str, Any],
    *,
    critic: PreTrainedModel | None = None,
) -> Path:
    """Write model, tokenizer, `trainer_state` (and PPO's critic, in `critic/`) to `directory`,
    replacing it atomically."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".tmp-{directory.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    if critic is not None:
        critic.save_pretrained(staging / CRITIC_DIR, safe_serialization=True)
    torch.save(trainer_state, staging / TRAINER_STATE)
    if directory.exists():
        retired = directory.parent / f".old-{directory.name}-{os.getpid()}"
        os.replace(directory, retired)
        os.replace(staging, directory)
        shutil.rmtree(retired)
    else:
        os.replace(staging, directory)
    return directory


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


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(checkpoint / TRAINER_STATE, weights_only=False)


def rng_states() -> dict[str, Any]:
    """Every random-number state the loop draws from (Python, NumPy, torch CPU and CUDA)."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])
