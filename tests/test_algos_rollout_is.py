"""Specification of the truncated importance-sampling correction of the sampler mismatch
(`algorithm.rollout_is_cap`): the weights' formula, and how they enter PACS's loss and the
clipped policy gradient, checked in float64 against loops written from the formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from pacs.algos.core import truncated_is_weights
from pacs.algos.grpo import GRPO
from pacs.algos.pacs import PACS

GROUP_SIZE, GROUPS, TOKENS, CAP, BETA = 4, 3, 6, 2.0, 1.5


def mismatched_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    """float64: π_old's and the sampler μ's log-probs of the same tokens, differing by up to ±0.4
    per token (responses whose ratio exceeds the cap, and others below 1), rewards 0/1 with one
    group all correct."""
    generator = torch.Generator().manual_seed(seed)
    rows = GROUPS * GROUP_SIZE
    old = -3 * torch.rand(rows, TOKENS, generator=generator, dtype=torch.float64)
    sampler = old + 0.8 * (torch.rand(rows, TOKENS, generator=generator, dtype=torch.float64) - 0.5)
    mask = (torch.rand(rows, TOKENS, generator=generator) < 0.7).to(torch.float64)
    mask[:, 0] = 1
    rewards = torch.randint(2, (rows,), generator=generator).to(torch.float64)
    rewards[:GROUP_SIZE] = 1
    return {"old_logprobs": old, "sampler_logprobs": sampler, "response_mask": mask, "rewards": rewards}


def test_weights_are_the_truncated_ratio_of_each_token_and_of_each_response():
    batch = mismatched_batch()
    per_token = truncated_is_weights(batch["old_logprobs"], batch["sampler_logprobs"], batch["response_mask"], CAP, per_response=False)
    per_response = truncated_is_weights(batch["old_logprobs"], batch["sampler_logprobs"], batch["response_mask"], CAP, per_response=True)
    for i in range(len(batch["rewards"])):
        product = 1.0
        for t in range(TOKENS):
            ratio = math.exp(batch["old_logprobs"][i, t] - batch["sampler_logprobs"][i, t])
            masked = batch["response_mask"][i, t] == 1
            assert per_token[i, t].item() == pytest.approx(min(ratio, CAP) if masked else 0.0, abs=1e-15)
            product *= ratio if masked else 1.0
        assert per_response[i].item() == pytest.approx(min(product, CAP), rel=1e-13)
    assert (per_response == CAP).any() and (per_response < 1).any()


def reference_weighted_pacs_loss(logprobs, batch) -> torch.Tensor:
    """L = 1/B Σ_i ρ_i w_i BCE(ψ_i, R_i) with logratio proxies, leave-one-out scores and question
    weights, one response at a time."""
    old, mask, rewards = batch["old_logprobs"], batch["response_mask"], batch["rewards"]
    proxies = [BETA * ((logprobs[i] - old[i]) * mask[i]).sum() for i in range(len(rewards))]
    terms = []
    for i in range(len(rewards)):
        group = range(i - i % GROUP_SIZE, i - i % GROUP_SIZE + GROUP_SIZE)
        score = proxies[i] - sum(proxies[j] for j in group if j != i) / (GROUP_SIZE - 1)
        labels = [rewards[j].item() for j in group]
        classes = set(labels)
        weight = GROUP_SIZE / (len(classes) * labels.count(rewards[i].item())) if len(classes) > 1 else 1.0
        ratio = math.exp(sum((old[i, t] - batch["sampler_logprobs"][i, t]).item() for t in range(TOKENS) if mask[i, t] == 1))
        label = rewards[i]
        bce = -(label * F.logsigmoid(score) + (1 - label) * F.logsigmoid(-score))
        terms.append(min(ratio, CAP) * weight * bce)
    return sum(terms) / len(rewards)


def test_pacs_scales_each_responses_bce_term_by_its_truncated_weight():
    batch = mismatched_batch()
    algorithm = PACS(GROUP_SIZE, beta=BETA, rollout_is_cap=CAP)
    assert "sampler_logprobs" in algorithm.needs and not algorithm.first_update_may_supply_old_logprobs
    minibatch = {**batch, **algorithm.prepare_step(batch)}
    generator = torch.Generator().manual_seed(1)
    logprobs = (batch["old_logprobs"] + 0.3 * torch.randn(batch["old_logprobs"].shape, generator=generator, dtype=torch.float64)).requires_grad_()
    row_terms, metrics = algorithm.prepare_update(minibatch, lambda: logprobs.detach(), policy_is_rollout_policy=False)
    (gradient,) = torch.autograd.grad(algorithm.micro_batch_loss(logprobs, minibatch, row_terms), logprobs)
    expected = reference_weighted_pacs_loss(logprobs, batch)
    (expected_gradient,) = torch.autograd.grad(expected, logprobs)
    assert metrics["loss"] == pytest.approx(expected.item(), abs=1e-12)
    torch.testing.assert_close(gradient, expected_gradient, atol=1e-12, rtol=0)
    unweighted, _ = PACS(GROUP_SIZE, beta=BETA).prepare_update(batch, lambda: logprobs.detach(), policy_is_rollout_policy=False)
    assert not torch.allclose(unweighted["proxy_grad"], row_terms["proxy_grad"])


def test_the_policy_gradient_scales_each_tokens_surrogate_by_its_truncated_weight():
    batch = mismatched_batch()
    corrected, plain = GRPO(GROUP_SIZE, horizon=TOKENS, rollout_is_cap=CAP), GRPO(GROUP_SIZE, horizon=TOKENS)
    generator = torch.Generator().manual_seed(1)
    logprobs = batch["old_logprobs"] + 0.05 * torch.randn(batch["old_logprobs"].shape, generator=generator, dtype=torch.float64)
    losses = {}
    for name, algorithm in (("corrected", corrected), ("plain", plain)):
        minibatch = {**batch, **algorithm.prepare_step(batch)}
        per_token, _ = algorithm._policy_loss(logprobs, minibatch)
        losses[name] = per_token
    weights = truncated_is_weights(batch["old_logprobs"], batch["sampler_logprobs"], batch["response_mask"], CAP, per_response=False)
    torch.testing.assert_close(losses["corrected"], losses["plain"] * weights, atol=1e-15, rtol=0)


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="rollout_is_cap must be None .* or a finite number >= 1, got 0.5"):
        PACS(GROUP_SIZE, rollout_is_cap=0.5)
