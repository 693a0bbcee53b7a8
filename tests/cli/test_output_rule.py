"""Specification of where pacs writes (`pacs.outputs`): every command that writes refuses a bad
input without touching the disk, never writes into a folder of someone else's files, and keeps a
previous pacs output (refused, or moved aside when asked), never deleting it."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from benchmark_data import BENCHMARK_DATA
from running import run

from pacs import outputs
from pacs.outputs import MARKER, OutputRefused, claim_output_dir, claim_output_file, replace_file
from pacs.train.checkpointing.state import TRAINER_STATE


def tree_hash(root: Path) -> str:
    """A hash of every folder and file (path and bytes) under `root`."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def users_folder(path: Path) -> Path:
    """A folder of a user's own files: my_notes.txt and sub/data.txt."""
    (path / "sub").mkdir(parents=True)
    (path / "my_notes.txt").write_text("mine\n")
    (path / "sub" / "data.txt").write_text("also mine\n")
    return path


def previous_output(path: Path, command: str) -> Path:
    """A folder that `command` wrote before: marked, with a finished run's files in it."""
    final = path / "checkpoints" / "final"
    final.mkdir(parents=True)
    (final / TRAINER_STATE).write_bytes(b"state")
    (path / MARKER).write_text(f"{command}\n")
    (path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5, "loss": 0.1}\n')
    (path / "report.json").write_text("{}\n")
    return path


def plot_run(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5, "loss": 0.1}\n')
    return path


COMMANDS_WITH_A_BAD_INPUT = {
    "train": lambda out: ["train", "--config", "builtin:demo", f"output_dir={out}", "model.lora_rnk=8"],
    "sft": lambda out: ["sft", "--out", str(out), "--steps", "-3"],
    "demo": lambda out: ["demo", "--out", str(out), "model.lora_rnk=8"],
    "eval": lambda out: [
        "eval",
        "--model",
        "builtin:tiny",
        "--data",
        "builtin:arithmetic",
        "--n",
        "1",
        "--out",
        str(out),
        "--reward-function",
        "no_such_module:compute_score",
    ],
    "compare": lambda out: ["compare", "--config", "builtin:compare-demo", "--out", str(out), "train.steps=abc"],
    "prepare": lambda out: [
        "prepare",
        "--input",
        str(BENCHMARK_DATA / "math500.jsonl"),
        "--source",
        "math5000",
        "--out",
        str(out / "math500.parquet"),
    ],
    "plot": lambda out: ["plot", str(out / "no_such_run"), "--out", str(out)],
}


@pytest.mark.parametrize("command", COMMANDS_WITH_A_BAD_INPUT)
def test_a_bad_input_leaves_a_folder_of_user_files_byte_for_byte_as_it_was(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    target = users_folder(tmp_path / "target")
    before = tree_hash(tmp_path)
    assert run(COMMANDS_WITH_A_BAD_INPUT[command](target)) != 0
    assert tree_hash(tmp_path) == before


COMMANDS_WITH_GOOD_INPUTS = {
    "train": lambda out: ["train", "--config", "builtin:demo", f"output_dir={out}", "train.steps=1"],
    "sft": lambda out: ["sft", "--out", str(out), "--steps", "1"],
    "demo": lambda out: ["demo", "--out", str(out), "train.steps=1"],
    "eval": lambda out: ["eval", "--model", "builtin:tiny", "--data", "builtin:arithmetic?size=2", "--n", "1", "--out", str(out)],
    "compare": lambda out: ["compare", "--config", "builtin:compare-demo", "--seeds", "0", "--out", str(out), "train.steps=1"],
    "plot": lambda out: ["plot", str(plot_run(out.parent / "run")), "--out", str(out)],
}


@pytest.mark.parametrize("command", COMMANDS_WITH_GOOD_INPUTS)
def test_a_folder_of_user_files_is_refused_untouched(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    target = users_folder(tmp_path / "work" / "target")
    arguments = COMMANDS_WITH_GOOD_INPUTS[command](target)
    before = tree_hash(target)
    assert run(arguments) == 2
    assert "holds files that pacs did not write (my_notes.txt, sub)" in capsys.readouterr().err
    assert tree_hash(target) == before


COMMANDS_ON_A_PREVIOUS_OUTPUT = {
    "train": lambda out: ["train", "--config", "builtin:demo", f"output_dir={out}"],
    "sft": lambda out: ["sft", "--out", str(out), "--steps", "1"],
    "demo": lambda out: ["demo", "--out", str(out), "train.steps=abc"],
    "eval": lambda out: ["eval", "--model", "builtin:tiny", "--data", "builtin:arithmetic", "--n", "1", "--out", str(out)],
    "compare": lambda out: ["compare", "--config", "builtin:compare-demo", "--out", str(out), "train.steps=abc"],
    "plot": lambda out: ["plot", str(plot_run(out.parent / "run")), "--out", str(out)],
}


@pytest.mark.parametrize("command", COMMANDS_ON_A_PREVIOUS_OUTPUT)
def test_a_previous_pacs_output_is_kept(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    target = previous_output(tmp_path / "work" / "target", f"pacs {command}")
    arguments = COMMANDS_ON_A_PREVIOUS_OUTPUT[command](target)
    before = tree_hash(target)
    assert run(arguments) != 0
    assert tree_hash(target) == before


def test_prepare_keeps_an_existing_file_unless_asked_then_moves_it_aside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "math500.parquet"
    out.write_bytes(b"an earlier file")
    arguments = ["prepare", "--input", str(BENCHMARK_DATA / "math500.jsonl"), "--out", str(out)]
    assert run(arguments) != 0
    assert out.read_bytes() == b"an earlier file"
    assert run([*arguments, "--overwrite"]) == 0
    assert (tmp_path / "math500.parquet.superseded").read_bytes() == b"an earlier file"
    assert out.read_bytes().startswith(b"PAR1")


def test_plot_redraws_its_own_plots_in_place_without_overwrite(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = plot_run(tmp_path / "run")
    assert run(["plot", str(run_dir)]) == 0
    first = (run_dir / "plots" / "reward_mean.png").stat().st_mtime_ns
    (run_dir / "metrics.jsonl").write_text(
        '{"step": 1, "reward/mean": 0.5, "loss": 0.1}\n{"step": 2, "reward/mean": 0.6, "loss": 0.1}\n'
    )
    assert run(["plot", str(run_dir)]) == 0
    assert run(["plot", str(run_dir), "--overwrite"]) == 0
    assert not any(path.name.startswith("plots.superseded") for path in run_dir.iterdir())
    assert (run_dir / "plots" / "reward_mean.png").stat().st_mtime_ns != first


def test_plot_overwrite_moves_a_plot_folder_holding_other_files_aside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run_dir = plot_run(tmp_path / "run")
    assert run(["plot", str(run_dir)]) == 0
    (run_dir / "plots" / "notes.txt").write_text("mine\n")
    first = tree_hash(run_dir / "plots")
    assert run(["plot", str(run_dir)]) == 2
    assert run(["plot", str(run_dir), "--overwrite"]) == 0
    assert tree_hash(run_dir / "plots.superseded") == first
    assert (run_dir / "plots" / "reward_mean.png").is_file()


def test_train_refuses_a_finished_run_and_names_overwrite(tmp_path, capsys):
    target = previous_output(tmp_path / "run", "pacs train")
    assert run(["train", "--config", "builtin:demo", f"output_dir={target}"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert not (target / "config.yaml").exists()


def test_a_new_folder_is_created_and_marked(tmp_path):
    claim_output_dir(tmp_path / "a" / "b", "pacs eval")
    assert (tmp_path / "a" / "b" / MARKER).read_text() == "pacs eval\n"


def test_an_empty_folder_is_taken(tmp_path):
    (tmp_path / "empty").mkdir()
    assert claim_output_dir(tmp_path / "empty", "pacs eval") is None
    assert (tmp_path / "empty" / MARKER).is_file()


def test_a_folder_of_user_files_is_refused_even_when_asked_to_replace(tmp_path):
    target = users_folder(tmp_path / "target")
    before = tree_hash(tmp_path)
    with pytest.raises(OutputRefused, match="did not write"):
        claim_output_dir(target, "pacs eval", replace=True)
    assert tree_hash(tmp_path) == before


def test_replacing_moves_the_previous_output_aside_each_time_to_a_free_name(tmp_path):
    target = previous_output(tmp_path / "run", "pacs demo")
    contents = tree_hash(target)
    assert claim_output_dir(target, "pacs demo", replace=True) == tmp_path / "run.superseded"
    (target / "report.json").write_text("second\n")
    assert claim_output_dir(target, "pacs demo", replace=True) == tmp_path / "run.superseded.2"
    assert tree_hash(tmp_path / "run.superseded") == contents
    assert (tmp_path / "run.superseded.2" / "report.json").read_text() == "second\n"
    assert [entry.name for entry in target.iterdir()] == [MARKER]


def test_reuse_keeps_a_previous_output_in_place(tmp_path):
    target = previous_output(tmp_path / "run", "pacs train")
    before = tree_hash(target)
    assert claim_output_dir(target, "pacs train", reuse=True) is None
    assert tree_hash(target) == before


def test_a_file_where_a_folder_belongs_is_refused(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(OutputRefused, match="is a file"):
        claim_output_dir(tmp_path / "out", "pacs eval")


def test_an_output_file_is_refused_if_it_exists_unless_replaced(tmp_path):
    existing = tmp_path / "rows.parquet"
    existing.write_text("old")
    with pytest.raises(OutputRefused, match="--overwrite"):
        claim_output_file(existing)
    assert claim_output_file(existing, replace=True) == tmp_path / "rows.parquet.superseded"
    assert not existing.exists()


def test_compare_keeps_its_own_folder_for_the_next_run(tmp_path):
    out = previous_output(tmp_path / "compare", "pacs compare")
    (out / "comparison.json").write_text(json.dumps({"results": {}}))
    before = tree_hash(out)
    assert claim_output_dir(out, "pacs compare", reuse=True) is None
    assert tree_hash(out) == before


def test_a_replaced_file_is_whole_before_or_after_and_a_failed_write_leaves_the_old_one_alone(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    replace_file(path, "old\n")
    assert path.read_text() == "old\n"

    def disk_full(descriptor):
        raise OSError("disk full")

    monkeypatch.setattr(outputs.os, "fsync", disk_full)
    with pytest.raises(OSError, match="disk full"):
        replace_file(path, "new\n")
    assert path.read_text() == "old\n"
    assert [entry.name for entry in tmp_path.iterdir()] == ["metrics.jsonl"]
