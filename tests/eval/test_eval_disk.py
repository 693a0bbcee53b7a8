"""`pacs eval` under a full disk: one line naming the folder, the file, its size and the free
space; neither output file left, so the same command then runs into the folder without --overwrite."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from running import run
from small_disk import fill_leaving, mounted_tmpfs

import pacs.outputs as outputs


def evaluate(model: Path, out: Path) -> list[str]:
    return [
        "eval",
        "--model",
        str(model),
        "--data",
        "builtin:arithmetic?size=4",
        "--n",
        "2",
        "--max-tokens",
        "4",
        "--out",
        str(out),
    ]


def assert_refused_with_one_line(capsys, out: Path, file_name: str) -> None:
    error = capsys.readouterr().err
    assert "Traceback" not in error
    assert (
        error.strip()
        .splitlines()[-1]
        .startswith(f"pacs eval: error: the disk holding {out} is full: writing {file_name} (about ")
    ), error
    assert "free, and nothing of it was kept" in error
    assert sorted(entry.name for entry in out.iterdir()) == [outputs.MARKER]


@pytest.mark.slow
def test_a_full_disk_while_eval_writes_its_metrics_leaves_neither_file_and_says_so_in_one_line(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    real_open = open

    def open_that_fills_the_disk(path, *args, **kwargs):
        handle = real_open(path, *args, **kwargs)
        if "eval_metrics.json" in str(path):
            handle.write("{\n  ")  # a part written, then the disk is full
            handle.flush()
            handle.close()
            raise OSError(errno.ENOSPC, "No space left on device")
        return handle

    monkeypatch.setattr(outputs, "open", open_that_fills_the_disk, raising=False)
    out = tmp_path / "eval"
    assert run(evaluate(tiny_model_dir, out)) == 1
    assert_refused_with_one_line(capsys, out, "eval_metrics.json")
    monkeypatch.undo()
    assert run(evaluate(tiny_model_dir, out)) == 0  # the same command, without --overwrite
    assert {"eval_rollout.jsonl", "eval_metrics.json"} <= {entry.name for entry in out.iterdir()}


@pytest.mark.slow
def test_eval_into_a_real_full_disk_stops_with_one_line(tmp_path, tiny_model_dir, capsys):
    with mounted_tmpfs(tmp_path / "disk", "1m") as disk:
        fill_leaving(disk, 4096)  # a page, which the marker takes: nothing is left for the samples
        out = disk / "eval"
        assert run(evaluate(tiny_model_dir, out)) == 1
        assert_refused_with_one_line(capsys, out, "eval_rollout.jsonl")
