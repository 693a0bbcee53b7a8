"""The `pacs` command chooses torch's threads before torch starts: a passive OpenMP wait and one
thread per core idle at the start, unless the user chose (benchmarks/threads.py measures why)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pacs.threads import threads_for, usable_cores

CHOOSE = "import json, sys; from pacs.threads import choose_threads; env = json.loads(sys.argv[1]); print(json.dumps([choose_threads(env), env, 'torch' in sys.modules]))"


def chosen(environment: dict[str, str]) -> tuple[int | None, dict[str, str]]:
    """`choose_threads(environment)` in a fresh interpreter, where torch is not imported yet."""
    output = subprocess.run(
        [sys.executable, "-c", CHOOSE, json.dumps(environment)], capture_output=True, text=True, check=True
    ).stdout
    threads, result, torch_imported = json.loads(output)
    assert not torch_imported
    return threads, result


@pytest.mark.parametrize(
    ("idle", "cores", "threads"), [(1.96, 2, 2), (1.2, 2, 1), (0.9, 2, 1), (0.0, 2, 1), (None, 4, 4), (60.3, 64, 60), (9.0, 8, 8)]
)
def test_one_thread_per_idle_core_at_least_one(idle, cores, threads):
    assert threads_for(idle, cores) == threads


def test_threads_wait_passively_and_number_at_most_the_usable_cores():
    threads, environment = chosen({})
    assert environment == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": str(threads)}
    assert 1 <= threads <= usable_cores()


@pytest.mark.parametrize("setting", [{"OMP_NUM_THREADS": "3"}, {"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "1000"}])
def test_what_the_user_set_is_kept(setting):
    threads, environment = chosen(dict(setting))
    assert environment.items() >= setting.items()
    assert "OMP_WAIT_POLICY" not in environment or environment["OMP_WAIT_POLICY"] == setting.get("OMP_WAIT_POLICY", "PASSIVE")
    assert (threads is None) == ("OMP_NUM_THREADS" in setting)


def test_once_torch_is_imported_it_is_too_late_and_nothing_is_set():
    from pacs.threads import choose_threads

    environment: dict[str, str] = {}
    assert "torch" in sys.modules and choose_threads(environment) is None and environment == {}


def pacs_beside_busy_cores(tmp_path, *arguments: str) -> list[str]:
    """The stderr lines of `pacs ARGUMENTS` while every core is kept busy, up to the first that
    says how many threads it computes with (all of them when none does)."""
    environment = {
        key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    }
    script = "import sys; from pacs.cli import main; main(sys.argv[1:])"
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(usable_cores())]
    command = subprocess.Popen(
        [sys.executable, "-c", script, *arguments], env=environment, stderr=subprocess.PIPE, text=True, cwd=tmp_path
    )
    lines = []
    try:
        while line := command.stderr.readline():
            lines.append(line.rstrip("\n"))
            if "computing with" in line:
                break
    finally:
        for process in [*busy, command]:
            process.kill()
            process.wait()
    return lines


@pytest.mark.slow
@pytest.mark.skipif(usable_cores() < 2, reason="one core: one thread is all there is")
def test_the_pacs_command_computes_with_one_thread_when_every_core_is_busy_and_says_so(tmp_path):
    lines = pacs_beside_busy_cores(
        tmp_path, "eval", "--model", "builtin:tiny", "--data", "builtin:arithmetic?size=2", "--n", "1", "--out", "out"
    )
    cores = usable_cores()
    assert lines[-1] == (
        f"pacs eval: computing with 1 thread: {cores - 1} of {cores} cores {'was' if cores == 2 else 'were'} busy at the start "
        "(OMP_NUM_THREADS=N chooses)"
    )


@pytest.mark.slow
@pytest.mark.skipif(usable_cores() < 2, reason="one core: one thread is all there is")
def test_a_command_refused_for_its_inputs_says_only_why(tmp_path):
    lines = pacs_beside_busy_cores(tmp_path, "train", "--config", "builtin:demo", "train.stpes=3")
    assert lines[0].startswith("pacs train: error:") and "did you mean 'steps'?" in lines[1]
    assert not any("computing with" in line for line in lines)
