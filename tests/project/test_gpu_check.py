"""tools/gpu_check.sh, checked without a GPU through its --dry-run: the commands a lent machine
would run, and that every benchmark flag it passes is one the benchmark has."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_packaging import copy_of_the_sources

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "gpu_check.sh"
STAGES = ("suite", "bench", "trl")


def dry_run(*arguments: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", *arguments], capture_output=True, text=True, env={**os.environ, "OUT": str(out)}
    )


def commands(*stages: str, out: Path) -> list[tuple[int, list[str]]]:
    """(limit in seconds, argv) of every stage command the dry run prints, in order."""
    done = dry_run(*stages, out=out)
    assert done.returncode == 0, done.stderr
    printed = [shlex.split(line[2:]) for line in done.stdout.splitlines() if line.startswith("+ timeout ")]
    return [(int(argv[1]), argv[2 : argv.index(">")]) for argv in printed]


def test_the_dry_run_installs_the_carried_wheels_first_and_runs_nothing(tmp_path: Path):
    done = dry_run(*STAGES, out=tmp_path)
    first = done.stdout.splitlines()[0]
    assert first.startswith("+ python3 -m pip install") and "--no-index --no-deps" in first
    assert first.endswith("--target /tmp/site .gpu-wheels/*.whl .")
    assert list(tmp_path.iterdir()) == []


def test_each_stage_runs_its_checks_on_the_gpu(tmp_path: Path):
    ran = {stage: [" ".join(argv[1:]) for _, argv in commands(stage, out=tmp_path)] for stage in STAGES}
    assert ran["suite"] == ["-m pytest tests/gpu -m gpu -p no:xdist -ra"]
    assert [command.split()[0] for command in ran["bench"]] == [
        "benchmarks/async_rollouts.py",
        "benchmarks/continuous_batching.py",
    ]
    assert "--device cuda" in ran["bench"][1]
    assert ran["trl"][0].startswith("benchmarks/vs_trl.py --device cuda") and "--trl-python python3" in ran["trl"][0]


@pytest.mark.parametrize("stage", STAGES)
def test_a_stages_limits_add_up_to_less_than_nine_minutes(stage: str, tmp_path: Path):
    assert sum(limit for limit, _ in commands(stage, out=tmp_path)) <= 9 * 60


def test_an_unknown_stage_is_refused_naming_the_stages(tmp_path: Path):
    done = dry_run("benchmarks", out=tmp_path)
    assert done.returncode == 2
    assert "unknown argument 'benchmarks'" in done.stderr and "suite bench trl" in done.stderr


@pytest.mark.slow
def test_pacs_installed_as_the_check_installs_it_finds_its_built_in_configs(tmp_path: Path):
    """The machine runs pacs from what the script's pip line installs into its site folder, not from
    src/: the built-in configs (the package pacs.configs) exist only in an install."""
    checkout = copy_of_the_sources(tmp_path / "checkout")
    first = dry_run("suite", out=tmp_path).stdout.splitlines()[0]
    argv = [argument for argument in shlex.split(first[2:]) if argument != ".gpu-wheels/*.whl"]
    site = tmp_path / "site"
    argv = [sys.executable if argument == "python3" else str(site) if argument == "/tmp/site" else argument for argument in argv]
    subprocess.run(argv, cwd=checkout, check=True, capture_output=True)
    shown = subprocess.run(
        [sys.executable, "-c", "import pacs; from pacs.config import load_config; print(pacs.__file__, load_config('builtin:demo').algorithm.name)"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    module, algorithm = shown.stdout.split()
    assert Path(module).is_relative_to(site) and algorithm == "pacs"


@pytest.mark.slow
def test_every_flag_given_to_a_benchmark_is_in_its_help(tmp_path: Path):
    scripts = [argv[1:] for _, argv in commands(*STAGES, out=tmp_path) if argv[1].startswith("benchmarks/")]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    for script, *arguments in scripts:
        shown = subprocess.run(
            [sys.executable, script, "--help"], cwd=REPO, capture_output=True, text=True, env=environment, check=True
        ).stdout
        given = [argument for argument in arguments if argument.startswith("--")]
        assert given, script
        for flag in given:
            assert re.search(rf"(^|[\s,\[]){re.escape(flag)}\b", shown), f"{script} has no {flag}"
