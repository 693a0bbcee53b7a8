"""`pacs train` end to end on the built-in task: outputs, resume equivalence, errors."""

from __future__ import annotations

import json

import pytest
import torch
from mixed_rewards import MIXED_GROUPS
from safetensors.torch import load_file
from torchrun_jobs import tensorboard_steps

from pacs.cli import main
from pacs.config import ALGORITHM_CONFIGS, ConfigError, load_config
from pacs.train.checkpointing import state as checkpoint_module
from pacs.train.metrics import read_metrics
from pacs.train.trainer import train

pytestmark = pytest.mark.slow


def small_config(output_dir, model_dir, *extra):
    """A 4-step run of the demo recipe, scored in-process (`reward.num_workers=0`: a pool of
    scoring processes costs each run about a core-second, and these tests are about the loop; the
    first test runs the default pool)."""
    return load_config(
        "builtin:demo",
        [
            f"output_dir={output_dir}",
            f"model.path={model_dir}",
            "data.train=builtin:arithmetic?size=64",
            "data.val=builtin:arithmetic?size=16",
            "train.steps=4",
            "train.batch_size=8",
            "train.mini_batch_size=4",
            "train.micro_batch_size=12",
            "train.save_every=2",
            "train.eval_every=0",
            "rollout.n=4",
            "eval.n=2",
            "reward.num_workers=0",
            *extra,
        ],
    )


def weights(checkpoint):
    return load_file(checkpoint / "model.safetensors")


def test_run_writes_config_metrics_tensorboard_and_checkpoints(tmp_path, warm_model_dir):
    result = train(small_config(tmp_path / "run", warm_model_dir, "reward.num_workers=2"), show_progress=False)
    run = tmp_path / "run"
    assert load_config(str(run / "config.yaml")).train.steps == 4
    rows = read_metrics(run)
    assert [row["step"] for row in rows] == [0, 1, 2, 3, 4]  # step 0: the validation before training
    for key in (
        "reward/mean",
        "loss",
        "grad_norm",
        "response_length/mean",
        "response_length/clip_ratio",
        "actor/entropy",
        "time/step_s",
        "throughput/tokens_per_s",
    ):
        assert all(key in row for row in rows[1:]), key
    assert "val/arithmetic/pass@1" in rows[0] and "val/arithmetic/pass@1" in rows[-1]
    assert list((run / "tensorboard").iterdir())
    for name in ("step_2", "step_4", "final"):
        assert (run / "checkpoints" / name / "model.safetensors").is_file()
    assert result.final_checkpoint == run / "checkpoints" / "final"


PHASES = ("weight_sync", "generate", "score", "old_logprobs", "ref", "values", "update_critic", "update_actor", "other")


def test_every_phase_of_a_step_is_timed_and_the_phases_add_up_to_the_step(tmp_path, warm_model_dir):
    """PPO with a KL penalty runs every phase; train.peak_flops turns perf/mfu on, which is the
    6ND count over time/step_s (the built-in model ties its output layer to its embeddings, so N
    is every parameter); a checkpoint is timed on the line after its step's, validation on its own."""
    peak = 1e11
    settings = [
        "algorithm.name=ppo",
        "algorithm.kl_coef=0.05",
        f"train.peak_flops={peak}",
        "train.old_logprobs_from_first_update=false",
    ]
    train(small_config(tmp_path / "run", warm_model_dir, *settings), show_progress=False)
    validation_at_start, *rows = read_metrics(tmp_path / "run")
    assert validation_at_start["step"] == 0 and validation_at_start["time/validate_s"] > 0
    parameters = sum(tensor.numel() for tensor in weights(warm_model_dir).values())
    critic_parameters = weights(tmp_path / "run" / "checkpoints" / "final" / "critic")
    critic_parameters = sum(t.numel() for name, t in critic_parameters.items() if "embed_tokens" not in name)
    for row in rows:
        phases = [row[f"time/{phase}_s"] for phase in PHASES]
        assert all(seconds >= 0 for seconds in phases) and row["time/generate_s"] > 0 and row["time/update_actor_s"] > 0
        assert sum(phases) == pytest.approx(row["time/step_s"], rel=1e-9)
        tokens = row["throughput/tokens_per_s"] * row["time/step_s"]
        # policy: generation, old log-probs and reference forward (2N each), one update (6N); critic: values and one update
        flops = tokens * (parameters * (3 * 2 + 6) + critic_parameters * (2 + 6))
        assert row["perf/mfu"] == pytest.approx(flops / (row["time/step_s"] * peak), rel=1e-6)
    assert ["time/checkpoint_s" in row for row in rows] == [False, False, True, False]  # step_2's save
    assert ["time/validate_s" in row for row in rows] == [False, False, False, True]


def test_the_optimizer_takes_each_steps_learning_rate_from_the_schedule(tmp_path, warm_model_dir):
    train(small_config(tmp_path / "run", warm_model_dir, "train.lr_schedule=linear", "train.lr=2e-4"), show_progress=False)
    assert [row["lr"] for row in read_metrics(tmp_path / "run") if row["step"] > 0] == pytest.approx([2e-4, 1.5e-4, 1e-4, 0.5e-4])


def test_training_changes_the_weights(tmp_path, warm_model_dir):
    """Every group holds both outcomes (`MIXED_GROUPS`), so each step has a gradient whatever the
    model samples."""
    result = train(small_config(tmp_path / "run", warm_model_dir, *MIXED_GROUPS), show_progress=False)
    assert all(row["reward/groups_mixed_fraction"] == 1.0 for row in read_metrics(tmp_path / "run") if row["step"] > 0)
    before, after = weights(warm_model_dir), weights(result.final_checkpoint)
    assert any(not torch.equal(before[name], after[name]) for name in before)


REGULARISED = ["algorithm.kl_coef=0.05", "algorithm.kl_estimator=k2", "algorithm.entropy_coef=0.01"]


def all_weights(checkpoint):
    """Policy weights, and the critic's under "critic." when the checkpoint has one."""
    tensors = weights(checkpoint)
    if (checkpoint / "critic").is_dir():
        tensors.update({f"critic.{name}": value for name, value in weights(checkpoint / "critic").items()})
    return tensors


def max_weight_difference(first, second):
    expected, actual = all_weights(first), all_weights(second)
    assert expected.keys() == actual.keys()
    return max(float((expected[name] - actual[name]).abs().max()) for name in expected)


# PACS and PPO (critic, warmup) cover every kind of state a resume restores; grpo and rloo resume
# through PACS's path (test_baselines_train_checkpoint_and_resume_in_the_same_loop resumes them).
@pytest.mark.parametrize(
    "algorithm",
    [
        ["algorithm.name=pacs", *REGULARISED],
        ["algorithm.name=ppo", *REGULARISED, "critic.warmup_steps=1", "critic.lr=1e-4"],
    ],
    ids=["pacs", "ppo-warmup"],
)
def test_resume_after_a_crash_reaches_the_uninterrupted_weights(tmp_path, warm_model_dir, monkeypatch, algorithm):
    uninterrupted = train(small_config(tmp_path / "full", warm_model_dir, *algorithm), show_progress=False)

    original_save = checkpoint_module.save_checkpoint

    def save_then_crash(directory, *args, **kwargs):
        saved = original_save(directory, *args, **kwargs)
        if directory.name == "step_2":
            raise KeyboardInterrupt("simulated crash after the step-2 checkpoint")
        return saved

    monkeypatch.setattr(checkpoint_module, "save_checkpoint", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        train(small_config(tmp_path / "resumed", warm_model_dir, *algorithm), show_progress=False)
    assert not (tmp_path / "resumed" / "checkpoints" / "final").exists()
    monkeypatch.setattr(checkpoint_module, "save_checkpoint", original_save)
    resumed = train(small_config(tmp_path / "resumed", warm_model_dir, *algorithm, "resume=auto"), show_progress=False)

    assert max_weight_difference(uninterrupted.final_checkpoint, resumed.final_checkpoint) == 0.0
    full_rows, resumed_rows = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "resumed")
    assert [r["step"] for r in resumed_rows] == [0, 1, 2, 3, 4]  # the validation at step 0 not done again
    assert resumed_rows[0] | {"time/validate_s": 0} == full_rows[0] | {"time/validate_s": 0}
    assert [r["reward/mean"] for r in resumed_rows[1:]] == [r["reward/mean"] for r in full_rows[1:]]


def test_validation_before_the_first_step_is_step_0_in_every_record_and_leaves_the_training_as_it_was(tmp_path, tiny_model_dir):
    settings = ["train.steps=2", "train.save_every=0"]
    validated = train(small_config(tmp_path / "validated", tiny_model_dir, *settings), show_progress=False)
    not_validated = train(
        small_config(tmp_path / "not", tiny_model_dir, *settings, "train.eval_at_start=false"), show_progress=False
    )
    assert max_weight_difference(validated.final_checkpoint, not_validated.final_checkpoint) == 0.0
    rows = read_metrics(tmp_path / "validated")
    assert [row["step"] for row in rows] == [0, 1, 2] and [row["step"] for row in read_metrics(tmp_path / "not")] == [1, 2]
    assert {"val/arithmetic/pass@1", "time/validate_s"} <= set(rows[0]) and "reward/mean" not in rows[0]
    assert tensorboard_steps(tmp_path / "validated", "val/arithmetic/pass@1") == [0, 2]


def test_ppo_stopped_after_step_3_and_resumed_to_step_6_equals_a_straight_run(tmp_path, warm_model_dir):
    ppo = ["algorithm.name=ppo", "critic.lr=1e-4", "data.val=null", "train.save_every=3", "train.lr_schedule=constant"]
    straight = train(small_config(tmp_path / "straight", warm_model_dir, *ppo, "train.steps=6"), show_progress=False)
    train(small_config(tmp_path / "stopped", warm_model_dir, *ppo, "train.steps=3"), show_progress=False)
    resumed = train(small_config(tmp_path / "stopped", warm_model_dir, *ppo, "train.steps=6", "resume=auto"), show_progress=False)
    assert max_weight_difference(straight.final_checkpoint, resumed.final_checkpoint) == 0.0


def test_writing_checkpoints_during_the_critic_warmup_does_not_change_training(tmp_path, warm_model_dir):
    ppo = ["algorithm.name=ppo", "critic.warmup_steps=2", "data.val=null", "train.steps=3"]
    without = train(small_config(tmp_path / "without", warm_model_dir, *ppo, "train.save_every=0"), show_progress=False)
    every_step = train(small_config(tmp_path / "every", warm_model_dir, *ppo, "train.save_every=1"), show_progress=False)
    assert max_weight_difference(without.final_checkpoint, every_step.final_checkpoint) == 0.0


def test_existing_checkpoints_without_resume_are_not_overwritten(tmp_path, warm_model_dir):
    train(small_config(tmp_path / "run", warm_model_dir, "train.steps=2"), show_progress=False)
    with pytest.raises(ConfigError, match=r"already holds the checkpoints of a run \(up to step 2\); pass resume=auto"):
        train(small_config(tmp_path / "run", warm_model_dir, "train.steps=2"), show_progress=False)


def test_cli_train_then_eval(tmp_path, warm_model_dir, capsys):
    main(["train", "--config", "builtin:demo", *[f"{k}" for k in small_overrides(tmp_path / "run", warm_model_dir)]])
    assert "final checkpoint" in capsys.readouterr().out
    final = tmp_path / "run" / "checkpoints" / "final"
    main(["eval", "--model", str(final), "--data", "builtin:arithmetic?size=10", "--n", "4", "--out", str(tmp_path / "eval")])
    metrics = json.loads((tmp_path / "eval" / "eval_metrics.json").read_text())
    assert set(metrics["data_sources"]["arithmetic"]["pass@k"]) == {"pass@1", "pass@2", "pass@4"}
    samples = [json.loads(line) for line in (tmp_path / "eval" / "eval_rollout.jsonl").read_text().splitlines()]
    assert len(samples) == 40 and all(s["score"] in (0.0, 1.0) for s in samples)


def small_overrides(output_dir, model_dir):
    return [
        f"output_dir={output_dir}",
        f"model.path={model_dir}",
        "data.train=builtin:arithmetic?size=32",
        "data.val=null",
        "train.steps=2",
        "train.batch_size=4",
        "train.mini_batch_size=2",
        "rollout.n=4",
    ]


def test_cli_reports_config_errors_without_a_traceback(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--config", "builtin:demo", "train.batch_size=32", "train.mini_batch_size=5", f"output_dir={tmp_path}"])
    assert exit_info.value.code == 2
    assert "train.mini_batch_size=5 must divide train.batch_size=32" in capsys.readouterr().err


VARIANTS = {
    "grpo-kl-entropy": [
        "algorithm.name=grpo",
        "algorithm.kl_coef=0.05",
        "algorithm.entropy_coef=0.01",
        "algorithm.loss_agg=token-mean",
    ],
    "ppo-warmup": ["algorithm.name=ppo", "critic.warmup_steps=1", "critic.lr=1e-4"],
    "pacs-kl-entropy": ["algorithm.name=pacs", "algorithm.kl_coef=0.05", "algorithm.entropy_coef=0.01"],
    "grpo-kl-in-reward": [
        "algorithm.name=grpo",
        "algorithm.kl_coef=0.05",
        "algorithm.kl_estimator=k1",
        "algorithm.kl_in_reward=true",
    ],
    "ppo-kl-in-reward-paper-critic": [
        "algorithm.name=ppo",
        "algorithm.kl_coef=0.05",
        "algorithm.kl_estimator=k1",
        "algorithm.kl_in_reward=true",
        "algorithm.critic_loss_agg=seq-mean-token-sum-norm",
        "algorithm.critic_loss_scale=16",
        "critic.grad_clip=0.5",
    ],
    "dapo-dynamic-sampling-overlong": [
        "algorithm.name=dapo",
        "rollout.dynamic_sampling=true",
        "rollout.max_sampling_rounds=2",
        "algorithm.overlong_buffer=4",
        "algorithm.overlong_penalty=0.5",
    ],
}
"""Options of some algorithms that change the loop's path, beside every registered algorithm's defaults."""
EVERY_ALGORITHM = {name: [f"algorithm.name={name}"] for name in ALGORITHM_CONFIGS} | VARIANTS


@pytest.mark.parametrize("algorithm", EVERY_ALGORITHM.values(), ids=EVERY_ALGORITHM.keys())
def test_baselines_train_checkpoint_and_resume_in_the_same_loop(tmp_path, warm_model_dir, algorithm):
    overrides = [*algorithm, "train.steps=2", "train.save_every=1", "data.val=null"]
    train(small_config(tmp_path / "run", warm_model_dir, *overrides), show_progress=False)
    resumed = train(
        small_config(tmp_path / "run", warm_model_dir, *overrides, "train.steps=3", "resume=auto"), show_progress=False
    )
    rows = read_metrics(tmp_path / "run")
    assert [row["step"] for row in rows] == [1, 2, 3]
    policy_rows = [row for row in rows if "actor/critic_warmup" not in row]
    assert len(policy_rows) >= 2
    metric = "loss" if "algorithm.name=pacs" in algorithm else "actor/clip_fraction"
    assert all(metric in row and row["updates/skipped"] == 0 for row in policy_rows)
    assert (resumed.final_checkpoint / "model.safetensors").is_file()
    if "rollout.dynamic_sampling=true" in algorithm:
        assert all(1 <= row["sampling/rounds"] <= 2 and "reward/overlong_penalty" in row for row in rows)
    if "algorithm.name=ppo" in algorithm:
        assert all("critic/value_loss" in row for row in rows)
        assert (resumed.final_checkpoint / "critic" / "model.safetensors").is_file()


@pytest.mark.parametrize("critic_clip, expected", [([], 1.0), (["critic.grad_clip=0.25"], 0.25)], ids=["train-clip", "own-clip"])
def test_the_critic_is_clipped_at_its_own_grad_clip_else_at_the_trainers(
    tmp_path, warm_model_dir, monkeypatch, critic_clip, expected
):
    from pacs.train import trainer as trainer_module

    clips = []
    update_critic = trainer_module.update_critic

    def recording_update_critic(critic, optimizer, world, batch, algorithm, settings):
        clips.append(settings.grad_clip)
        return update_critic(critic, optimizer, world, batch, algorithm, settings)

    monkeypatch.setattr(trainer_module, "update_critic", recording_update_critic)
    overrides = ["algorithm.name=ppo", "train.steps=1", "train.save_every=0", "data.val=null", "train.grad_clip=1.0"]
    result = train(small_config(tmp_path / "run", warm_model_dir, *overrides, *critic_clip), show_progress=False)
    assert clips == [expected]
    assert result.skipped_updates == 0
