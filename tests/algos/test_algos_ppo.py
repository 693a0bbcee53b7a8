"""Specification of PPO's critic-side math (pacs.algos.ppo): outcome token rewards, GAE, whitening,
the clipped value loss and explained variance, and the PPO plug-in's step terms and critic loss.
The actor's update is the clipped policy-gradient plug-in specified in test_algos_grpo.py."""

from __future__ import annotations

import math

import pytest
import torch

from pacs.algos import (
    PPO,
    aggregate_loss,
    explained_variance,
    gae_advantages,
    outcome_token_rewards,
    value_loss,
    whiten,
)

NUM_ROWS = 6
NUM_TOKENS = 7
HORIZON = 10


# --- float64 references, one token at a time -------------------------------------------------


def reference_gae(token_rewards, values, response_mask, gamma, lam):
    """Raw GAE and returns per row, walking its response tokens backwards (padding skipped)."""
    advantages = torch.zeros_like(values)
    for row in range(values.shape[0]):
        positions = [t for t in range(values.shape[1]) if response_mask[row, t]]
        next_value, next_advantage = 0.0, 0.0
        for t in reversed(positions):
            delta = float(token_rewards[row, t]) + gamma * next_value - float(values[row, t])
            next_advantage = delta + gamma * lam * next_advantage
            next_value = float(values[row, t])
            advantages[row, t] = next_advantage
    return advantages, (advantages + values) * response_mask


def reference_whiten(values, response_mask):
    num_rows, num_tokens = values.shape
    tokens = [float(values[i, t]) for i in range(num_rows) for t in range(num_tokens) if response_mask[i, t]]
    mean = sum(tokens) / len(tokens)
    variance = sum((value - mean) ** 2 for value in tokens) / (len(tokens) - 1)
    return (values - mean) / math.sqrt(variance + 1e-8) * response_mask


def reference_value_loss(values, old_values, returns, response_mask, clip):
    per_token = torch.zeros_like(values)
    for row in range(values.shape[0]):
        for t in range(values.shape[1]):
            if not response_mask[row, t]:
                continue
            value, old_value = values[row, t], old_values[row, t]
            squared_error = (value - returns[row, t]) ** 2
            if clip is not None:
                clipped_value = min(max(value, old_value - clip), old_value + clip)
                if (clipped_value - returns[row, t]) ** 2 > squared_error:
                    squared_error = (clipped_value - returns[row, t]) ** 2
            per_token = per_token.index_put((torch.tensor(row), torch.tensor(t)), 0.5 * squared_error)
    return per_token


def make_rollouts(seed=0):
    """Float64 rollouts with right-padded responses of ragged lengths, one row empty of reward."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([7, 3, 1, 5, 7, 2])
    response_mask = (torch.arange(NUM_TOKENS) < lengths[:, None]).to(torch.float64)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.5, 1.0], dtype=torch.float64)
    values = torch.rand(NUM_ROWS, NUM_TOKENS, generator=generator, dtype=torch.float64)
    return rewards, values, response_mask


def updated_values(old_values):
    """The critic's values after some updates: the rollout values moved by N(0, 0.5²), with gradient."""
    noise = torch.randn(old_values.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return (old_values + 0.5 * noise).requires_grad_()


# --- outcome rewards and GAE -----------------------------------------------------------------


def test_outcome_reward_sits_on_the_last_response_token():
    rewards = torch.tensor([1.0, 0.5, 1.0])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    expected = torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert torch.equal(outcome_token_rewards(rewards, mask), expected)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (1.0, 0.95)])
def test_gae_returns_match_reference(gamma, lam):
    rewards, values, mask = make_rollouts()
    token_rewards = outcome_token_rewards(rewards, mask)
    _, returns = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=lam)
    _, expected_returns = reference_gae(token_rewards, values, mask, gamma, lam)
    torch.testing.assert_close(returns, expected_returns, atol=1e-12, rtol=0)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95)])
def test_gae_advantages_are_the_whitened_reference(gamma, lam):
    rewards, values, mask = make_rollouts()
    token_rewards = outcome_token_rewards(rewards, mask)
    advantages, _ = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=lam)
    raw, _ = reference_gae(token_rewards, values, mask, gamma, lam)
    torch.testing.assert_close(advantages, reference_whiten(raw, mask), atol=1e-12, rtol=0)


def test_gae_with_gamma_and_lambda_one_returns_the_outcome_reward_at_every_token():
    rewards, values, mask = make_rollouts()
    _, returns = gae_advantages(outcome_token_rewards(rewards, mask), values, mask)
    torch.testing.assert_close(returns, rewards[:, None] * mask, atol=1e-12, rtol=0)


def test_gae_skips_padding_inside_a_response():
    """A masked hole between tokens is transparent: V and Â flow from the next response token."""
    mask = torch.tensor([[1.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, 99.0, 0.6]], dtype=torch.float64)
    token_rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    _, returns = gae_advantages(token_rewards, values, mask, gamma=0.9, lam=0.5)
    last = 1.0 - 0.6
    first = (0.9 * 0.6 - 0.2) + 0.9 * 0.5 * last
    torch.testing.assert_close(returns, torch.tensor([[first + 0.2, 0.0, 1.0]], dtype=torch.float64))


@pytest.mark.parametrize("padding_value", [1e6, math.inf, math.nan])
def test_gae_ignores_values_and_rewards_at_padding(padding_value):
    rewards, values, mask = make_rollouts()
    token_rewards = outcome_token_rewards(rewards, mask)
    padded_values = torch.where(mask.bool(), values, padding_value)
    padded_rewards = torch.where(mask.bool(), token_rewards, padding_value)
    expected = gae_advantages(token_rewards, values, mask, gamma=0.9, lam=0.95)
    padded = gae_advantages(padded_rewards, padded_values, mask, gamma=0.9, lam=0.95)
    assert all(torch.equal(got, want) for got, want in zip(padded, expected))


def test_whitened_advantages_have_zero_mean_and_unit_unbiased_std_over_response_tokens():
    _, values, mask = make_rollouts()
    whitened = whiten(values, mask)[mask.bool()]
    assert float(whitened.mean()) == pytest.approx(0.0, abs=1e-12)
    assert float(whitened.std()) == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(whiten(values, mask)[~mask.bool()], torch.zeros(int((1 - mask).sum()), dtype=torch.float64))


# --- value loss and explained variance -------------------------------------------------------


@pytest.mark.parametrize("clip", [0.2, None])
def test_value_loss_matches_reference(clip):
    rewards, old_values, mask = make_rollouts()
    _, returns = gae_advantages(outcome_token_rewards(rewards, mask), old_values, mask)
    values = updated_values(old_values)
    per_token = value_loss(values, old_values, returns, mask, clip=clip)
    expected = reference_value_loss(values, old_values, returns, mask, clip)
    torch.testing.assert_close(per_token, expected, atol=1e-12, rtol=0)
    (grad,) = torch.autograd.grad(per_token.sum(), values)
    (expected_grad,) = torch.autograd.grad(expected.sum(), values)
    torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=0)


def test_value_clipping_keeps_the_larger_error_of_the_clipped_value():
    """V moved from 0 to 1 with G = 2, c = 0.5: the clipped V (0.5) is further from G → ½·1.5²,
    and its gradient w.r.t. V is 0. V moved to 3 with G = 2: the clipped V (0.5) is further → ½·1.5²."""
    values = torch.tensor([[1.0, 3.0]], requires_grad=True)
    per_token = value_loss(values, torch.zeros(1, 2), torch.tensor([[2.0, 2.0]]), torch.ones(1, 2), clip=0.5)
    torch.testing.assert_close(per_token, torch.tensor([[0.5 * 1.5**2, 0.5 * 1.5**2]]))
    (grad,) = torch.autograd.grad(per_token.sum(), values)
    assert torch.equal(grad, torch.zeros(1, 2))


def test_explained_variance_matches_its_formula():
    rewards, values, mask = make_rollouts()
    returns = rewards[:, None] * mask
    tokens = mask.bool()
    errors, targets = (returns - values)[tokens], returns[tokens]
    expected = 1 - float(((errors - errors.mean()) ** 2).mean()) / float(((targets - targets.mean()) ** 2).mean())
    assert explained_variance(values, returns, mask) == pytest.approx(expected, abs=1e-12)


def test_explained_variance_is_one_for_perfect_values_and_nan_for_constant_returns():
    _, values, mask = make_rollouts()
    assert explained_variance(values, values, mask) == 1.0
    assert math.isnan(explained_variance(values, torch.ones_like(values), mask))


@pytest.mark.parametrize("reward", [0.0, 0.7, 1.0])
def test_explained_variance_is_nan_for_float32_returns_constant_up_to_rounding(reward):
    """Every reward equal: G = Â + V is the reward up to float32 rounding (variance ~1e-13), which
    must not give EV ≈ −1e14."""
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(8, 64)
    mask[::2, 32:] = 0
    values = 3 * torch.randn(8, 64, generator=generator)
    _, returns = gae_advantages(outcome_token_rewards(torch.full((8,), reward), mask), values, mask)
    assert math.isnan(explained_variance(values, returns, mask))


def test_explained_variance_of_float32_returns_that_vary_matches_its_formula():
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(8, 64)
    mask[::2, 32:] = 0
    values = 3 * torch.randn(8, 64, generator=generator)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    _, returns = gae_advantages(outcome_token_rewards(rewards, mask), values, mask)
    tokens = mask.bool()
    targets = returns[tokens].double()
    errors = targets - values[tokens].double()
    expected = 1 - float(errors.var(unbiased=False)) / float(targets.var(unbiased=False))
    assert explained_variance(values, returns, mask) == pytest.approx(expected, rel=1e-12)


# --- the PPO plug-in -------------------------------------------------------------------------


def test_ppo_needs_the_critic_values_and_whatever_its_options_use():
    assert PPO(2, max_response_length=HORIZON).needs == {"values"}
    assert PPO(2, max_response_length=HORIZON, kl_coef=0.1, entropy_coef=0.01).needs == {"values", "ref_logprobs", "entropy"}


def test_ppo_step_terms_are_the_whitened_gae_and_returns_of_the_outcome_rewards():
    rewards, values, mask = make_rollouts()
    algorithm = PPO(2, max_response_length=HORIZON, gamma=0.9, lam=0.95)
    step_terms = algorithm.prepare_step({"rewards": rewards, "values": values, "response_mask": mask})
    expected = gae_advantages(outcome_token_rewards(rewards, mask), values, mask, gamma=0.9, lam=0.95)
    assert torch.equal(step_terms["advantages"], expected[0])
    assert torch.equal(step_terms["returns"], expected[1])


@pytest.mark.parametrize("micro_batch_size", [1, 4, NUM_ROWS])
@pytest.mark.parametrize("critic_loss_agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_critic_micro_batch_shares_sum_to_the_mini_batch_value_loss(critic_loss_agg, micro_batch_size):
    rewards, old_values, mask = make_rollouts()
    algorithm = PPO(2, max_response_length=HORIZON, value_clip=0.2, critic_loss_agg=critic_loss_agg)
    minibatch = {"rewards": rewards, "values": old_values, "response_mask": mask}
    minibatch.update(algorithm.prepare_step(minibatch))
    values = updated_values(old_values)
    row_terms = algorithm.critic_row_terms(minibatch)
    total = 0
    for start in range(0, NUM_ROWS, micro_batch_size):
        rows = slice(start, start + micro_batch_size)
        width = int(mask[rows].any(dim=0).sum())
        micro = {name: minibatch[name][rows, :width] for name in ("values", "returns", "response_mask")}
        micro_row_terms = {name: value[rows] for name, value in row_terms.items()}
        total = total + algorithm.critic_micro_batch_loss(values[rows, :width], micro, micro_row_terms)
    per_token = reference_value_loss(values, old_values, minibatch["returns"], mask, 0.2)
    expected = aggregate_loss(per_token, mask, critic_loss_agg, max_response_length=HORIZON)
    torch.testing.assert_close(total, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        torch.autograd.grad(total, values, retain_graph=True), torch.autograd.grad(expected, values), atol=1e-12, rtol=0
    )
    metrics = algorithm.critic_metrics(values.detach(), minibatch)
    assert metrics["critic/value_loss"] == pytest.approx(float(expected.detach()), abs=1e-12)
    assert metrics["critic/explained_variance"] == explained_variance(values, minibatch["returns"], mask)


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(gamma=1.1), r"gamma must be in \[0, 1\], got 1.1"),
        (dict(lam=-0.5), r"lam must be in \[0, 1\], got -0.5"),
        (dict(value_clip=0.0), r"value_clip must be None or > 0"),
        (dict(critic_loss_agg="sum"), r"unknown critic_loss_agg 'sum'"),
    ],
)
def test_invalid_ppo_options_are_rejected(options, message):
    with pytest.raises(ValueError, match=message):
        PPO(2, max_response_length=HORIZON, **options)


def test_gae_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"token_rewards \(2, 3\), values \(2, 4\)"):
        gae_advantages(torch.zeros(2, 3), torch.zeros(2, 4), torch.ones(2, 3))
