"""Runs that repeat bit for bit: what the `pacs` command sets by default, and what
`train.deterministic` asks of torch, cuBLAS, cuDNN and vLLM (each check in a process of its own,
since torch's deterministic mode is global to a process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from torchrun_jobs import process_env, read_jsonl

from pacs.train.determinism import CUBLAS_WORKSPACE, MKL_REPRODUCIBLE, reproducible_math_environment

ASKED = """
import json, os, torch
from pacs.train.determinism import use_deterministic_kernels
use_deterministic_kernels()
print(json.dumps({"algorithms": torch.are_deterministic_algorithms_enabled(),
                  "cudnn": [torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark],
                  "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG")}))
"""


def test_the_pacs_command_puts_mkl_in_its_reproducible_mode_unless_the_user_chose():
    environment: dict[str, str] = {}
    reproducible_math_environment(environment)
    assert environment == {"MKL_CBWR": MKL_REPRODUCIBLE}
    chosen = {"MKL_CBWR": "OFF"}
    reproducible_math_environment(chosen)
    assert chosen == {"MKL_CBWR": "OFF"}


@pytest.mark.slow
@pytest.mark.parametrize("users_workspace", [None, ":16:8"])
def test_deterministic_kernels_are_asked_for_keeping_the_users_cublas_workspace(users_workspace):
    env = {key: value for key, value in process_env().items() if key != "CUBLAS_WORKSPACE_CONFIG"}
    if users_workspace:
        env["CUBLAS_WORKSPACE_CONFIG"] = users_workspace
    done = subprocess.run([sys.executable, "-c", ASKED], env=env, capture_output=True, text=True, check=True)
    asked = json.loads(done.stdout.splitlines()[-1])
    assert asked == {"algorithms": True, "cudnn": [True, False], "cublas": users_workspace or CUBLAS_WORKSPACE}


@pytest.mark.slow
def test_a_run_with_train_deterministic_trains_on_a_cpu(tmp_path, tiny_model_dir):
    """No operation of a training step (rollout, update, checkpoint) lacks a deterministic
    implementation on a CPU: torch would raise for one under `train.deterministic`."""
    command = [
        sys.executable,
        "-m",
        "pacs.cli",
        "train",
        "--config",
        "builtin:demo",
        f"model.path={tiny_model_dir}",
        f"output_dir={tmp_path / 'run'}",
        "data.val=null",
        "train.steps=2",
        "train.save_every=1",
        "train.batch_size=4",
        "train.mini_batch_size=2",
        "rollout.n=4",
        "reward.num_workers=0",
        "train.deterministic=true",
    ]
    done = subprocess.run(command, env=process_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    assert [row["step"] for row in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
