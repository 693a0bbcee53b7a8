"""Killing a training run partway: `kill -9` of its whole process group once a checkpoint exists."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def kill_once_checkpointed(job: subprocess.Popen, output_dir: Path, checkpoint: str = "step_2", timeout_s: float = 300) -> None:
    """Wait until `output_dir/checkpoints/<checkpoint>` exists, then SIGKILL `job`'s process group
    (started with `start_new_session=True`), and check that the run did not reach `final`."""
    checkpoints = output_dir / "checkpoints"
    deadline = time.monotonic() + timeout_s
    while not (checkpoints / checkpoint).is_dir() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    assert (checkpoints / checkpoint).is_dir() and not (checkpoints / "final").exists()
