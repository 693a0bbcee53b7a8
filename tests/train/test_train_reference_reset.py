"""Specification of PACS as the paper's text describes it: the reward proxy against a fixed reference
policy (`algorithm.pacs_reference=fixed`), hard-reset to the current policy with a fresh optimizer
state every `train.reference_reset_every` steps, in the trainer and through a resume."""

from __future__ import annotations

import pytest
import torch
from mixed_rewards import MIXED_GROUPS
from safetensors.torch import load_file

from pacs.algos import PACS, pacs_loss
from pacs.config import ConfigError, load_config
from pacs.train.checkpointing.state import REFERENCE_DIR
from pacs.train.metrics import read_metrics
from pacs.train.trainer import train

pytestmark = pytest.mark.slow

FIXED_REFERENCE = ["algorithm.name=pacs", "algorithm.pacs_reference=fixed", "train.reference_reset_every=2"]


def reset_config(output_dir, model_dir, *extra):
    """4 steps of 2 updates each (8 prompts, mini-batches of 4), every group with both outcomes."""
    return load_config(
        "builtin:demo",
        [
            f"output_dir={output_dir}",
            f"model.path={model_dir}",
            "data.train=builtin:arithmetic?size=64",
            "data.val=null",
            "train.steps=4",
            "train.batch_size=8",
            "train.mini_batch_size=4",
            "train.save_every=1",
            "train.lr_schedule=constant",
            "rollout.n=4",
            *MIXED_GROUPS,
            *FIXED_REFERENCE,
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, warm_model_dir):
    output_dir = tmp_path_factory.mktemp("straight")
    train(reset_config(output_dir, warm_model_dir), show_progress=False)
    return output_dir


def test_the_reference_is_reset_before_step_3_to_the_policy_after_step_2(straight_run):
    checkpoints = straight_run / "checkpoints"
    assert [row["reference/reset"] for row in read_metrics(straight_run)] == [0.0, 0.0, 1.0, 0.0]
    policy_after_step_2 = load_file(checkpoints / "step_2" / "model.safetensors")
    for step in (3, 4):
        reference = load_file(checkpoints / f"step_{step}" / REFERENCE_DIR / "model.safetensors")
        assert reference.keys() == policy_after_step_2.keys()
        assert all(torch.equal(reference[name], policy_after_step_2[name]) for name in reference)
    before_reset = load_file(checkpoints / "step_2" / REFERENCE_DIR / "model.safetensors")
    assert any(not torch.equal(before_reset[name], policy_after_step_2[name]) for name in before_reset)


def test_the_reset_starts_the_optimizer_afresh(straight_run):
    """AdamW's step count: 2 updates a step, counted from the reset before step 3."""

    def adam_steps(step):
        files = (straight_run / "checkpoints" / f"step_{step}" / "optimizer").glob("*.safetensors")
        return {int(value) for file in files for key, value in load_file(file).items() if key.endswith(":step")}

    assert [adam_steps(step) for step in (2, 3, 4)] == [{4}, {2}, {4}]


def test_a_run_resumed_after_the_reset_reaches_the_uninterrupted_weights(straight_run, tmp_path, warm_model_dir):
    train(reset_config(tmp_path, warm_model_dir, "train.steps=3"), show_progress=False)
    resumed = train(reset_config(tmp_path, warm_model_dir, "resume=auto"), show_progress=False)
    straight = load_file(straight_run / "checkpoints" / "final" / "model.safetensors")
    weights = load_file(resumed.final_checkpoint / "model.safetensors")
    assert max((weights[name] - straight[name]).abs().max().item() for name in weights) <= 1e-6


def test_the_fixed_reference_replaces_the_rollout_policy_in_the_proxy():
    """The plug-in's mini-batch loss and gradient are pacs_loss with the reference's log-probs in
    place of the rollout policy's, from the first update on (where θ = θ_old no longer gives ψ = 0)."""
    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(8, 5, generator=generator, dtype=torch.float64)
    reference = old + 0.3 * torch.randn(8, 5, generator=generator, dtype=torch.float64)
    mask = torch.ones(8, 5, dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    algorithm = PACS(4, pacs_reference="fixed", beta=2.0)
    assert algorithm.needs == {"ref_logprobs"}
    rows = {"old_logprobs": old, "ref_logprobs": reference, "response_mask": mask, "rewards": rewards}
    for first_update, logprobs in ((True, old.clone()), (False, old + 0.1)):
        logprobs.requires_grad_(True)
        row_terms, metrics = algorithm.prepare_update(rows, lambda: logprobs.detach(), first_update)
        loss = algorithm.micro_batch_loss(logprobs, rows, row_terms)
        expected = pacs_loss(logprobs, reference, mask, rewards, 4, beta=2.0)
        assert metrics["loss"] == pytest.approx(expected.item(), abs=1e-12)
        (grad,) = torch.autograd.grad(loss, logprobs)
        (expected_grad,) = torch.autograd.grad(expected, logprobs)
        torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.reference_reset_every=5"], "the run uses no reference model to reset"),
        ([*FIXED_REFERENCE, "model.lora_rank=4"], "with LoRA the reference is the base model inside the policy"),
        (["algorithm.pacs_reference=fixed", "algorithm.proxy=mean_logprob"], "only the logratio proxy"),
    ],
    ids=["nothing-to-reset", "lora", "mean_logprob"],
)
def test_settings_without_a_reference_to_use_or_reset_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)
