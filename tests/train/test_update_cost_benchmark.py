"""benchmarks/update_cost.py runs against the update loop as it is (its forced-pass variant is a
PACS that the trainer drives like any algorithm); no timings are asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "update_cost.py"


def test_the_update_cost_benchmark_prints_its_table_on_the_smallest_shape():
    finished = subprocess.run(
        [sys.executable, str(BENCHMARK), "--prompts", "2", "--n", "2", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert "with no-grad pass s" in finished.stdout and "saved" in finished.stdout
