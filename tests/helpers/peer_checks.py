"""Running a checks script in a peer venv (TRL, verl; see benchmarks/peer_venvs.py) for the
integration tests: one subprocess that writes a JSON of results, which the tests assert on (a check
that raised holds {"error": its traceback})."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from peer_venvs import PEER_VENVS, PeerVenvError, peer

REPOSITORY = Path(__file__).resolve().parents[2]


def run_in_peer_venv(name: str, checks: str, arguments: list[str], out: Path) -> dict:
    """Run tests/helpers/`checks` with `arguments` and `out` in the peer venv `name` (`peer_venvs.PEERS`),
    built on first use (`make test` builds it before the suite): the JSON it wrote. A venv that
    cannot be built (no package index) fails the test, saying so."""
    try:
        python = peer(name)
    except PeerVenvError as error:
        pytest.fail(f"the {name} venv {PEER_VENVS / name} could not be built (it needs the package index):\n{error}")
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY / "src"), "OMP_NUM_THREADS": "1"}
    script = Path(__file__).resolve().parent / checks
    done = subprocess.run([str(python), str(script), *arguments, str(out)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, f"{checks} failed in {python}:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(out.read_text())


def check_result(checks: dict, name: str) -> dict:
    """The results of the check `name`, or the traceback of its failure as the calling test's failure."""
    assert "error" not in checks[name], checks[name]["error"]
    return checks[name]
