"""Killing a training run partway: `kill -9` of its whole process group once a checkpoint exists."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def kill_once_checkpointed(
    job: subprocess.Popen, output_dir: Path, checkpoint: str = "step_2", timeout_s: float = 300, *, whole_tree: bool = True
) -> None:
    """Wait until `output_dir/checkpoints/<checkpoint>` exists, then SIGKILL `job`'s process group
    (started with `start_new_session=True`) and, with `whole_tree`, every process descended from it
    (`kill_job`), and check that the run did not reach `final`."""
    checkpoints = output_dir / "checkpoints"
    deadline = time.monotonic() + timeout_s
    while not (checkpoints / checkpoint).is_dir() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if whole_tree:
        kill_job(job)
    else:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert (checkpoints / checkpoint).is_dir() and not (checkpoints / "final").exists()


def kill_a_worker_once_checkpointed(
    job: subprocess.Popen, output_dir: Path, checkpoint: str = "step_2", timeout_s: float = 300
) -> int:
    """Wait until `output_dir/checkpoints/<checkpoint>` exists, then SIGKILL one worker of the
    torchrun `job` (its agent's last child) and return its pid; the run must not have reached
    `final`."""
    checkpoints = output_dir / "checkpoints"
    deadline = time.monotonic() + timeout_s
    while not (checkpoints / checkpoint).is_dir() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = children(job.pid)
    assert workers and (checkpoints / checkpoint).is_dir() and not (checkpoints / "final").exists()
    os.kill(workers[-1], signal.SIGKILL)
    return workers[-1]


def kill_job(job: subprocess.Popen) -> None:
    """SIGKILL `job`'s process group and every process descended from it, and wait until all are
    gone. torchrun starts each worker in a session of its own, so killing the launcher's group
    alone would leave the workers training (and writing) beside the run that resumes."""
    victims = [job.pid, *descendants(job.pid)]
    for pid in victims:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    job.wait()
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in victims) and time.monotonic() < deadline:
        time.sleep(0.05)


def descendants(pid: int) -> list[int]:
    """Every process descended from `pid` (Linux /proc), children before their own children."""
    found, frontier = [], [pid]
    while frontier:
        direct = children(frontier.pop())
        found.extend(direct)
        frontier.extend(direct)
    return found


def children(pid: int) -> list[int]:
    """The processes `pid` started (Linux /proc), in the order they started."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(child) for child in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return sorted(found)


def alive(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def finished(job: subprocess.Popen, timeout: float = 300) -> None:
    """Wait for `job` (started with `start_new_session=True`, stderr piped) and check it succeeded,
    showing the end of its stderr otherwise; a job still running after `timeout` s is killed with
    everything it started, so a hung run cannot outlive the test."""
    try:
        _, stderr = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(job)
        raise
    assert job.returncode == 0, stderr[-3000:]
