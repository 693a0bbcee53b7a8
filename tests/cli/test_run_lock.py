"""Specification of the run lock (`pacs.outputs.lock_run`) as every command that moves or
replaces a folder honours it: a folder whose writer lives is refused, naming its pid, and left
byte for byte as it was; a writer whose folder was moved all the same stops, saying so."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from running import run
from test_output_rule import plot_run, previous_output, tree_hash

from pacs.outputs import RUN_LOCK, RunLocked, RunMoved, check_run_in_place, lock_run, move_aside, run_lock_holder

HOLD_THE_LOCK = (
    "import sys; from pathlib import Path; from pacs.outputs import lock_run; "
    "lock = lock_run(Path(sys.argv[1])); print('locked', flush=True); sys.stdin.read()"
)


@pytest.fixture
def live_writer() -> Iterator:
    """Start a process that holds a folder's run lock until the test ends; yields a function
    folder -> that process's pid."""
    writers = []

    def start(folder: Path) -> int:
        writer = subprocess.Popen(
            [sys.executable, "-c", HOLD_THE_LOCK, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        writers.append(writer)
        assert writer.stdout.readline() == "locked\n"
        return writer.pid

    yield start
    for writer in writers:
        writer.stdin.close()
        writer.wait(timeout=60)


def test_train_overwrite_refuses_a_run_whose_writer_lives_naming_its_pid(tmp_path, capsys, live_writer):
    target = previous_output(tmp_path / "run", "pacs train")
    pid = live_writer(target)
    before = tree_hash(tmp_path)
    assert run(["train", "--config", "builtin:demo", f"output_dir={target}", "--overwrite"]) == 2
    error = capsys.readouterr().err
    assert f"pid {pid} " in error and "is being written by a running pacs command" in error
    assert tree_hash(tmp_path) == before


def test_train_without_overwrite_names_the_live_writer_not_overwrite(tmp_path, capsys, live_writer):
    target = previous_output(tmp_path / "run", "pacs train")
    pid = live_writer(target)
    assert run(["train", "--config", "builtin:demo", f"output_dir={target}"]) == 2
    error = capsys.readouterr().err
    assert f"pid {pid} " in error and "--overwrite" not in error


def test_plot_overwrite_refuses_a_folder_whose_writer_lives(tmp_path, capsys, live_writer):
    source = plot_run(tmp_path / "run")
    out = previous_output(tmp_path / "plots", "pacs plot")
    pid = live_writer(out)
    before = tree_hash(tmp_path)
    assert run(["plot", str(source), "--out", str(out), "--overwrite"]) == 2
    assert f"pid {pid} " in capsys.readouterr().err
    assert tree_hash(tmp_path) == before


def test_moving_a_run_aside_as_compare_does_refuses_a_live_one(tmp_path, live_writer):
    target = previous_output(tmp_path / "method" / "seed_0", "pacs train")
    pid = live_writer(target)
    with pytest.raises(RunLocked, match=f"pid {pid} "):
        move_aside(target)
    assert target.is_dir() and not (tmp_path / "method" / "seed_0.superseded").exists()


def test_a_folder_whose_writer_ended_is_moved_aside(tmp_path):
    target = previous_output(tmp_path / "run", "pacs train")
    lock = lock_run(target)
    lock.close()
    assert run_lock_holder(target) is None
    assert move_aside(target) == tmp_path / "run.superseded"
    assert (tmp_path / "run.superseded" / RUN_LOCK).is_file()


def test_this_process_own_lock_survives_being_looked_at(tmp_path):
    lock = lock_run(tmp_path)
    with pytest.raises(RunLocked, match="this process"):
        move_aside(tmp_path)
    other = subprocess.run(
        [sys.executable, "-c", "import sys; from pathlib import Path; from pacs.outputs import run_lock_holder; "
         "print(run_lock_holder(Path(sys.argv[1])))", str(tmp_path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert other.stdout.startswith("pid ")
    lock.close()


def test_a_writer_whose_folder_was_moved_is_told_where_it_went(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    lock = lock_run(folder)
    check_run_in_place(folder, lock)
    folder.rename(tmp_path / "elsewhere")
    with pytest.raises(RunMoved, match=f"it is now {tmp_path / 'elsewhere'}"):
        check_run_in_place(folder, lock)
    folder.mkdir()  # a new run's folder in its place is not this run's
    (folder / RUN_LOCK).write_text("pid 1 on somewhere\n")
    with pytest.raises(RunMoved, match="moved away or replaced"):
        check_run_in_place(folder, lock)
    lock.close()


STRESS = Path(__file__).parent.parent / "helpers" / "run_folder_stress.py"


@pytest.mark.parametrize("round_", range(5))
def test_runs_started_resumed_and_overwritten_together_never_share_a_folder_nor_move_a_live_one(tmp_path, round_):
    """24 processes, each starting a run in one folder at once, half with --overwrite and half as a
    resume, each then writing 5 lines and looking before each that its folder is in place: every
    interleaving of their looks, moves, claims and run locks that the scheduler makes."""
    folder = tmp_path / "run"
    hows = ["overwrite", "resume"] * 12
    processes = [
        subprocess.Popen(
            [sys.executable, str(STRESS), str(folder), how, str(100 * round_ + seed)], stdout=subprocess.PIPE, text=True
        )
        for seed, how in enumerate(hows)
    ]
    outcomes = [process.communicate(timeout=120)[0].strip() for process in processes]
    assert "moved" not in outcomes and set(outcomes) <= {"refused", "wrote 5"}, outcomes
    writers = 0
    for run_dir in [folder, *tmp_path.glob("run.superseded*")]:
        log = run_dir / "log"
        pids = [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []
        writers_here = list(dict.fromkeys(pids))
        assert all(pids.count(pid) == 5 for pid in writers_here)  # each run's lines in the folder it started in, all of them
        assert pids == [pid for pid in writers_here for _ in range(5)], run_dir  # one live writer at a time: never interleaved
        writers += len(writers_here)
    assert writers == outcomes.count("wrote 5")
