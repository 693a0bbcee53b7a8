"""The property of docs/design.md, section 1: on the first update after a rollout, PACS (logratio proxy,
rloo score, no class weights) is RLOO, scaled by β.

Derivation. With θ = θ_old every proxy r_i = β Σ_t m_it (log π_θ − log π_old)(o_it) is 0, so ψ = 0
and ∂L/∂ψ_i = (σ(0) − R_i)/B = (½ − R_i)/B. With S_k = Σ_t m_kt log π_θ(o_kt),
ψ_i = β (S_i − 1/(n−1) Σ_{j≠i} S_j) + const, hence

    ∂L_PACS/∂S_k = β/B · [(½ − R_k) − 1/(n−1) Σ_{i≠k} (½ − R_i)]
                 = −β/B · (R_k − 1/(n−1) Σ_{i≠k} R_i) = −β/B · A^rloo_k
                   (the ½'s cancel: no factor ½, no n/(n−1))

while the RLOO policy-gradient loss L_RLOO = −1/B Σ_k A^rloo_k S_k has ∂L_RLOO/∂S_k = −A^rloo_k / B. So

    ∇_logprobs L_PACS = β · ∇_logprobs L_RLOO    exactly (the constant is β), soft rewards included.

With class weights (``question``) the errors e_i = w_i (R_i − ½) are reweighted and the identity
fails in every group whose classes are unbalanced; the last test checks that it does.
"""

from __future__ import annotations

import pytest
import torch

from pacs.algos import PACS, RLOO, pacs_loss

GROUP_SIZE = 4
NUM_TOKENS = 6


def make_on_policy_batch(*, soft_rewards=False):
    """Float64 rollouts; logprobs equal old_logprobs but carry the gradient. Groups: unbalanced
    (1 of 4 and 3 of 4 correct), all correct, all wrong, balanced."""
    generator = torch.Generator().manual_seed(0)
    rewards = torch.tensor([1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 0], dtype=torch.float64)
    if soft_rewards:
        rewards = torch.rand(rewards.shape, generator=generator, dtype=torch.float64)
    batch_size = rewards.shape[0]
    lengths = torch.randint(1, NUM_TOKENS + 1, (batch_size,), generator=generator)
    response_mask = (torch.arange(NUM_TOKENS) < lengths[:, None]).to(torch.float64)
    old_logprobs = -3 * torch.rand(batch_size, NUM_TOKENS, generator=generator, dtype=torch.float64)
    return old_logprobs.clone().requires_grad_(), old_logprobs, response_mask, rewards


def reference_rloo_loss(logprobs, response_mask, rewards, group_size):
    """L_RLOO = −1/B Σ_k A_k Σ_t m_kt log π(o_kt), A_k = R_k − mean of the others, by explicit loops."""
    batch_size = rewards.shape[0]
    loss = logprobs.new_zeros(())
    for k in range(batch_size):
        group = k // group_size
        others = [float(rewards[j]) for j in range(group * group_size, (group + 1) * group_size) if j != k]
        advantage = float(rewards[k]) - sum(others) / len(others)
        for t in range(logprobs.shape[1]):
            if response_mask[k, t]:
                loss = loss - advantage * logprobs[k, t] / batch_size
    return loss


def pacs_gradient(logprobs, old_logprobs, response_mask, rewards, beta, weighting):
    loss = pacs_loss(
        logprobs,
        old_logprobs,
        response_mask,
        rewards,
        GROUP_SIZE,
        beta=beta,
        proxy="logratio",
        estimator="rloo",
        weighting=weighting,
    )
    return torch.autograd.grad(loss, logprobs)[0]


def plugin_gradient(algorithm, logprobs, old_logprobs, response_mask, rewards):
    """The trainer's first update after a rollout: one mini-batch, micro-batches of 3 rows."""
    rows = {"old_logprobs": old_logprobs, "response_mask": response_mask, "rewards": rewards}
    rows.update(algorithm.prepare_step(rows))
    row_terms, _ = algorithm.prepare_update(rows, lambda: old_logprobs, True)
    total = 0
    for start in range(0, rewards.shape[0], 3):
        micro = {name: value[start : start + 3] for name, value in rows.items()}
        micro_terms = {name: value[start : start + 3] for name, value in row_terms.items()}
        total = total + algorithm.micro_batch_loss(logprobs[start : start + 3], micro, micro_terms)
    return torch.autograd.grad(total, logprobs)[0]


@pytest.mark.parametrize("soft_rewards", [False, True])
@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_on_policy_pacs_gradient_is_beta_times_the_rloo_gradient(beta, soft_rewards):
    logprobs, old_logprobs, response_mask, rewards = make_on_policy_batch(soft_rewards=soft_rewards)
    gradient = pacs_gradient(logprobs, old_logprobs, response_mask, rewards, beta, "none")
    rloo = reference_rloo_loss(logprobs, response_mask, rewards, GROUP_SIZE)
    (rloo_gradient,) = torch.autograd.grad(rloo, logprobs)
    assert rloo_gradient.abs().max() > 0.01
    torch.testing.assert_close(gradient, beta * rloo_gradient, atol=1e-12, rtol=0)


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_on_policy_pacs_plugin_gradient_is_beta_times_the_rloo_plugin_gradient(beta):
    """The same identity through both trainer plug-ins; RLOO with ``seq-mean-token-sum`` is
    L_RLOO on-policy (ρ = 1, ∇ρ = ∇log π)."""
    batch = make_on_policy_batch()
    pacs = plugin_gradient(PACS(GROUP_SIZE, beta=beta, weighting="none"), *batch)
    rloo = plugin_gradient(RLOO(GROUP_SIZE, max_response_length=NUM_TOKENS, loss_agg="seq-mean-token-sum"), *batch)
    (expected,) = torch.autograd.grad(reference_rloo_loss(batch[0], batch[2], batch[3], GROUP_SIZE), batch[0])
    torch.testing.assert_close(rloo, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(pacs, beta * rloo, atol=1e-12, rtol=0)


def test_class_weights_break_the_identity_in_unbalanced_groups():
    logprobs, old_logprobs, response_mask, rewards = make_on_policy_batch()
    gradient = pacs_gradient(logprobs, old_logprobs, response_mask, rewards, 1.0, "question")
    (rloo_gradient,) = torch.autograd.grad(reference_rloo_loss(logprobs, response_mask, rewards, GROUP_SIZE), logprobs)
    difference = (gradient - rloo_gradient).abs()
    assert difference[: 2 * GROUP_SIZE].max() > 0.01  # the unbalanced groups differ
    assert difference[2 * GROUP_SIZE :].max() < 1e-12  # all-correct, all-wrong and balanced groups agree
