"""Specification of the PACS objective (pacs.algos.pacs) and its shared helpers (pacs.algos)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pacs.algos import (
    ESTIMATORS,
    PACS,
    PROXIES,
    WEIGHTINGS,
    class_weights,
    group_scores,
    pacs_advantages,
    pacs_loss,
    pacs_loss_from_proxy,
    reward_proxy,
    sampler_corrected_coefficients,
)
from pacs.algos.groups import group_normalised, group_view, leave_one_out_centred
from pacs.algos.masks import masked_mean, masked_sum
from pacs.algos.pacs import GRPO_SPREAD_FLOOR, LOSS_NOTE

NUM_GROUPS = 4
NUM_TOKENS = 7


def reference_pacs_loss(logprobs, old_logprobs, response_mask, rewards, group_size, beta, proxy, estimator, weighting):
    """The PACS loss straight from the formulas, one row and one group at a time (float64)."""
    batch_size, num_tokens = logprobs.shape
    proxy_rewards = []
    for row in range(batch_size):
        total = logprobs.new_zeros(())
        token_count = 0
        for position in range(num_tokens):
            if response_mask[row, position]:
                if proxy == "logratio":
                    total = total + logprobs[row, position] - old_logprobs[row, position]
                else:
                    total = total + logprobs[row, position]
                token_count += 1
        proxy_rewards.append(beta * total if proxy == "logratio" else beta * total / token_count)

    row_losses = []
    for group in range(batch_size // group_size):
        rows = range(group * group_size, (group + 1) * group_size)
        group_proxies = [proxy_rewards[row] for row in rows]
        group_rewards = [float(rewards[row]) for row in rows]
        distinct_rewards = set(group_rewards)
        group_mean = sum(group_proxies) / group_size
        for k in range(group_size):
            if estimator == "rloo":
                others = [group_proxies[j] for j in range(group_size) if j != k]
                score = group_proxies[k] - sum(others) / (group_size - 1)
            elif estimator == "grpo":
                variance = sum((value - group_mean) ** 2 for value in group_proxies) / (group_size - 1)
                score = (group_proxies[k] - group_mean) / (torch.sqrt(variance) + 1e-6)
            else:
                score = group_proxies[k]

            label = group_rewards[k]
            if weighting == "question":
                same_class = group_rewards.count(label)
                weight = group_size / (len(distinct_rewards) * same_class) if len(distinct_rewards) > 1 else 1.0
            elif weighting == "only_positive":
                weight = 1.0 if label == 1 else 0.0
            elif weighting == "only_negative":
                weight = 1.0 if label == 0 else 0.0
            else:
                weight = 1.0

            log_p_correct = F.logsigmoid(score)
            log_p_wrong = F.logsigmoid(-score)
            row_losses.append(-weight * (label * log_p_correct + (1 - label) * log_p_wrong))
    return sum(row_losses) / batch_size


def make_batch(group_size, *, soft_rewards=False, seed=0):
    """Random float64 batch of NUM_GROUPS groups: group 0 all correct, group 1 all wrong."""
    generator = torch.Generator().manual_seed(seed)
    batch_size = NUM_GROUPS * group_size
    old_logprobs = -3 * torch.rand(batch_size, NUM_TOKENS, generator=generator, dtype=torch.float64)
    logprobs = old_logprobs + 0.3 * torch.randn(batch_size, NUM_TOKENS, generator=generator, dtype=torch.float64)
    response_mask = (torch.rand(batch_size, NUM_TOKENS, generator=generator) < 0.6).to(torch.float64)
    response_mask[torch.arange(batch_size), torch.randint(NUM_TOKENS, (batch_size,), generator=generator)] = 1
    if soft_rewards:
        rewards = torch.rand(batch_size, generator=generator, dtype=torch.float64)
    else:
        rewards = torch.randint(2, (batch_size,), generator=generator).to(torch.float64)
        rewards[group_size : 2 * group_size] = 0
    rewards[:group_size] = 1
    return logprobs.requires_grad_(), old_logprobs, response_mask, rewards


def loss_and_grad(loss_fn, logprobs, *args, **kwargs):
    loss = loss_fn(logprobs, *args, **kwargs)
    (grad,) = torch.autograd.grad(loss, logprobs)
    return loss, grad


def assert_matches_reference(group_size, proxy, estimator, weighting, *, soft_rewards=False):
    logprobs, old_logprobs, response_mask, rewards = make_batch(group_size, soft_rewards=soft_rewards)
    options = dict(beta=1.5, proxy=proxy, estimator=estimator, weighting=weighting)
    loss, grad = loss_and_grad(pacs_loss, logprobs, old_logprobs, response_mask, rewards, group_size, **options)
    expected_loss, expected_grad = loss_and_grad(
        reference_pacs_loss, logprobs, old_logprobs, response_mask, rewards, group_size, **options
    )
    assert torch.isfinite(loss)
    torch.testing.assert_close(loss, expected_loss, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=0)


# --- agreement with the reference implementation ---------------------------------------------


@pytest.mark.parametrize("group_size", [4, 5])
@pytest.mark.parametrize("weighting", WEIGHTINGS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("proxy", PROXIES)
def test_loss_and_gradient_match_reference(proxy, estimator, weighting, group_size):
    assert_matches_reference(group_size, proxy, estimator, weighting)


@pytest.mark.parametrize("weighting", ["none", "question"])
@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("proxy", PROXIES)
def test_soft_rewards_match_reference(proxy, estimator, weighting):
    assert_matches_reference(4, proxy, estimator, weighting, soft_rewards=True)


def test_building_blocks_compose_to_pacs_loss():
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    proxy_rewards = reward_proxy(logprobs, old_logprobs, response_mask, beta=2.0)
    scores = group_scores(proxy_rewards, 4)
    weights = class_weights(rewards, 4)
    by_hand = (weights * F.binary_cross_entropy_with_logits(scores, rewards, reduction="none")).mean()
    from_proxy = pacs_loss_from_proxy(proxy_rewards, rewards, 4)
    full = pacs_loss(logprobs, old_logprobs, response_mask, rewards, 4, beta=2.0)
    assert torch.equal(full, from_proxy)
    assert torch.equal(full, by_hand)


# --- reward proxy ----------------------------------------------------------------------------


def test_logratio_proxy_is_beta_times_masked_sum_of_logratios():
    logprobs = torch.tensor([[-1.0, -2.0, -4.0]])
    old_logprobs = torch.tensor([[-1.5, -1.0, -9.0]])
    response_mask = torch.tensor([[1.0, 1.0, 0.0]])
    proxy_rewards = reward_proxy(logprobs, old_logprobs, response_mask, beta=2.0)
    torch.testing.assert_close(proxy_rewards, torch.tensor([2.0 * (0.5 - 1.0)]))


def test_mean_logprob_proxy_is_beta_times_mean_over_response_tokens():
    logprobs = torch.tensor([[-1.0, -2.0, -4.0]])
    response_mask = torch.tensor([[1.0, 1.0, 0.0]])
    proxy_rewards = reward_proxy(logprobs, torch.zeros_like(logprobs), response_mask, beta=2.0, proxy="mean_logprob")
    torch.testing.assert_close(proxy_rewards, torch.tensor([2.0 * -1.5]))


@pytest.mark.parametrize("padding_value", [1e6, -1e6, math.inf, math.nan])
@pytest.mark.parametrize("proxy", PROXIES)
def test_padding_values_change_neither_loss_nor_gradient(proxy, padding_value):
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    padded = torch.where(response_mask.bool(), logprobs.detach(), padding_value).requires_grad_()
    padded_old = torch.where(response_mask.bool(), old_logprobs, -padding_value)
    loss, grad = loss_and_grad(pacs_loss, logprobs, old_logprobs, response_mask, rewards, 4, proxy=proxy)
    padded_loss, padded_grad = loss_and_grad(pacs_loss, padded, padded_old, response_mask, rewards, 4, proxy=proxy)
    assert torch.equal(loss, padded_loss)
    assert torch.equal(grad, padded_grad)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
def test_bool_and_integer_masks_give_the_same_loss_as_float_masks(mask_dtype):
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    expected = pacs_loss(logprobs, old_logprobs, response_mask, rewards, 4)
    assert torch.equal(pacs_loss(logprobs, old_logprobs, response_mask.to(mask_dtype), rewards, 4), expected)


def test_masked_mean_of_fully_masked_row_is_zero():
    values = torch.tensor([[3.0, 5.0], [7.0, 9.0]])
    mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(masked_mean(values, mask), torch.tensor([3.0, 0.0]))
    torch.testing.assert_close(masked_sum(values, mask), torch.tensor([3.0, 0.0]))


# --- group scores ----------------------------------------------------------------------------


def test_rloo_score_subtracts_mean_of_other_responses():
    proxy_rewards = torch.tensor([1.0, 2.0, 3.0, 6.0, 0.0, 0.0, 0.0, 4.0])
    scores = group_scores(proxy_rewards, 4, estimator="rloo")
    expected = torch.tensor([1 - 11 / 3, 2 - 10 / 3, 3 - 9 / 3, 6 - 6 / 3, -4 / 3, -4 / 3, -4 / 3, 4.0])
    torch.testing.assert_close(scores, expected)


def test_grpo_score_divides_centered_proxy_by_unbiased_std():
    proxy_rewards = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    unbiased_std = math.sqrt(((1.5**2) * 2 + (0.5**2) * 2) / 3)
    expected = (proxy_rewards - 2.5) / (unbiased_std + 1e-6)
    torch.testing.assert_close(group_scores(proxy_rewards, 4, estimator="grpo"), expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("group_size", [3, 6, 7, 8])
@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_scores_of_a_group_of_equal_proxy_rewards_are_exactly_zero(estimator, group_size, dtype):
    proxy_rewards = torch.tensor([0.7] * group_size + [0.5] + [0.0] * (group_size - 1), dtype=dtype)
    scores = group_scores(proxy_rewards, group_size, estimator=estimator)
    assert torch.equal(scores[:group_size], torch.zeros(group_size, dtype=dtype))
    assert scores[group_size] > 0


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_on_policy_coefficients_are_the_gradient_through_the_zero_scores(estimator):
    """At θ = θ_old every proxy is 0, so every group's scores are exactly 0, yet c = ∂L/∂r is the
    formula's: with e_i = w_i (σ(0) − R_i) / B, rloo gives c_i = n/(n−1) · (e_i − mean_group e) and
    grpo, whose spread 0 is floored at β · GRPO_SPREAD_FLOOR, c_i = (e_i − mean_group e) / β."""
    group_size = 4
    _, old_logprobs, response_mask, rewards = make_batch(group_size)
    minibatch = {"old_logprobs": old_logprobs, "response_mask": response_mask, "rewards": rewards}
    row_terms, _ = PACS(group_size, estimator=estimator).prepare_update(minibatch, None, True)
    errors = class_weights(rewards, group_size) * (0.5 - rewards) / len(rewards)
    grouped = group_view(errors, group_size)
    centred = (grouped - grouped.mean(dim=-1, keepdim=True)).reshape(-1)
    expected = centred * group_size / (group_size - 1) if estimator == "rloo" else centred / GRPO_SPREAD_FLOOR
    assert centred[: 2 * group_size].abs().max() == 0 and expected.abs().max() > 0
    torch.testing.assert_close(row_terms["proxy_grad"], expected, atol=1e-9, rtol=1e-12)


def test_naive_score_is_the_proxy_itself():
    proxy_rewards = torch.tensor([0.5, -1.0, 2.0])
    assert torch.equal(group_scores(proxy_rewards, 3, estimator="naive"), proxy_rewards)


@pytest.mark.parametrize("weighting", WEIGHTINGS)
@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_on_policy_logratio_gives_zero_scores_and_loss_of_weighted_log_2(estimator, weighting):
    _, old_logprobs, response_mask, rewards = make_batch(4)
    logprobs = old_logprobs.clone().requires_grad_()
    proxy_rewards = reward_proxy(logprobs, old_logprobs, response_mask)
    assert torch.equal(group_scores(proxy_rewards, 4, estimator=estimator), torch.zeros_like(proxy_rewards))
    loss, grad = loss_and_grad(
        pacs_loss, logprobs, old_logprobs, response_mask, rewards, 4, estimator=estimator, weighting=weighting
    )
    expected = (class_weights(rewards, 4, weighting=weighting) * math.log(2)).mean()
    torch.testing.assert_close(loss, expected, atol=1e-12, rtol=0)
    assert torch.isfinite(grad).all()


def test_naive_estimator_accepts_group_size_one():
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    loss = pacs_loss(logprobs, old_logprobs, response_mask, rewards, 1, estimator="naive")
    assert torch.isfinite(loss)


# --- class weights ---------------------------------------------------------------------------


def test_question_weights_balance_the_classes_of_a_group():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(class_weights(rewards, 4), torch.tensor([2.0, 2 / 3, 2 / 3, 2 / 3]))


def test_question_weights_count_each_distinct_soft_reward_as_a_class():
    rewards = torch.tensor([0.5, 0.5, 1.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(class_weights(rewards, 6), torch.tensor([1.0, 1.0, 2.0, 2 / 3, 2 / 3, 2 / 3]))


def test_question_weights_are_one_in_all_correct_and_all_wrong_groups():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    torch.testing.assert_close(class_weights(rewards, 3), torch.tensor([1.0] * 6 + [1.5, 0.75, 0.75]))


def test_only_positive_weights_zero_the_wrong_responses():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert torch.equal(class_weights(rewards, 2, weighting="only_positive"), torch.tensor([1.0, 0.0, 0.0, 1.0]))


def test_only_negative_weights_zero_the_correct_responses():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert torch.equal(class_weights(rewards, 2, weighting="only_negative"), torch.tensor([0.0, 1.0, 1.0, 0.0]))


def test_none_weights_are_all_ones():
    assert torch.equal(class_weights(torch.tensor([1.0, 0.0, 0.3, 0.3]), 2, weighting="none"), torch.ones(4))


def test_class_weights_carry_no_gradient():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], requires_grad=True)
    assert all(not class_weights(rewards, 4, weighting=weighting).requires_grad for weighting in WEIGHTINGS)


# --- advantages and the sampler correction --------------------------------------------------


def actor_critic_advantages(proxy_rewards, rewards, group_size):
    """A_k = e_k − 1/(n−1) · Σ_{i≠k} e_i, e_i = w_i (R_i − σ(ψ_i)), ψ the rloo score, from the
    gradient formula of the module docstring, one group and one row at a time (float64)."""
    advantages = []
    for group in range(len(rewards) // group_size):
        rows = range(group * group_size, (group + 1) * group_size)
        proxies = [float(proxy_rewards[row]) for row in rows]
        labels = [float(rewards[row]) for row in rows]
        num_classes = len(set(labels))
        errors = []
        for k in range(group_size):
            score = proxies[k] - sum(proxies[j] for j in range(group_size) if j != k) / (group_size - 1)
            weight = group_size / (num_classes * labels.count(labels[k])) if num_classes > 1 else 1.0
            errors.append(weight * (labels[k] - 1 / (1 + math.exp(-score))))
        for k in range(group_size):
            advantages.append(errors[k] - sum(errors[i] for i in range(group_size) if i != k) / (group_size - 1))
    return torch.tensor(advantages, dtype=torch.float64)


def test_advantages_are_the_actor_critic_coefficients_of_the_gradient_formula():
    group_size = 4
    logprobs, old_logprobs, response_mask, rewards = make_batch(group_size)
    proxy_rewards = reward_proxy(logprobs.detach(), old_logprobs, response_mask, beta=1.5)
    group_ids = torch.arange(len(rewards)) // group_size
    summed_loss, advantages = pacs_advantages(proxy_rewards, rewards, group_ids)
    torch.testing.assert_close(advantages, actor_critic_advantages(proxy_rewards, rewards, group_size), atol=1e-12, rtol=0)
    loss = pacs_loss_from_proxy(proxy_rewards, rewards, group_size)
    torch.testing.assert_close(summed_loss, loss * len(rewards), atol=1e-12, rtol=0)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_advantages_do_not_depend_on_where_a_groups_rows_are(estimator):
    group_size = 4
    logprobs, old_logprobs, response_mask, rewards = make_batch(group_size, soft_rewards=True)
    proxy_rewards = reward_proxy(logprobs.detach(), old_logprobs, response_mask)
    group_ids = torch.arange(len(rewards)) // group_size
    in_order = pacs_advantages(proxy_rewards, rewards, group_ids, estimator=estimator)
    shuffled = torch.randperm(len(rewards), generator=torch.Generator().manual_seed(1))
    scattered = pacs_advantages(proxy_rewards[shuffled], rewards[shuffled], 7 * group_ids[shuffled], estimator=estimator)
    torch.testing.assert_close(scattered[1], in_order[1][shuffled], atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(scattered[0], in_order[0], atol=1e-9, rtol=1e-12)


def test_advantages_of_groups_of_different_sizes_are_each_groups_own():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    proxy_rewards = torch.linspace(-0.3, 0.4, 7, dtype=torch.float64)
    group_ids = torch.tensor([5, 5, 5, 9, 9, 9, 9])
    _, advantages = pacs_advantages(proxy_rewards, rewards, group_ids)
    torch.testing.assert_close(advantages[:3], actor_critic_advantages(proxy_rewards[:3], rewards[:3], 3), atol=1e-12, rtol=0)
    torch.testing.assert_close(advantages[3:], actor_critic_advantages(proxy_rewards[3:], rewards[3:], 4), atol=1e-12, rtol=0)


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_a_group_of_one_row_is_not_scored_by_estimators_that_compare_within_a_group(estimator):
    rewards = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    summed_loss, advantages = pacs_advantages(
        torch.zeros(3, dtype=torch.float64), rewards, torch.tensor([0, 0, 1]), estimator=estimator
    )
    alone_loss, _ = pacs_advantages(torch.zeros(2, dtype=torch.float64), rewards[:2], torch.tensor([0, 0]), estimator=estimator)
    assert advantages[2] == 0 and advantages[:2].abs().min() > 0
    assert summed_loss == alone_loss


def test_the_naive_estimator_scores_a_group_of_one_row():
    _, advantages = pacs_advantages(
        torch.zeros(1, dtype=torch.float64),
        torch.ones(1, dtype=torch.float64),
        torch.zeros(1, dtype=torch.long),
        estimator="naive",
    )
    assert advantages.item() == pytest.approx(0.5)


def test_sampler_correction_scales_each_responses_whole_coefficient_by_its_own_weight():
    """From the gradient formula, in float64: with the corrected coefficients the surrogate
    1/B · Σ_k A'_k r_k(θ) has gradient ∂/∂log π(o_kt) = −β/B · ρ_k A_k m_kt; a response of weight 0
    gets none, where weighting its BCE term by ρ leaves it pushed by the others."""
    beta, group_size = 2.0, 4
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    weights = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.5, 2.0, 1.0, 0.0], dtype=torch.float64)
    old_logprobs = -torch.rand(8, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    response_mask = torch.ones(8, 5, dtype=torch.float64)
    response_mask[1, 3:] = 0
    logprobs = old_logprobs.clone().requires_grad_()
    proxy_rewards = reward_proxy(logprobs, old_logprobs, response_mask, beta=beta)
    _, advantages = pacs_advantages(proxy_rewards, rewards, torch.arange(8) // group_size)
    corrected = sampler_corrected_coefficients(advantages, weights)
    (gradient,) = torch.autograd.grad(-(corrected * proxy_rewards).sum() / 8, logprobs, retain_graph=True)
    formula = actor_critic_advantages(torch.zeros(8), rewards, group_size)
    torch.testing.assert_close(gradient, -beta / 8 * (weights * formula)[:, None] * response_mask, atol=1e-12, rtol=0)
    assert gradient[3].abs().max() == 0 and gradient[7].abs().max() == 0 and gradient[:3].abs().sum(dim=-1).min() > 0
    scores = group_scores(proxy_rewards, group_size)
    bce = F.binary_cross_entropy_with_logits(scores, rewards, reduction="none")
    bce_weighted = (weights * class_weights(rewards, group_size) * bce).mean()
    (bce_gradient,) = torch.autograd.grad(bce_weighted, logprobs)
    assert bce_gradient[3].abs().min() > 0.01


@pytest.mark.parametrize("bad_weight", [-0.5, math.inf, math.nan])
def test_sampler_correction_refuses_weights_that_are_negative_or_not_finite(bad_weight):
    with pytest.raises(ValueError, match="response_weights must be finite and >= 0"):
        sampler_corrected_coefficients(torch.ones(2), torch.tensor([1.0, bad_weight]))


# --- errors ----------------------------------------------------------------------------------


def test_batch_not_multiple_of_group_size_is_rejected_naming_both_numbers():
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    with pytest.raises(ValueError, match=r"batch size 16 is not a multiple of group_size 5"):
        pacs_loss(logprobs, old_logprobs, response_mask, rewards, 5)


@pytest.mark.parametrize("group_size", [0, -2])
def test_non_positive_group_size_is_rejected(group_size):
    with pytest.raises(ValueError, match=r"group_size must be a positive integer"):
        group_view(torch.zeros(4), group_size)


@pytest.mark.parametrize("estimator", ["rloo", "grpo"])
def test_group_size_one_is_rejected_for_estimators_that_compare_within_a_group(estimator):
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    with pytest.raises(ValueError, match=r"at least 2 responses per prompt.*rollout.n >= 2.*estimator='naive'"):
        pacs_loss(logprobs, old_logprobs, response_mask, rewards, 1, estimator=estimator)


@pytest.mark.parametrize("bad_reward", [1.5, -0.1, math.nan])
def test_rewards_outside_unit_interval_are_rejected_with_their_range(bad_reward):
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    rewards[3] = bad_reward
    with pytest.raises(ValueError, match=r"rewards must lie in \[0, 1\], got min .* and max"):
        pacs_loss(logprobs, old_logprobs, response_mask, rewards, 4)


def test_mask_shape_mismatch_is_rejected_naming_both_tensors():
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    with pytest.raises(ValueError, match=r"logprobs \(16, 7\).*response_mask \(16, 6\)"):
        pacs_loss(logprobs, old_logprobs, response_mask[:, :6], rewards, 4)


def test_rewards_of_wrong_length_are_rejected():
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    with pytest.raises(ValueError, match=r"rewards must have shape \(B,\) = \(16,\).*got \(15,\)"):
        pacs_loss(logprobs, old_logprobs, response_mask, rewards[:15], 4)


def test_logprobs_that_are_not_2d_are_rejected():
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    with pytest.raises(ValueError, match=r"logprobs must be 2-D \(B, T\), got shape \(16, 7, 1\)"):
        pacs_loss(logprobs[..., None], old_logprobs[..., None], response_mask[..., None], rewards, 4)


@pytest.mark.parametrize("beta", [math.inf, math.nan])
def test_non_finite_beta_is_rejected(beta):
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    with pytest.raises(ValueError, match=r"beta must be a finite number"):
        pacs_loss(logprobs, old_logprobs, response_mask, rewards, 4, beta=beta)


@pytest.mark.parametrize(
    ("option", "valid"),
    [
        ("proxy", "'logratio', 'mean_logprob'"),
        ("estimator", "'rloo', 'grpo', 'naive'"),
        ("weighting", "'question', 'none', 'only_positive', 'only_negative'"),
    ],
)
def test_unknown_option_is_rejected_listing_valid_names(option, valid):
    logprobs, old_logprobs, response_mask, rewards = make_batch(4)
    with pytest.raises(ValueError, match=f"unknown {option} 'foo'; valid: {valid}"):
        pacs_loss(logprobs, old_logprobs, response_mask, rewards, 4, **{option: "foo"})


def overlong_group_advantages(weighting: str, overlong_buffer: int) -> torch.Tensor:
    """(8,) first-update advantages A = −B · ∂L/∂r (float64) of the issue's group: six short correct
    answers (2 tokens), one long correct answer (7 of at most 10 tokens: with a buffer of 4 its
    label is 1 − (7 − 6)/4 = 0.75) and one short wrong answer."""
    lengths = torch.tensor([2, 2, 2, 2, 2, 2, 7, 2])
    response_mask = (torch.arange(10)[None, :] < lengths[:, None]).double()
    rewards = torch.tensor([1, 1, 1, 1, 1, 1, 1, 0], dtype=torch.float64)
    minibatch = {"old_logprobs": torch.zeros(8, 10, dtype=torch.float64), "response_mask": response_mask, "rewards": rewards}
    algorithm = PACS(8, weighting=weighting, max_response_length=10, overlong_buffer=overlong_buffer)
    row_terms, _ = algorithm.prepare_update(minibatch, None, True)
    return -8 * row_terms["proxy_grad"]


def test_overlong_shaping_under_question_weights_pushes_the_long_answer_less_than_the_short_ones():
    """Class weights from the unshaped outcomes (7 correct: 4/7 each, 1 wrong: 4): e = w (Y' − 1/2)
    is 2/7 short, 1/7 long, −2 wrong, and A_k = e_k − mean_{i≠k} e_i."""
    advantages = overlong_group_advantages("question", overlong_buffer=4)
    expected = torch.tensor([17 / 49] * 6 + [9 / 49, -111 / 49], dtype=torch.float64)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_overlong_shaping_only_ever_lowers_the_long_answers_push(weighting):
    unshaped = overlong_group_advantages(weighting, overlong_buffer=0)
    shaped = overlong_group_advantages(weighting, overlong_buffer=4)
    assert shaped[6] <= shaped[0] + 1e-12
    assert shaped[6] <= unshaped[6] + 1e-12


def test_class_weights_count_the_outcomes_given_not_the_soft_labels():
    proxy_rewards = 0.3 * torch.arange(4, dtype=torch.float64)
    labels = torch.tensor([1.0, 1.0, 0.75, 0.0], dtype=torch.float64)
    outcomes = torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    loss = pacs_loss_from_proxy(proxy_rewards, labels, 4, outcomes=outcomes)
    weights = class_weights(outcomes, 4)
    scores = group_scores(proxy_rewards, 4)
    expected = (weights * F.binary_cross_entropy_with_logits(scores, labels, reduction="none")).mean()
    torch.testing.assert_close(loss, expected, atol=1e-15, rtol=0)


@pytest.mark.parametrize("beta", [0.5, 2.0])
def test_the_grpo_score_at_zero_proxy_is_rloos_first_update_rescaled_not_a_million_times_it(beta):
    """Floored at β · s₀, (r − mean r)/(β s₀) = (n − 1)/n · ψ_rloo/(β s₀) while the spread is below
    the floor, so at r = 0 the coefficients are rloo's times (n − 1)/(n β s₀) (the authors'
    formula: times (n − 1)/n / 1e-6)."""
    group_size = 4
    _, old_logprobs, response_mask, rewards = make_batch(group_size)
    minibatch = {"old_logprobs": old_logprobs, "response_mask": response_mask, "rewards": rewards}
    grpo, _ = PACS(group_size, estimator="grpo", beta=beta).prepare_update(minibatch, None, True)
    rloo, _ = PACS(group_size, estimator="rloo", beta=beta).prepare_update(minibatch, None, True)
    scale = (group_size - 1) / (group_size * beta * GRPO_SPREAD_FLOOR)
    torch.testing.assert_close(grpo["proxy_grad"], scale * rloo["proxy_grad"], atol=1e-15, rtol=1e-12)
    assert grpo["proxy_grad"].abs().max() <= rloo["proxy_grad"].abs().max() / beta


def test_the_grpo_score_is_the_authors_formula_once_the_spread_exceeds_the_floor():
    proxy_rewards = torch.tensor([0.0, 1.0, 3.0, 6.0, 0.1, 0.2, 0.1, 0.3], dtype=torch.float64)
    floored = group_scores(proxy_rewards, 4, estimator="grpo", spread_floor=1.0)
    authors = group_scores(proxy_rewards, 4, estimator="grpo")
    assert torch.equal(floored[:4], authors[:4])
    centred = group_view(proxy_rewards, 4)[1] - group_view(proxy_rewards, 4)[1].mean()
    torch.testing.assert_close(floored[4:], centred / 1.0, atol=1e-15, rtol=0)


def test_the_authors_grpo_score_without_the_std_is_the_rloo_score_scaled_by_n_minus_1_over_n():
    """norm_adv_by_std_in_grpo=False: r_i − mean_j r_j = (n − 1)/n · ψ_rloo (docs/paper-fidelity.md)."""
    proxy_rewards = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    unnormalised = group_normalised(proxy_rewards, 6, divide_by_std=False, eps=0.0)
    torch.testing.assert_close(unnormalised, 5 / 6 * leave_one_out_centred(proxy_rewards, 6), atol=1e-14, rtol=0)


def test_the_loss_note_promises_ln_2_on_the_first_update_only_against_the_rollout_reference():
    """Against a fixed reference the first update's ψ is the policy's log-ratio to it, not 0, so
    its loss is not ln 2; the note says which reference the ln 2 holds for."""
    group_size = 4
    logprobs, old_logprobs, response_mask, rewards = make_batch(group_size)
    minibatch = {
        "old_logprobs": old_logprobs,
        "ref_logprobs": logprobs.detach(),
        "response_mask": response_mask,
        "rewards": rewards,
    }
    _, fixed = PACS(group_size, pacs_reference="fixed").prepare_update(minibatch, None, True)
    _, rollout = PACS(group_size).prepare_update(minibatch, None, True)
    assert rollout["loss"] == pytest.approx(math.log(2), abs=1e-12)
    assert abs(fixed["loss"] - math.log(2)) > 1e-3
    assert "pacs_reference=rollout" in LOSS_NOTE and "pacs_reference=fixed" in LOSS_NOTE


def test_beta_leaves_the_grpo_loss_unchanged_and_a_run_that_sets_it_is_told():
    torch.manual_seed(0)
    logprobs, old_logprobs = torch.randn(8, 5, dtype=torch.float64), torch.randn(8, 5, dtype=torch.float64)
    mask, rewards = torch.ones(8, 5), torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    losses = [
        pacs_loss(logprobs, old_logprobs, mask, rewards, 4, beta=beta, estimator="grpo", spread_floor=beta * GRPO_SPREAD_FLOOR)
        for beta in (1.0, 2.0)
    ]
    assert math.isclose(losses[0].item(), losses[1].item(), rel_tol=1e-5)
    assert "algorithm.beta=2 has no effect with algorithm.estimator='grpo'" in PACS(4, beta=2.0, estimator="grpo").startup_note
    assert PACS(4, beta=2.0, estimator="rloo").startup_note == LOSS_NOTE == PACS(4, estimator="grpo").startup_note
