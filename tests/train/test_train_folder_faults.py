"""A run under faults it did not cause (its folder moved away, a full disk), and what a run says: its PACS loss note once, its end."""

from __future__ import annotations

import errno
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from running import run
from small_disk import mounted_tmpfs
from tensorboard.summary.writer.record_writer import RecordWriter
from test_train_loop import small_config

from pacs.config import load_config
from pacs.outputs import DiskFull, RunMoved, disk_faults
from pacs.train import metrics as metrics_module
from pacs.train.checkpointing.folders import checkpoint_problem
from pacs.train.checkpointing.state import checkpoint_space_warning
from pacs.train.trainer import train

NO_VALIDATION = ["data.val=null", "train.lr_schedule=constant", "train.save_every=0"]


@pytest.mark.slow
def test_a_run_whose_folder_is_moved_away_stops_saying_where_it_went(tmp_path, tiny_model_dir, monkeypatch):
    run, elsewhere = tmp_path / "run", tmp_path / "run.moved"
    log = metrics_module.MetricsLogger.log

    def log_then_move(self, step, metrics):
        log(self, step, metrics)
        if step == 1:
            run.rename(elsewhere)

    monkeypatch.setattr(metrics_module.MetricsLogger, "log", log_then_move)
    with pytest.raises(RunMoved, match=f"it is now {elsewhere}"):
        train(small_config(run, tiny_model_dir, *NO_VALIDATION, "train.steps=3"), show_progress=False)
    assert not run.exists()
    assert len((elsewhere / "metrics.jsonl").read_text().splitlines()) == 1  # step 2 was not written


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A 10 MiB tmpfs mounted at tmp_path/disk for the test (root only; skipped elsewhere)."""
    with mounted_tmpfs(tmp_path / "disk") as disk:
        yield disk


@pytest.mark.slow
def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_checkpoints_before_it(small_disk, tiny_model_dir, capsys):
    run_dir = small_disk / "run"
    config = [f"output_dir={run_dir}", f"model.path={tiny_model_dir}", "data.train=builtin:arithmetic?size=64", *NO_VALIDATION]
    settings = [*config, "train.steps=4", "train.batch_size=8", "train.mini_batch_size=4", "rollout.n=4", "reward.num_workers=0"]
    assert run(["train", "--config", "builtin:demo", *settings, "train.save_every=1"]) == 1

    error = capsys.readouterr().err
    last = error.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"pacs train: error: the disk holding {run_dir / 'checkpoints'} is full: writing checkpoint step_\d \(about [\d.]+ MB\) "
        r"failed with [\d.]+ [kM]?B free, and nothing of it was kept\. .*",
        last,
    ), last
    assert "Traceback" not in error
    assert "warning: the disk holding" in error  # said at the start: these settings keep more than it holds
    checkpoints = sorted(path.name for path in (run_dir / "checkpoints").iterdir())
    assert checkpoints and all(name.startswith("step_") for name in checkpoints)  # no staging folder left
    assert checkpoint_problem(run_dir / "checkpoints" / checkpoints[-1]) is None
    assert [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_metrics_line_the_disk_had_no_room_for_leaves_no_part_and_says_so(tmp_path, monkeypatch):
    logger = metrics_module.MetricsLogger(tmp_path, config=load_config("builtin:demo", ["train.report_to=[]"]))
    logger.log(1, {"loss": 0.5})
    before = (tmp_path / "metrics.jsonl").read_bytes()
    real_open = open

    class HalfWritten:
        def __init__(self, handle):
            self.handle = handle

        def __getattr__(self, name):
            return getattr(self.handle, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, text):
            self.handle.write(text[: len(text) // 2])
            self.handle.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(metrics_module, "open", lambda *args: HalfWritten(real_open(*args)), raising=False)
    with pytest.raises(DiskFull) as full:
        logger.log(2, {"loss": 0.25})
    assert full.value.strerror.startswith(f"the disk holding {tmp_path} is full: writing step 2's line of metrics.jsonl (about ")
    assert (tmp_path / "metrics.jsonl").read_bytes() == before


def test_a_full_disk_reported_by_a_library_in_words_is_a_full_disk(tmp_path):
    with pytest.raises(DiskFull, match=r"writing checkpoint step_2 \(about 6.3 MB\) failed with"):
        with disk_faults(tmp_path, "checkpoint step_2", 6_300_000):
            raise RuntimeError(
                'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
            )
    with pytest.raises(PermissionError):
        with disk_faults(tmp_path, "checkpoint step_2"):
            raise PermissionError(errno.EACCES, "Permission denied")


def test_the_start_warns_when_the_disk_cannot_hold_the_checkpoints_the_settings_keep(tmp_path):
    config = load_config("builtin:demo", ["train.steps=10", "train.save_every=2", "train.keep_checkpoints=3"])
    assert checkpoint_space_warning(config, tmp_path, 1_000_000, free=4_000_000) is None  # 3 kept + 1 being written
    warning = checkpoint_space_warning(config, tmp_path, 1_000_000, free=3_999_999)
    assert warning.startswith(f"the disk holding {tmp_path} has 4.0 MB free, and these settings keep up to 4 checkpoints")
    odd = load_config("builtin:demo", ["train.steps=9", "train.save_every=2"])  # 4 step checkpoints, final apart, 1 being written
    assert checkpoint_space_warning(odd, tmp_path, 1_000_000, free=5_999_999).split("keep up to ")[1].startswith("6 checkpoints")


@pytest.mark.slow
def test_the_pacs_loss_note_is_said_once_per_process(tmp_path, tiny_model_dir, capsys):
    for name in ("first", "second"):
        train(small_config(tmp_path / name, tiny_model_dir, *NO_VALIDATION, "train.steps=1"), show_progress=False)
    assert capsys.readouterr().err.count("PACS's loss is a cross-entropy") <= 1


@pytest.mark.slow
def test_pacs_train_ends_with_what_changed_and_the_commands_that_show_the_rest(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "run"
    settings = [
        f"output_dir={out}",
        f"model.path={tiny_model_dir}",
        "data.train=builtin:arithmetic?size=64",
        "data.val=builtin:arithmetic?size=8",
    ]
    settings += [
        "train.steps=2",
        "train.eval_every=1",
        "train.batch_size=8",
        "train.mini_batch_size=4",
        "rollout.n=4",
        "eval.n=2",
    ]
    assert run(["train", "--config", "builtin:demo", *settings, "reward.num_workers=0"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        rf"finished 2 steps in (\d+ h )?(\d+ min )?\d+ s; final checkpoint: {out / 'checkpoints' / 'final'}", printed[0]
    )
    assert re.fullmatch(r"training reward \(mean\): [\d.]+ at step 1 -> [\d.]+ at step 2", printed[1])
    assert re.fullmatch(r"validation arithmetic/pass@1: [\d.]+% at step 0 -> [\d.]+% at step 2", printed[2])
    assert printed[3:] == [
        f"next: pacs plot {out}   (PNG curves into {out / 'plots'})",
        f"      tensorboard --logdir {out / 'tensorboard'}",
    ]


@pytest.fixture
def thread_errors(monkeypatch) -> list:
    """The uncaught errors of threads that Python would print as tracebacks."""
    printed: list = []
    monkeypatch.setattr(threading, "excepthook", printed.append)
    return printed


def failing_event_writes(monkeypatch, error: OSError) -> None:
    """TensorBoard's writer thread meets `error` at every write of an event from now on."""

    def write(self, data):
        raise error

    monkeypatch.setattr(RecordWriter, "write", write)


def test_tensorboards_writer_thread_finding_the_disk_full_is_one_line_not_a_thread_traceback(
    tmp_path, monkeypatch, thread_errors
):
    logger = metrics_module.MetricsLogger(tmp_path, config=load_config("builtin:demo", ["train.report_to=[tensorboard]"]))
    logger.log(1, {"loss": 0.5})
    failing_event_writes(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(DiskFull) as full:
        logger.log(2, {"loss": 0.25})
    assert full.value.strerror.startswith(f"the disk holding {tmp_path} is full: writing step 2's tensorboard events failed")
    logger.close()  # raises nothing more
    assert thread_errors == []


def test_tensorboards_writer_thread_finding_its_folder_moved_stops_the_run_saying_so(tmp_path, monkeypatch, thread_errors):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logger = metrics_module.MetricsLogger(run_dir, config=load_config("builtin:demo", ["train.report_to=[tensorboard]"]))
    logger.log(1, {"loss": 0.5})
    failing_event_writes(monkeypatch, FileNotFoundError(errno.ENOENT, "No such file or directory"))
    with pytest.raises(RunMoved, match=rf"^{run_dir}, which this run writes, was moved away or replaced while it ran: writing "):
        logger.log(2, {"loss": 0.25})
    logger.close()
    assert thread_errors == []
