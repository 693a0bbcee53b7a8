"""A 2-process `pacs train` (torchrun, gloo) under faults it did not cause: its folder moved away
mid-run, its disk full at a checkpoint. Both ranks stop, within a timeout far below the job's
collective timeout (a rank left waiting in a collective would hang until then), and the job says
why in one line, as one process does (tests/train/test_train_folder_faults.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from killing import kill_job
from small_disk import mounted_tmpfs
from torchrun_jobs import process_env

pytestmark = pytest.mark.slow

COLLECTIVE_TIMEOUT_S = 900
"""`train.distributed_timeout_s`: a rank that waited in a collective for the other would stop
only after this; the job must end long before."""
ENDS_WITHIN_S = 240
SETTINGS = [
    "data.train=builtin:arithmetic?size=64",
    "data.val=null",
    "train.batch_size=4",
    "train.mini_batch_size=2",
    "rollout.n=2",
    "data.max_response_length=8",
    "reward.num_workers=0",
    f"train.distributed_timeout_s={COLLECTIVE_TIMEOUT_S}",
]


def start_job(output_dir: Path, model_dir: Path, log: Path, *overrides: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "pacs.cli"]
    command += ["train", f"model.path={model_dir}", f"output_dir={output_dir}", *SETTINGS, *overrides]
    with open(log, "w") as handle:
        return subprocess.Popen(command, env=process_env(), stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)


def ended(job: subprocess.Popen, started: float) -> int:
    """The job's exit status, once it ends within `ENDS_WITHIN_S` of `started` (else the test fails)."""
    try:
        return job.wait(timeout=max(ENDS_WITHIN_S - (time.monotonic() - started), 1))
    except subprocess.TimeoutExpired:
        kill_job(job)
        pytest.fail(f"the job did not end within {ENDS_WITHIN_S} s: a rank was left waiting")


def test_a_two_process_run_whose_folder_is_moved_stops_both_ranks_saying_where_it_went(tmp_path, tiny_model_dir):
    run, elsewhere, log = tmp_path / "run", tmp_path / "run.moved", tmp_path / "job.log"
    started = time.monotonic()
    job = start_job(run, tiny_model_dir, log, "train.steps=200")
    try:
        while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text().strip():
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() - started < ENDS_WITHIN_S, "no step finished in time"
            time.sleep(0.2)
        run.rename(elsewhere)
    except BaseException:
        kill_job(job)
        raise
    assert ended(job, started) != 0
    message = f"pacs train: error: {run}, which this run writes, was moved away or replaced while it ran (it is now {elsewhere})"
    assert log.read_text().count(message) == 2  # each rank stops by itself, none left in a collective
    assert not run.exists()


def test_a_two_process_run_that_fills_its_disk_stops_both_ranks_with_one_line(tmp_path, tiny_model_dir):
    with mounted_tmpfs(tmp_path / "disk") as disk:
        run, log = disk / "run", tmp_path / "job.log"
        started = time.monotonic()
        job = start_job(run, tiny_model_dir, log, "train.steps=20", "train.save_every=1")
        assert ended(job, started) == 1
        output = log.read_text()
        assert f"pacs train: error: the disk holding {run / 'checkpoints'} is full: writing checkpoint step_" in output
        assert "nothing of it was kept" in output
