"""Virtualenvs for the frameworks pacs is compared with or plugs into (TRL, verl), which pacs never
depends on: `benchmarks/vs_trl.py` and the integration tests (tests/test_integration_*.py) run
their side in one of these.

`peer_python(venv, requirements)` returns the venv's python, making the venv on first use:
`python -m venv`, then `pip install --constraint constraints-cpu.txt -r REQUIREMENTS` (the
constraint keeps pip on the local CPU torch wheel), then the packages `no_deps` names with
`--no-deps`, then this repository with `--no-deps -e .`. A stamp file records what it was built
from (the requirements, the constraints, `no_deps`); a venv whose stamp matches is reused as is, any
other is built again. A lock file serialises concurrent builders. The venvs live in `.peer-venvs/`
(gitignored) at the repository's root unless a caller passes another folder.

`PEERS` names the venvs the integration tests use; `python benchmarks/peer_venvs.py [NAME ...]`
builds them (all by default) ahead of the tests, as `make test` does.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PEER_VENVS = REPO / ".peer-venvs"
CONSTRAINTS = REPO / "constraints-cpu.txt"
STAMP = ".pacs-peer-stamp"


PEERS = {
    "trl": ("requirements-trl.txt", ()),
    "verl": ("requirements-verl.txt", ("verl==0.9.1",)),
}
"""name -> (its requirements file in benchmarks/, the packages installed without their dependencies):
verl goes in with --no-deps, see requirements-verl.txt."""


class PeerVenvError(RuntimeError):
    """A peer venv could not be built; the message holds the failing command and its output's end."""


def _stamp(requirements: Path, no_deps: Sequence[str]) -> str:
    recipe = {
        "requirements": requirements.read_text(),
        "constraints": CONSTRAINTS.read_text(),
        "no_deps": list(no_deps),
        "python": sys.version.split()[0],
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def _run(command: list[str], log_path: Path, what: str) -> None:
    """Run `command` with its output in `log_path`; PeerVenvError with the log's tail if it fails."""
    start = time.perf_counter()
    print(f"{what} ...", file=sys.stderr, flush=True)
    with log_path.open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO).returncode
    if code != 0:
        tail = "\n".join(log_path.read_text().splitlines()[-30:])
        raise PeerVenvError(f"{what} failed (exit {code}): {' '.join(command)}\nthe end of its output ({log_path}):\n{tail}")
    print(f"{what}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


def peer_python(venv: Path, requirements: Path, *, no_deps: Sequence[str] = ()) -> Path:
    """The python of `venv`, built from `requirements` (and `no_deps`, installed without their
    dependencies) if it is missing or was built from anything else; see the module docstring.

    Raises:
        PeerVenvError: a build step failed (no network, a package with no wheel for this machine).
    """
    python = venv / "bin" / "python"
    stamp = _stamp(requirements, no_deps)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp_path = venv / STAMP
        if python.exists() and stamp_path.exists() and stamp_path.read_text() == stamp:
            return python
        print(f"building the venv {venv} from {requirements.name} (first use: minutes)", file=sys.stderr, flush=True)
        stamp_path.unlink(missing_ok=True)
        venv.mkdir(parents=True, exist_ok=True)
        log_dir = venv / "build-logs"
        if not python.exists():
            _run([sys.executable, "-m", "venv", str(venv)], venv.parent / f".{venv.name}-venv.log", "python -m venv")
        log_dir.mkdir(exist_ok=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--constraint", str(CONSTRAINTS)]
        _run([*pip, "-r", str(requirements)], log_dir / "requirements.log", f"pip install -r {requirements.name}")
        if no_deps:
            _run([*pip, "--no-deps", *no_deps], log_dir / "no-deps.log", f"pip install --no-deps {' '.join(no_deps)}")
        _run([*pip, "--no-deps", "-e", str(REPO)], log_dir / "pacs.log", "pip install --no-deps -e . (pacs)")
        stamp_path.write_text(stamp)
    return python


def peer(name: str) -> Path:
    """The python of the peer venv `name` of `PEERS`, in `PEER_VENVS`, built on first use."""
    requirements, no_deps = PEERS[name]
    return peer_python(PEER_VENVS / name, REPO / "benchmarks" / requirements, no_deps=no_deps)


if __name__ == "__main__":
    for name in sys.argv[1:] or PEERS:
        if name not in PEERS:
            sys.exit(f"unknown peer venv {name!r}; valid: {', '.join(PEERS)}")
        try:
            print(peer(name))
        except PeerVenvError as error:
            sys.exit(str(error))
