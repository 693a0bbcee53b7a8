"""Specification of the KL penalty to the reference policy (pacs.algos.kl.kl_penalty) as every
algorithm uses it: which divergence each estimator's gradient follows, k1 refused as a loss, and
padding positions that can hold any log-prob without reaching the loss or its gradient."""

from __future__ import annotations

import math

import pytest
import torch

from pacs.algos import GRPO, PACS, PPO, RLOO, gae_advantages, kl_penalty, outcome_token_rewards

NUM_CATEGORIES = 6
GROUP_SIZE = 4
NUM_TOKENS = 5
HORIZON = 8


# --- which divergence each estimator's gradient follows --------------------------------------


def categorical_policies(seed):
    """Float64 logits of π_θ (with gradient) and log-probs of π_ref: 3 categorical distributions
    over NUM_CATEGORIES outcomes, one per row."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, NUM_CATEGORIES, generator=generator, dtype=torch.float64).requires_grad_()
    ref_logprobs = torch.log_softmax(torch.randn(3, NUM_CATEGORIES, generator=generator, dtype=torch.float64), -1)
    return logits, ref_logprobs


def expected_loss_gradient(estimator, logits, ref_logprobs):
    """E_{o ~ π_θ}[∇_logits k(o)], the sample o held fixed as in training: the exact expectation,
    Σ_o π_θ(o) ∇k(o), by enumerating every outcome o."""
    logprobs = torch.log_softmax(logits, -1)
    per_outcome = kl_penalty(logprobs, ref_logprobs, torch.ones_like(logprobs), estimator)
    (gradient,) = torch.autograd.grad((logprobs.exp().detach() * per_outcome).sum(), logits)
    return gradient


def gradient_of(divergence, logits):
    (gradient,) = torch.autograd.grad(divergence.sum(), logits)
    return gradient


def forward_kl(logits, ref_logprobs):
    """KL(π_θ ‖ π_ref) per row."""
    logprobs = torch.log_softmax(logits, -1)
    return (logprobs.exp() * (logprobs - ref_logprobs)).sum(-1)


def reverse_kl(logits, ref_logprobs):
    """KL(π_ref ‖ π_θ) per row."""
    logprobs = torch.log_softmax(logits, -1)
    return (ref_logprobs.exp() * (ref_logprobs - logprobs)).sum(-1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k2_as_a_loss_follows_the_gradient_of_kl_from_policy_to_reference(seed):
    logits, ref_logprobs = categorical_policies(seed)
    expected = gradient_of(forward_kl(logits, ref_logprobs), logits)
    torch.testing.assert_close(expected_loss_gradient("k2", logits, ref_logprobs), expected, atol=1e-12, rtol=0)
    assert not torch.allclose(expected, gradient_of(reverse_kl(logits, ref_logprobs), logits), atol=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k3_as_a_loss_follows_the_gradient_of_kl_from_reference_to_policy(seed):
    logits, ref_logprobs = categorical_policies(seed)
    expected = gradient_of(reverse_kl(logits, ref_logprobs), logits)
    torch.testing.assert_close(expected_loss_gradient("k3", logits, ref_logprobs), expected, atol=1e-12, rtol=0)
    assert not torch.allclose(expected, gradient_of(forward_kl(logits, ref_logprobs), logits), atol=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k1_as_a_loss_has_zero_expected_gradient(seed):
    logits, ref_logprobs = categorical_policies(seed)
    gradient = expected_loss_gradient("k1", logits, ref_logprobs)
    torch.testing.assert_close(gradient, torch.zeros_like(gradient), atol=1e-12, rtol=0)


@pytest.mark.parametrize("estimator", ["k1", "k3"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k1_and_k3_values_are_unbiased_for_kl_from_policy_to_reference(estimator, seed):
    logits, ref_logprobs = categorical_policies(seed)
    logprobs = torch.log_softmax(logits, -1).detach()
    per_outcome = kl_penalty(logprobs, ref_logprobs, torch.ones_like(logprobs), estimator)
    expected = forward_kl(logits, ref_logprobs).detach()
    torch.testing.assert_close((logprobs.exp() * per_outcome).sum(-1), expected, atol=1e-12, rtol=0)


# --- k1 is refused as a penalty --------------------------------------------------------------

ALGORITHMS = {
    "PACS": lambda **options: PACS(GROUP_SIZE, max_response_length=HORIZON, **options),
    "GRPO": lambda **options: GRPO(GROUP_SIZE, max_response_length=HORIZON, **options),
    "RLOO": lambda **options: RLOO(GROUP_SIZE, max_response_length=HORIZON, **options),
    "PPO": lambda **options: PPO(GROUP_SIZE, max_response_length=HORIZON, **options),
}


@pytest.mark.parametrize("name", ALGORITHMS)
def test_k1_penalty_is_refused_explaining_why_and_naming_the_valid_estimators(name):
    expected = (
        r"kl_estimator 'k1' with kl_coef=0\.1: .*expected gradient zero .*does not regularise; "
        r"valid with kl_coef > 0: 'k2' \(follows the gradient of KL\(π_θ ‖ π_ref\)\), "
        r"'k3' \(follows the gradient of KL\(π_ref ‖ π_θ\); GRPO's default\)"
    )
    with pytest.raises(ValueError, match=expected):
        ALGORITHMS[name](kl_coef=0.1, kl_estimator="k1")


@pytest.mark.parametrize("name", ALGORITHMS)
def test_k1_without_a_penalty_is_accepted(name):
    assert "ref_logprobs" not in ALGORITHMS[name](kl_coef=0.0, kl_estimator="k1").needs


# --- padding never reaches the loss or its gradient ------------------------------------------

GARBAGE = [math.inf, -math.inf, math.nan, 1e4, -1e4]


def make_rollouts(seed=0):
    """Float64 rollouts of 2 groups, right-padded (row lengths 1 to NUM_TOKENS), mixed rewards."""
    generator = torch.Generator().manual_seed(seed)
    batch_size = 2 * GROUP_SIZE
    lengths = torch.tensor([5, 2, 1, 4, 3, 5, 2, 4])
    old_logprobs = -3 * torch.rand(batch_size, NUM_TOKENS, generator=generator, dtype=torch.float64)
    return {
        "logprobs": old_logprobs + 0.3 * torch.randn(old_logprobs.shape, generator=generator, dtype=torch.float64),
        "old_logprobs": old_logprobs,
        "ref_logprobs": old_logprobs + 0.5 * torch.randn(old_logprobs.shape, generator=generator, dtype=torch.float64),
        "values": torch.rand(batch_size, NUM_TOKENS, generator=generator, dtype=torch.float64),
        "entropy": torch.rand(batch_size, NUM_TOKENS, generator=generator, dtype=torch.float64),
        "response_mask": (torch.arange(NUM_TOKENS) < lengths[:, None]).to(torch.float64),
        "rewards": torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64),
    }


def with_padding(rollouts, value):
    """The rollouts with `value` at the padding positions of the policy's log-probs (current and
    rollout) and `-value` at those of the reference's, so that δ = log π_ref − log π_θ there is
    ±inf, nan or ±2e4."""
    padding = ~rollouts["response_mask"].bool()
    garbage = {"logprobs": value, "old_logprobs": value, "ref_logprobs": -value}
    return {name: tensor.masked_fill(padding, garbage[name]) if name in garbage else tensor for name, tensor in rollouts.items()}


@pytest.mark.parametrize("padding_value", GARBAGE)
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_penalty_is_zero_with_zero_gradient_at_padding(estimator, padding_value):
    clean = make_rollouts()
    rollouts = with_padding(clean, padding_value)
    mask = clean["response_mask"]
    results = []
    for rows in (clean, rollouts):
        logprobs = rows["logprobs"].clone().requires_grad_()
        kl = kl_penalty(logprobs, rows["ref_logprobs"], mask, estimator)
        (gradient,) = torch.autograd.grad(kl.sum(), logprobs)
        results.append((kl, gradient))
    (clean_kl, clean_gradient), (kl, gradient) = results
    assert torch.equal(kl, clean_kl) and torch.equal(gradient, clean_gradient)
    assert torch.equal(kl[~mask.bool()], torch.zeros(int((~mask.bool()).sum()), dtype=torch.float64))


def regularised_loss_and_gradient(algorithm, rows):
    """One update of `algorithm` on the mini-batch `rows` as a single micro-batch, not the first
    after the rollout: (loss, its gradient w.r.t. the log-probs, the metrics)."""
    step = {name: tensor for name, tensor in rows.items() if name not in ("logprobs", "entropy")}
    step.update(algorithm.prepare_step(step))
    row_terms, metrics = algorithm.prepare_update(step, lambda: rows["logprobs"], False)
    logprobs = rows["logprobs"].clone().requires_grad_()
    loss = algorithm.micro_batch_loss(logprobs, {**step, "entropy": rows["entropy"]}, row_terms)
    (gradient,) = torch.autograd.grad(loss, logprobs)
    return loss, gradient, metrics


@pytest.mark.parametrize("padding_value", GARBAGE)
@pytest.mark.parametrize("estimator", ["k2", "k3"])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_regularised_update_ignores_the_logprobs_at_padding(name, estimator, padding_value):
    algorithm = ALGORITHMS[name](kl_coef=0.1, kl_estimator=estimator, entropy_coef=0.01)
    clean = make_rollouts()
    clean_loss, clean_gradient, clean_metrics = regularised_loss_and_gradient(algorithm, clean)
    loss, gradient, metrics = regularised_loss_and_gradient(algorithm, with_padding(clean, padding_value))
    assert torch.isfinite(loss) and bool(torch.isfinite(gradient).all())
    torch.testing.assert_close(loss, clean_loss, atol=1e-12, rtol=0)
    torch.testing.assert_close(gradient, clean_gradient, atol=1e-12, rtol=0)
    assert metrics == pytest.approx(clean_metrics, abs=1e-12)


# --- the KL penalty in the reward (kl_in_reward) ------------------------------------------------

REWARD_KL_ALGORITHMS = {name: ALGORITHMS[name] for name in ("GRPO", "RLOO", "PPO")}


def reward_k1(rollouts, kl_coef):
    """kl_coef · (log π_old − log π_ref) at response tokens, 0 at padding: (B, T)."""
    difference = rollouts["old_logprobs"] - rollouts["ref_logprobs"]
    return kl_coef * difference * rollouts["response_mask"]


@pytest.mark.parametrize("name", ["GRPO", "RLOO"])
def test_kl_in_reward_subtracts_the_summed_rollout_k1_from_the_reward_the_group_compares(name):
    rollouts = make_rollouts()
    penalised = ALGORITHMS[name](kl_coef=0.1, kl_estimator="k1", kl_in_reward=True)
    plain = ALGORITHMS[name]()
    rewards = rollouts["rewards"] - reward_k1(rollouts, 0.1).sum(dim=-1)
    expected = plain.prepare_step({**rollouts, "rewards": rewards})["advantages"]
    torch.testing.assert_close(penalised.prepare_step(rollouts)["advantages"], expected, atol=1e-12, rtol=0)


def test_kl_in_reward_subtracts_the_rollout_k1_from_every_tokens_reward_before_gae():
    rollouts = make_rollouts()
    mask = rollouts["response_mask"]
    token_rewards = outcome_token_rewards(rollouts["rewards"], mask) - reward_k1(rollouts, 0.1)
    expected_advantages, expected_returns = gae_advantages(token_rewards, rollouts["values"], mask)
    terms = PPO(GROUP_SIZE, max_response_length=HORIZON, kl_coef=0.1, kl_estimator="k1", kl_in_reward=True).prepare_step(rollouts)
    torch.testing.assert_close(terms["advantages"], expected_advantages, atol=1e-12, rtol=0)
    torch.testing.assert_close(terms["returns"], expected_returns, atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", REWARD_KL_ALGORITHMS)
def test_kl_in_reward_leaves_no_kl_term_in_the_loss(name):
    rollouts = make_rollouts()
    penalised = ALGORITHMS[name](kl_coef=0.1, kl_estimator="k1", kl_in_reward=True)
    step = {key: value for key, value in rollouts.items() if key not in ("logprobs", "entropy")}
    step.update(penalised.prepare_step(step))
    plain = ALGORITHMS[name]()
    gradients = []
    for algorithm in (penalised, plain):
        row_terms, _ = algorithm.prepare_update(step, lambda: rollouts["logprobs"], False)
        logprobs = rollouts["logprobs"].clone().requires_grad_()
        (gradient,) = torch.autograd.grad(algorithm.micro_batch_loss(logprobs, step, row_terms), logprobs)
        gradients.append(gradient)
    torch.testing.assert_close(gradients[0], gradients[1], atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", REWARD_KL_ALGORITHMS)
def test_kl_in_reward_needs_the_reference_and_every_rows_rollout_logprobs_at_the_step(name):
    penalised = ALGORITHMS[name](kl_coef=0.1, kl_estimator="k1", kl_in_reward=True)
    assert "ref_logprobs" in penalised.needs and not penalised.first_update_may_supply_old_logprobs
    assert ALGORITHMS[name](kl_coef=0.1).first_update_may_supply_old_logprobs


@pytest.mark.parametrize("name", REWARD_KL_ALGORITHMS)
def test_kl_in_reward_without_a_coefficient_is_refused(name):
    with pytest.raises(ValueError, match=r"kl_in_reward needs kl_coef > 0"):
        ALGORITHMS[name](kl_coef=0.0, kl_in_reward=True)
