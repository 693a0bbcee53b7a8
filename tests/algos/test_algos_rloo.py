"""Specification of RLOO's leave-one-out advantages (pacs.algos.rloo). Its update is the clipped
policy-gradient plug-in specified in test_algos_grpo.py."""

from __future__ import annotations

import pytest
import torch

from pacs.algos import RLOO, rloo_advantages


def reference_rloo_advantages(rewards, group_size):
    """A_i = R_i − mean of the other rewards in the group, one response at a time (float64)."""
    advantages = []
    for row in range(len(rewards)):
        group = row // group_size
        others = [float(rewards[j]) for j in range(group * group_size, (group + 1) * group_size) if j != row]
        advantages.append(float(rewards[row]) - sum(others) / len(others))
    return torch.tensor(advantages, dtype=torch.float64)


@pytest.mark.parametrize("group_size", [2, 3, 5])
def test_rloo_advantages_match_reference(group_size):
    rewards = torch.rand(4 * group_size, generator=torch.Generator().manual_seed(group_size), dtype=torch.float64)
    expected = reference_rloo_advantages(rewards, group_size)
    torch.testing.assert_close(rloo_advantages(rewards, group_size), expected, atol=1e-12, rtol=0)


def test_rloo_advantage_subtracts_the_mean_of_the_other_rewards():
    advantages = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), 4)
    torch.testing.assert_close(advantages, torch.tensor([1.0, -1 / 3, -1 / 3, -1 / 3]))


def test_rloo_advantages_are_n_over_n_minus_1_times_the_centered_rewards():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.2, 0.7], dtype=torch.float64)
    centered = rewards.view(2, 3) - rewards.view(2, 3).mean(dim=-1, keepdim=True)
    torch.testing.assert_close(rloo_advantages(rewards, 3), (3 / 2 * centered).reshape(-1), atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("group_size", [3, 6, 7, 8])
def test_rloo_advantages_of_a_group_of_equal_rewards_are_exactly_zero(group_size, dtype):
    rewards = torch.tensor([0.7] * group_size + [1.0] + [0.0] * (group_size - 1), dtype=dtype)
    advantages = rloo_advantages(rewards, group_size)
    assert torch.equal(advantages[:group_size], torch.zeros(group_size, dtype=dtype))
    assert advantages[group_size] == 1


def test_rloo_advantages_carry_no_gradient():
    rewards = torch.tensor([1.0, 0.0], requires_grad=True)
    assert not rloo_advantages(rewards, 2).requires_grad


def test_rloo_plugin_step_terms_are_the_leave_one_out_advantages():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    step_terms = RLOO(3, max_response_length=8).prepare_step({"rewards": rewards})
    assert torch.equal(step_terms["advantages"], rloo_advantages(rewards, 3))


def test_groups_of_one_are_rejected():
    with pytest.raises(ValueError, match=r"RLOO's leave-one-out baseline needs group_size >= 2 .*rollout.n.*got 1"):
        rloo_advantages(torch.zeros(4), 1)
    with pytest.raises(ValueError, match=r"RLOO needs group_size >= 2"):
        RLOO(1, max_response_length=8)


def test_batch_not_multiple_of_group_size_is_rejected():
    with pytest.raises(ValueError, match=r"batch size 5 is not a multiple of group_size 2"):
        rloo_advantages(torch.zeros(5), 2)
