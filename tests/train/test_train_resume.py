"""Where a run starts again: a finished run extended or left alone, damaged checkpoints skipped,
bounded checkpoints, what a killed save left behind, and a lost writer node refused."""

from __future__ import annotations

import os

import pytest
import torch
from test_train_loop import small_config, weights
from torchrun_jobs import tensorboard_steps

from pacs.config import ConfigError
from pacs.outputs import claim_output_dir
from pacs.train.checkpointing import state as checkpoint_module
from pacs.train.checkpointing.folders import MANIFEST, checkpoints_newest_first
from pacs.train.checkpointing.resume import RESTART_COUNT, SEGMENTS, JobHistory, read_segments, run_start
from pacs.train.metrics import read_metrics
from pacs.train.trainer import train

pytestmark = pytest.mark.slow

NO_VALIDATION = ["data.val=null", "train.lr_schedule=constant"]


def tree(directory) -> dict[str, tuple[int, int]]:
    """Every path under `directory` with its size and modification time."""
    return {str(path.relative_to(directory)): (path.stat().st_size, path.stat().st_mtime_ns) for path in directory.rglob("*")}


def test_a_finished_run_given_more_steps_goes_on_from_final_logging_each_step_once(tmp_path, warm_model_dir, capsys):
    run = tmp_path / "run"
    train(small_config(run, warm_model_dir, *NO_VALIDATION, "train.steps=3", "train.save_every=0"), show_progress=False)
    straight = train(
        small_config(tmp_path / "straight", warm_model_dir, *NO_VALIDATION, "train.steps=5", "train.save_every=0"),
        show_progress=False,
    )
    capsys.readouterr()

    extended = train(
        small_config(run, warm_model_dir, *NO_VALIDATION, "train.steps=5", "train.save_every=0", "resume=auto"),
        show_progress=False,
    )

    assert "finished 3 steps; extending it to 5" in capsys.readouterr().err
    assert [row["step"] for row in read_metrics(run)] == [1, 2, 3, 4, 5]
    assert tensorboard_steps(run) == [1, 2, 3, 4, 5]
    after, expected = weights(extended.final_checkpoint), weights(straight.final_checkpoint)
    assert all(torch.equal(after[name], expected[name]) for name in expected)


def test_a_finished_run_with_the_same_steps_says_so_and_writes_nothing(tmp_path, warm_model_dir, capsys):
    run = tmp_path / "run"
    train(small_config(run, warm_model_dir, *NO_VALIDATION, "train.steps=2", "train.save_every=1"), show_progress=False)
    before = tree(run)
    capsys.readouterr()

    result = train(small_config(run, warm_model_dir, *NO_VALIDATION, "train.steps=2", "resume=auto"), show_progress=False)

    assert result.finished_before and result.final_checkpoint == run / "checkpoints" / "final"
    assert "already finished its 2 steps" in capsys.readouterr().err
    assert tree(run) == before


def test_keep_checkpoints_leaves_the_newest_steps_and_a_final_that_is_no_second_copy(tmp_path, warm_model_dir):
    run = tmp_path / "run"
    train(
        small_config(run, warm_model_dir, *NO_VALIDATION, "train.steps=5", "train.save_every=1", "train.keep_checkpoints=2"),
        show_progress=False,
    )
    checkpoints = run / "checkpoints"
    assert sorted(path.name for path in checkpoints.iterdir()) == ["final", "step_4", "step_5"]
    final, last = checkpoints / "final" / "model.safetensors", checkpoints / "step_5" / "model.safetensors"
    assert os.path.samefile(final, last)  # hard links: one copy on disk


def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one_and_named(tmp_path, warm_model_dir, capsys):
    run = tmp_path / "run"
    uninterrupted = train(
        small_config(tmp_path / "full", warm_model_dir, *NO_VALIDATION, "train.save_every=1"), show_progress=False
    )
    crash_after_saving(run, warm_model_dir, "step_3")
    shard = run / "checkpoints" / "step_3" / "model.safetensors"
    os.truncate(shard, shard.stat().st_size // 2)
    capsys.readouterr()

    resumed = train(small_config(run, warm_model_dir, *NO_VALIDATION, "train.save_every=1", "resume=auto"), show_progress=False)

    said = capsys.readouterr().err
    assert f"{run / 'checkpoints' / 'step_3'} is damaged (model.safetensors holds" in said
    assert f"resuming from {run / 'checkpoints' / 'step_2'} (step 2)" in said
    assert [row["step"] for row in read_metrics(run)] == [1, 2, 3, 4]
    after, expected = weights(resumed.final_checkpoint), weights(uninterrupted.final_checkpoint)
    assert all(torch.equal(after[name], expected[name]) for name in expected)


def crash_after_saving(run, model_dir, checkpoint: str) -> None:
    """Run `small_config` in `run` until `checkpoint` is in place, then stop it as a crash would."""
    original = checkpoint_module.save_checkpoint

    def save_then_crash(directory, *args, **kwargs):
        saved = original(directory, *args, **kwargs)
        if directory.name == checkpoint:
            raise KeyboardInterrupt(f"simulated crash after {checkpoint}")
        return saved

    checkpoint_module.save_checkpoint = save_then_crash
    try:
        with pytest.raises(KeyboardInterrupt):
            train(small_config(run, model_dir, *NO_VALIDATION, "train.save_every=1"), show_progress=False)
    finally:
        checkpoint_module.save_checkpoint = original


def test_a_killed_saves_staging_folder_is_removed_when_the_run_starts_again(tmp_path, warm_model_dir, capsys):
    run = tmp_path / "run"
    crash_after_saving(run, warm_model_dir, "step_1")
    left = run / "checkpoints" / ".tmp-step_2-999999"  # as a kill mid-save leaves it
    (left / "optimizer").mkdir(parents=True)
    (left / "optimizer" / "optimizer-00001.safetensors").write_bytes(b"partial")
    capsys.readouterr()

    train(small_config(run, warm_model_dir, *NO_VALIDATION, "train.steps=2", "resume=auto"), show_progress=False)

    assert not left.exists()
    assert f"removed {left}, left by a save that was killed" in capsys.readouterr().err


def test_every_checkpoint_damaged_is_refused_naming_each(tmp_path):
    checkpoints = tmp_path / "run" / "checkpoints"
    for name in ("step_1", "final"):
        (checkpoints / name).mkdir(parents=True)
        (checkpoints / name / MANIFEST).write_text(
            '{"format": 1, "step": 1, "files": {"model.safetensors": {"bytes": 8, "crc32": 0}}}'
        )
    config = small_config(tmp_path / "run", "builtin:tiny", "resume=auto")
    with pytest.raises(
        ConfigError, match=r"no checkpoint .* can be resumed: .*final is damaged \(model.safetensors is missing\)"
    ):
        run_start(config, JobHistory())


def test_a_restarted_process_resumes_without_resume_auto(tmp_path, warm_model_dir, monkeypatch, capsys):
    run = tmp_path / "run"
    crash_after_saving(run, warm_model_dir, "step_2")
    monkeypatch.setenv(RESTART_COUNT, "1")
    capsys.readouterr()
    train(small_config(run, warm_model_dir, *NO_VALIDATION, "train.save_every=1"), show_progress=False)
    said = capsys.readouterr().err
    assert "torchrun restarted the job (restart 1)" in said and "(step 2)" in said
    assert [row["step"] for row in read_metrics(run)] == [1, 2, 3, 4]


def test_a_node_that_recorded_a_newer_checkpoint_than_rank_0_has_refuses_the_start(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    record = {"step": 4, "checkpoint": "step_4", "written_on": "node-a", "recorded": "2026-11-25 10:00:00 +0000"}
    config = small_config(run, "builtin:tiny", "resume=auto")
    with pytest.raises(ConfigError, match=r"node 1 \(host b\), rank 1 recorded .*step_4 \(step 4\) in place on host node-a"):
        run_start(config, JobHistory([("node 0 (host a), rank 0", None), ("node 1 (host b), rank 1", record)]))


def test_checkpoints_are_found_newest_first_and_whole(tmp_path, warm_model_dir):
    run = tmp_path / "run"
    train(small_config(run, warm_model_dir, *NO_VALIDATION, "train.steps=2", "train.save_every=1"), show_progress=False)
    found = checkpoints_newest_first(run / "checkpoints")
    assert [(checkpoint.path.name, checkpoint.step, checkpoint.problem) for checkpoint in found] == [
        ("final", 2, None),
        ("step_2", 2, None),
        ("step_1", 1, None),
    ]


def test_extending_a_run_with_a_decaying_schedule_says_which_rates_its_first_steps_took(tmp_path):
    final = tmp_path / "run" / "checkpoints" / "final"
    final.mkdir(parents=True)
    (final / MANIFEST).write_text('{"format": 1, "step": 3, "files": {}}')
    config = small_config(tmp_path / "run", "builtin:tiny", "resume=auto", "train.steps=5", "train.lr_schedule=linear")
    start = run_start(config, JobHistory())
    assert (start.checkpoint, start.step, start.finished) == (final, 3, False)
    assert start.notes == [
        f"{tmp_path / 'run'} finished 3 steps; extending it to 5: train.lr_schedule=linear follows the 5 steps from "
        "step 4 on (steps 1-3 took the 3-step schedule's rates)"
    ]


def test_a_checkpoint_past_train_steps_is_refused_naming_the_steps_that_would_continue_it(tmp_path):
    step = tmp_path / "run" / "checkpoints" / "step_6"
    step.mkdir(parents=True)
    (step / MANIFEST).write_text('{"format": 1, "step": 6, "files": {}}')
    config = small_config(tmp_path / "run", "builtin:tiny", "resume=auto", "train.steps=5")
    with pytest.raises(ConfigError, match=r"step_6 is at step 6, past train.steps=5; pass train.steps=6 or more"):
        run_start(config, JobHistory())


def test_a_resume_that_changes_the_optimisation_is_refused_unless_allowed_then_recorded(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    settings = [*NO_VALIDATION, "train.save_every=0", "train.batch_size=8", "train.lr=1e-4"]
    train(small_config(run, tiny_model_dir, *settings, "train.steps=2"), show_progress=False)
    before = tree(run)
    changed = small_config(run, tiny_model_dir, *settings, "train.steps=3", "resume=auto", "train.lr=1e-3", "train.eval_every=1")

    with pytest.raises(ConfigError, match=r"train.lr: 0.0001 -> 0.001\. .*--allow-changes") as refusal:
        train(changed, show_progress=False)
    assert "eval_every" not in str(refusal.value)  # validation's schedule changes nothing optimised
    assert tree(run) == before
    assert not (run / SEGMENTS).exists()

    capsys.readouterr()
    train(changed, show_progress=False, allow_changes=True)
    assert "settings changed from step 3 on (train.lr: 0.0001 -> 0.001)" in capsys.readouterr().err
    segments = read_segments(run)
    assert [(segment["from_step"], segment["changes"]) for segment in segments] == [(1, {}), (3, {"train.lr": [1e-4, 1e-3]})]
    assert segments[0]["config"]["train"]["lr"] == 1e-4 and segments[1]["config"]["train"]["lr"] == 1e-3
    assert [row["step"] for row in read_metrics(run)] == [1, 2, 3]


def test_a_flipped_bit_in_the_newest_checkpoints_is_found_and_the_previous_one_resumed(tmp_path, tiny_model_dir, capsys):
    run = tmp_path / "run"
    train(small_config(run, tiny_model_dir, *NO_VALIDATION, "train.steps=2", "train.save_every=1"), show_progress=False)
    shard = run / "checkpoints" / "step_2" / "model.safetensors"  # final is made of links to the same files
    with open(shard, "r+b") as handle:
        handle.seek(shard.stat().st_size // 2 + 12345)  # between the blocks an earlier sampled checksum read
        byte = handle.read(1)[0]
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte ^ 1]))
    capsys.readouterr()

    train(
        small_config(run, tiny_model_dir, *NO_VALIDATION, "train.steps=3", "train.save_every=1", "resume=auto"),
        show_progress=False,
    )

    said = capsys.readouterr().err
    for name in ("final", "step_2"):
        assert f"{run / 'checkpoints' / name} is damaged (model.safetensors does not hold the bytes" in said
    assert f"resuming from {run / 'checkpoints' / 'step_1'} (step 1)" in said
    assert [row["step"] for row in read_metrics(run)] == [1, 2, 3]


def stopped_run(run, metrics_lines: str):
    """The folder a `pacs train` run leaves when it stops without a checkpoint (a reward function
    that raised, a Ctrl-C): its marker, config.yaml, metrics.jsonl and TensorBoard folder."""
    claim_output_dir(run, "pacs train")
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text(metrics_lines)
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"")


@pytest.mark.parametrize(
    "metrics_lines", ["", '{"step": 0, "val/arithmetic/pass@1": 0.5, "time/validate_s": 1.0}\n'], ids=["none", "validation-at-0"]
)
def test_a_run_that_stopped_before_its_first_step_ended_starts_again_in_place(tmp_path, tiny_model_dir, capsys, metrics_lines):
    run = tmp_path / "run"
    stopped_run(run, metrics_lines)
    train(small_config(run, tiny_model_dir, *NO_VALIDATION, "train.steps=1", "train.save_every=0"), show_progress=False)
    assert f"{run} holds a run that stopped before its first step ended: starting it again there" in capsys.readouterr().err
    assert [row["step"] for row in read_metrics(run)] == [1]
    assert not (tmp_path / "run.superseded").exists()


def test_a_run_that_finished_steps_but_no_checkpoint_is_refused_saying_it_cannot_be_resumed(tmp_path):
    run = tmp_path / "run"
    stopped_run(run, '{"step": 1, "loss": 0.7}\n{"step": 2, "loss": 0.7}\n')
    with pytest.raises(ConfigError, match=r"finished 2 steps but wrote no checkpoint .* cannot be resumed; pass --overwrite"):
        train(small_config(run, "builtin:tiny", *NO_VALIDATION, "train.steps=3"), show_progress=False)
