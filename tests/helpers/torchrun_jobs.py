"""2-process jobs for the distributed tests (tests/test_distributed*.py): torchrun with one thread
per process, and what a run wrote (its JSONL files, its final checkpoint's tensors)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

TESTS = Path(__file__).resolve().parent
WORKER = TESTS / "distributed_update.py"
"""Runs one update per case on 2 processes (the exactness tests)."""
AUDIT = TESTS / "collective_audit.py"
"""Runs `pacs train` and fails on any collective pacs calls outside `pacs.distributed`."""
EXACT = 1e-9
"""Largest weight difference accepted between 2 processes and 1 (float64)."""


def torchrun_command(*args: str, options: tuple[str, ...] = ()) -> list[str]:
    """The command line `torchrun --standalone --nproc_per_node 2 OPTIONS ARGS` (torchrun's own
    `options`, e.g. ``("--max-restarts", "1")``, before the script and its arguments `args`)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *options, *args]


def torchrun(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`torchrun_command(*args)` with one thread per process (and `env` on top of this process's
    environment), waited for; raises with the output when it fails."""
    command = torchrun_command(*args)
    result = subprocess.run(command, env={**process_env(), **(env or {})}, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}")
    return result


def process_env() -> dict[str, str]:
    """One thread per process; the tests' helpers importable, before any path already set."""
    paths = [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(paths)}


def max_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first.keys() == second.keys()
    return max(float((first[key] - second[key]).abs().max()) for key in first)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def tensorboard_steps(output_dir: Path, tag: str = "loss") -> list[int]:
    """The steps TensorBoard shows for `tag` in a run's event files, after the purges that a
    resumed writer asked for (TensorBoard's own reader)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(output_dir / "tensorboard"))
    events.Reload()
    return [event.step for event in events.Scalars(tag)]


def final_tensors(output_dir: Path) -> dict[str, torch.Tensor]:
    """Every file of tensors of the final checkpoint: policy, critic and adapter, by file."""
    final = output_dir / "checkpoints" / "final"
    return {
        f"{path.relative_to(final)}:{key}": value
        for path in sorted(final.rglob("*.safetensors"))
        for key, value in load_file(str(path)).items()
    }
