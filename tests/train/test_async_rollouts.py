"""Asynchronous rollouts (`rollout.max_staleness` = k ≥ 1, `pacs.train.async_generator`): a generator
process per training process samples the coming steps while the trainer updates; no batch is
trained more than k versions after the one that sampled it; a killed run resumes exactly."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from killing import finished, kill_once_checkpointed
from safetensors.torch import load_file
from torchrun_jobs import process_env, read_jsonl, torchrun

from pacs.config import ASYNC_IS_CAP, ConfigError, load_config
from pacs.train.async_generator import version_of
from pacs.train.metrics import read_metrics
from pacs.train.trainer import train

SAME_WEIGHTS_LOGPROB_GAP = 1e-4
"""Largest |log π_old − log μ| accepted where the generator holds the trainer's own weights (step
1): the same float32 model, computed once incrementally while sampling and once in one pass."""
PHASES_OUTSIDE_THE_STEP = ("time/step_s", "time/validate_s", "time/checkpoint_s")


def async_overrides(output_dir: Path, model_dir: Path, *extra: str) -> list[str]:
    """A short run of the demo recipe with generation one step ahead, scored in-process."""
    return [
        f"output_dir={output_dir}",
        f"model.path={model_dir}",
        "data.train=builtin:arithmetic?size=64",
        "data.val=null",
        "train.steps=4",
        "train.batch_size=8",
        "train.mini_batch_size=4",
        "rollout.n=4",
        "reward.num_workers=0",
        "rollout.max_staleness=1",
        *extra,
    ]


def run_async(output_dir: Path, model_dir: Path, *extra: str) -> list[dict]:
    train(load_config("builtin:demo", async_overrides(output_dir, model_dir, *extra)), show_progress=False)
    return read_metrics(output_dir)


def test_the_schedule_samples_each_step_at_most_max_staleness_versions_behind():
    for k in (1, 2, 3):
        for step in range(1, 12):
            trained_version = step - 1
            assert 0 <= trained_version - version_of(step, k) == min(step - 1, k)


@pytest.mark.slow
def test_every_step_is_trained_within_max_staleness_versions_of_its_sampler(tmp_path, warm_model_dir):
    rows = run_async(tmp_path / "run", warm_model_dir, "rollout.max_staleness=2", "train.steps=5")
    assert [row["rollout/staleness_max"] for row in rows] == [0, 1, 2, 2, 2]
    assert all(row["rollout/staleness_mean"] <= row["rollout/staleness_max"] for row in rows)


@pytest.mark.slow
def test_batches_larger_than_the_pipe_do_not_stall_a_run_two_steps_ahead(tmp_path, warm_model_dir):
    """With k = 2 the trainer waits for the generator to take version j − 1 while the generator has
    a finished batch to send (each about a megabyte here, more than a pipe holds): neither may
    wait for the other (a hang fails within the timeout)."""
    job = pacs_train(
        tmp_path / "run",
        warm_model_dir,
        "rollout.max_staleness=2",
        "train.steps=5",
        "train.save_every=0",
        "train.batch_size=32",
        "train.mini_batch_size=16",
        "rollout.n=8",
        "data.max_response_length=64",
    )
    finished(job, timeout=240)
    assert [row["rollout/staleness_max"] for row in read_metrics(tmp_path / "run")] == [0, 1, 2, 2, 2]


@pytest.mark.slow
def test_the_phases_of_an_asynchronous_step_add_up_to_it(tmp_path, warm_model_dir):
    for row in run_async(tmp_path / "run", warm_model_dir):
        phases = {key: value for key, value in row.items() if key.startswith("time/") and key not in PHASES_OUTSIDE_THE_STEP}
        assert {
            "time/wait_rollout_s",
            "time/score_s",
            "time/update_actor_s",
            "time/weight_sync_s",
            "time/other_s",
        } <= phases.keys()
        assert "time/generate_s" not in phases  # generation runs beside the step: rollout/generator_s
        assert sum(phases.values()) == pytest.approx(row["time/step_s"], rel=1e-6)
        assert row["rollout/generator_s"] > 0


@pytest.mark.slow
def test_the_generator_samples_with_the_weights_it_was_pushed(tmp_path, warm_model_dir):
    first, *later = run_async(tmp_path / "run", warm_model_dir)
    assert first["rollout/logprob_abs_diff_max"] < SAME_WEIGHTS_LOGPROB_GAP  # step 1: the starting weights
    assert all(row["rollout_is/weight_mean"] > 0 for row in later)


@pytest.mark.slow
def test_the_generator_process_ends_with_the_run(tmp_path, warm_model_dir):
    run_async(tmp_path / "run", warm_model_dir, "train.steps=2")
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_lora_runs_push_the_merged_weights_to_the_generator(tmp_path, warm_model_dir):
    rows = run_async(tmp_path / "run", warm_model_dir, "model.lora_rank=8", "train.lr=0.01", "train.steps=3")
    assert rows[0]["rollout/logprob_abs_diff_max"] < SAME_WEIGHTS_LOGPROB_GAP
    assert [row["rollout/staleness_max"] for row in rows] == [0, 1, 1]


def pacs_train(output_dir: Path, model_dir: Path, *extra: str) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "pacs.cli",
        "train",
        "--config",
        "builtin:demo",
        *async_overrides(output_dir, model_dir, "train.save_every=1", *extra),
    ]
    return subprocess.Popen(
        command, env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


@pytest.mark.slow
def test_a_killed_asynchronous_run_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, warm_model_dir):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    finished(pacs_train(straight, warm_model_dir))
    job = pacs_train(killed, warm_model_dir)
    kill_once_checkpointed(job, killed)
    finished(pacs_train(killed, warm_model_dir, "resume=auto"))

    for name, tensor in load_file(straight / "checkpoints/final/model.safetensors").items():
        assert torch.equal(tensor, load_file(killed / "checkpoints/final/model.safetensors")[name]), name
    keys = ("reward/mean", "loss", "rollout/staleness_max", "rollout/logprob_abs_diff_mean")
    assert [[row[key] for key in keys] for row in read_metrics(killed)] == [
        [row[key] for key in keys] for row in read_metrics(straight)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_each_train_on_their_own_generators_batches(strategy, tmp_path, warm_model_dir):
    output_dir = tmp_path / "run"
    overrides = async_overrides(
        output_dir, warm_model_dir, f"train.strategy={strategy}", "train.steps=3", "train.distributed_timeout_s=120"
    )
    torchrun("-m", "pacs.cli", "train", "--config", "builtin:demo", *overrides, timeout=300)
    rows = read_jsonl(output_dir / "metrics.jsonl")
    assert [row["rollout/staleness_max"] for row in rows] == [0, 1, 1]
    assert rows[0]["rollout/logprob_abs_diff_max"] < SAME_WEIGHTS_LOGPROB_GAP


def test_asynchronous_runs_correct_for_the_sampler_unless_told_otherwise():
    assert load_config("builtin:demo", ["rollout.max_staleness=1"]).algorithm.rollout_is_cap == ASYNC_IS_CAP
    assert load_config("builtin:demo", ["rollout.max_staleness=1", "algorithm.rollout_is_cap=3"]).algorithm.rollout_is_cap == 3
    with pytest.raises(ConfigError, match=r"rollout.max_staleness=1 with algorithm.rollout_is_cap=null"):
        load_config("builtin:demo", ["rollout.max_staleness=1", "algorithm.rollout_is_cap=null"])


@pytest.mark.parametrize("override", ["rollout.dynamic_sampling=true", "rollout.vllm.tensor_parallel_size=2"])
def test_asynchronous_runs_refuse_what_they_cannot_schedule(override):
    with pytest.raises(ConfigError, match=rf"rollout.max_staleness=1 with {override}:"):
        load_config("builtin:demo", ["rollout.max_staleness=1", "rollout.engine=vllm", override])
