"""`pacs.algos.base.AlgorithmBase`: the protocol's optional parts, with defaults, and the example
algorithm built on it (docs/examples/my_algorithm.py) checked against its formula in float64."""

from __future__ import annotations

import sys

import pytest
import torch
from plugin_algorithms import EXAMPLES

from pacs.algos.base import AlgorithmBase, MiniBatchTotals
from pacs.algos.importance import ROLLOUT_IS_LEVELS


@pytest.fixture
def my_algorithm(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import my_algorithm

    yield my_algorithm
    sys.modules.pop("my_algorithm", None)


class OnlyTheRequiredParts(AlgorithmBase):
    def prepare_update(self, minibatch, current_logprobs, policy_is_rollout_policy, totals=None):
        return {}, {"loss": 0.0}

    def micro_batch_loss(self, logprobs, micro, row_terms):
        return logprobs.sum()


def test_an_algorithm_that_writes_only_the_required_parts_gets_safe_defaults_for_the_rest():
    algorithm = OnlyTheRequiredParts(4, max_response_length=8)
    batch = {"rewards": torch.ones(8), "response_mask": torch.ones(8, 3), "old_logprobs": torch.zeros(8, 3)}
    assert (algorithm.group_size, algorithm.max_response_length, algorithm.needs, algorithm.startup_note) == (
        4,
        8,
        frozenset(),
        None,
    )
    assert algorithm.first_update_may_supply_old_logprobs is False  # the trainer computes every old log-prob first
    assert algorithm.prepare_step(batch) == {} and algorithm.metric_weights(batch) == {}
    assert algorithm.rollout_is_levels == ROLLOUT_IS_LEVELS


def reinforce_loss(logprobs, rewards, mask, group_size, baseline):
    """L = −(1/N) Σ_i (R_i − b_i) · mean_t log π(y_it), written out row by row."""
    total = torch.zeros((), dtype=logprobs.dtype)
    for i in range(len(rewards)):
        group = rewards[i // group_size * group_size : (i // group_size + 1) * group_size]
        advantage = rewards[i] - (group.mean() if baseline == "group_mean" else 0.0)
        total = total - advantage * (logprobs[i] * mask[i]).sum() / mask[i].sum()
    return total / len(rewards)


@pytest.mark.parametrize("baseline", ["group_mean", "none"])
def test_the_example_algorithms_micro_batches_sum_to_its_formulas_gradient(my_algorithm, baseline):
    generator = torch.Generator().manual_seed(0)
    group_size, rows, positions = 4, 12, 6
    mask = (torch.rand(rows, positions, generator=generator) < 0.8).double()
    mask[:, 0] = 1.0
    batch = {
        "rewards": torch.tensor([1.0, 0, 0, 1, 1, 1, 1, 1, 0, 0.5, 0, 0], dtype=torch.float64),
        "response_mask": mask,
        "old_logprobs": -torch.rand(rows, positions, generator=generator, dtype=torch.float64),
    }
    logprobs = (
        batch["old_logprobs"] - 0.1 * torch.rand(rows, positions, generator=generator, dtype=torch.float64)
    ).requires_grad_()
    algorithm = my_algorithm.Reinforce(group_size, max_response_length=positions, baseline=baseline)
    batch.update(algorithm.prepare_step(batch))
    row_terms, metrics = algorithm.prepare_update(batch, lambda: logprobs.detach(), policy_is_rollout_policy=False)

    expected = reinforce_loss(logprobs, batch["rewards"], mask, group_size, baseline)
    (expected_gradient,) = torch.autograd.grad(expected, logprobs)
    gradient = torch.zeros_like(logprobs)
    for rows_of_micro in (slice(0, 3), slice(3, 8), slice(8, 12)):  # micro-batches that split groups
        micro = {key: value[rows_of_micro] for key, value in batch.items()}
        terms = {key: value[rows_of_micro] for key, value in row_terms.items()}
        (part,) = torch.autograd.grad(algorithm.micro_batch_loss(logprobs[rows_of_micro], micro, terms), logprobs)
        gradient += part
    assert metrics["loss"] == pytest.approx(float(expected.detach()), rel=1e-12)
    assert float(expected_gradient.abs().max()) > 1e-3
    torch.testing.assert_close(gradient, expected_gradient, rtol=1e-12, atol=1e-15)


def test_the_example_algorithm_normalises_a_share_by_the_whole_mini_batch(my_algorithm):
    """With N processes each holds a share; dividing by the global row count makes the shares'
    gradients sum to the mini-batch's."""
    algorithm = my_algorithm.Reinforce(2, max_response_length=2)
    share = {"rewards": torch.tensor([1.0, 0.0]), "response_mask": torch.ones(2, 2), "old_logprobs": torch.zeros(2, 2)}
    share.update(algorithm.prepare_step(share))
    whole, _ = algorithm.prepare_update(share, None, True)
    of_two, _ = algorithm.prepare_update(share, None, True, totals=MiniBatchTotals(num_rows=4, num_tokens=8.0))
    torch.testing.assert_close(of_two["weight"], whole["weight"] / 2)
