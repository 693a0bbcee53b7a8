"""Specification of a resume after a kill at any point of a checkpoint's save: whichever file the
save was writing (the policy, PPO's critic, either optimizer, the trainer state, the manifest) or
whether it had just been put in place, `resume=auto` reaches the uninterrupted run's final weights
bit for bit, for PACS and for PPO (`tests/helpers/save_kills.py` kills and resumes the runs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SAVE_KILLS = Path(__file__).parent.parent / "helpers" / "save_kills.py"


@pytest.mark.parametrize("algorithm", ["pacs", "ppo"])
def test_a_kill_at_each_file_of_a_save_resumes_to_the_uninterrupted_weights_exactly(tmp_path, algorithm):
    environment = {**os.environ, "PYTHONPATH": str(SAVE_KILLS.parent), "OMP_NUM_THREADS": "1"}
    environment.pop("MKL_CBWR", None)  # the helper sets it as the pacs command does
    done = subprocess.run(
        [sys.executable, str(SAVE_KILLS), algorithm, str(tmp_path)], capture_output=True, text=True, env=environment, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    kills = [json.loads(line) for line in done.stdout.splitlines()]
    files = {kill["file"] for kill in kills}
    written = {
        *json.loads((tmp_path / "uninterrupted" / "checkpoints" / "step_2" / "manifest.json").read_text())["files"],
        "manifest.json",
    }
    assert written <= files  # every file of the checkpoint was a kill point
    if algorithm == "ppo":
        assert {
            "critic/model.safetensors",
            "critic_optimizer/optimizer-00001.safetensors",
            "optimizer/optimizer-00001.safetensors",
        } <= files
    assert all(kill["killed"] for kill in kills), [kill for kill in kills if not kill["killed"]]
    assert [kill["difference"] for kill in kills] == [0.0] * len(kills), kills
    after = [kill["left"] for kill in kills if kill["file"].startswith("(the next")]
    assert after == [["step_1", "step_2"]]  # killed after the rename: step 2 is in place and resumed
