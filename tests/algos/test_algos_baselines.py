"""Specification of the 2025 baselines (pacs.algos.dr_grpo, dapo, gspo, cispo) and DAPO's overlong
reward shaping: each plug-in's mini-batch loss and gradient, summed over micro-batches of any size,
equal a float64 reference written from its paper's formula one scalar at a time.

Their equality with TRL's and verl's own code is checked in those libraries' venvs
(tests/integrations/test_integration_trl.py, tests/integrations/test_integration_verl.py)."""

from __future__ import annotations

import math

import pytest
import torch

from pacs.algos import CISPO, DAPO, GRPO, GSPO, PACS, PPO, DrGRPO, mixed_groups, overlong_penalty

GROUP_SIZE, NUM_GROUPS, NUM_TOKENS, HORIZON = 4, 4, 7, 10


# --- float64 references, from the papers' formulas ------------------------------------------------


def group_advantages(rewards: list[float], divide_by_std: bool) -> list[float]:
    """GRPO's A_i = (R_i − mean) / (std + 1e-6) (std unbiased), or Dr. GRPO's R_i − mean."""
    advantages = []
    for start in range(0, len(rewards), GROUP_SIZE):
        group = rewards[start : start + GROUP_SIZE]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        advantages += [(r - mean) / (std + 1e-6) if divide_by_std else r - mean for r in group]
    return advantages


def clip(value, low, high):
    return torch.clamp(value, low, high)


def ppo_token_loss(logprob, old, advantage, clip_low, clip_high):
    ratio = torch.exp(logprob - old)
    return torch.maximum(-advantage * ratio, -advantage * clip(ratio, 1 - clip_low, 1 + clip_high))


def reference_loss(name: str, logprobs, rows) -> torch.Tensor:
    """The paper's mini-batch loss of `name`, one response and one token at a time."""
    mask, old = rows["response_mask"], rows["old_logprobs"]
    rewards = rows["rewards"].tolist()
    advantages = group_advantages(rewards, divide_by_std=name != "dr_grpo")
    lengths = [int(mask[i].sum()) for i in range(len(rewards))]
    total = logprobs.new_zeros(())
    for i, advantage in enumerate(advantages):
        tokens = range(lengths[i])
        if name == "dr_grpo":  # 1/(B·L_max) Σ_i Σ_t min(ρA, clip(ρ, 0.8, 1.2)A)
            total = total + sum(ppo_token_loss(logprobs[i, t], old[i, t], advantage, 0.2, 0.2) for t in tokens) / (
                len(rewards) * HORIZON
            )
        elif name == "dapo":  # 1/Σ|o| Σ_i Σ_t min(ρA, clip(ρ, 0.8, 1.28)A)
            total = total + sum(ppo_token_loss(logprobs[i, t], old[i, t], advantage, 0.2, 0.28) for t in tokens) / sum(lengths)
        elif name == "gspo":  # 1/B Σ_i min(s_i A, clip(s_i, 1 − 3e-4, 1 + 4e-4) A), s_i the geometric mean ratio
            log_s = sum(logprobs[i, t] - old[i, t] for t in tokens) / lengths[i]
            total = total + ppo_token_loss(log_s, torch.zeros(()), advantage, 3e-4, 4e-4) / len(rewards)
        else:  # cispo: 1/Σ|o| Σ_i Σ_t sg(clip(ρ, 0, 5)) A log π
            for t in tokens:
                weight = clip(torch.exp(logprobs[i, t] - old[i, t]).detach(), 0.0, 5.0)
                total = total - weight * advantage * logprobs[i, t] / sum(lengths)
    return total


# --- batches ---------------------------------------------------------------------------------------

ALGORITHMS = {"dr_grpo": DrGRPO, "dapo": DAPO, "gspo": GSPO, "cispo": CISPO}
SHIFT = {"dr_grpo": 0.3, "dapo": 0.3, "gspo": 1e-3, "cispo": 1.5}
"""How far the current policy is from the rollout policy per token: around each method's clip range."""


def make_batch(shift: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Float64 rollouts of NUM_GROUPS groups with ragged right-padded responses; every group has
    both rewards."""
    generator = torch.Generator().manual_seed(seed)
    rows = NUM_GROUPS * GROUP_SIZE
    lengths = torch.randint(1, NUM_TOKENS + 1, (rows,), generator=generator)
    mask = (torch.arange(NUM_TOKENS) < lengths[:, None]).to(torch.float64)
    old = -3 * torch.rand(rows, NUM_TOKENS, generator=generator, dtype=torch.float64)
    current = old + shift * torch.randn(rows, NUM_TOKENS, generator=generator, dtype=torch.float64)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0] * NUM_GROUPS, dtype=torch.float64)
    rewards[GROUP_SIZE : 2 * GROUP_SIZE] = torch.tensor([0.0, 0.0, 1.0, 0.0])
    return {"old_logprobs": old, "logprobs": current.requires_grad_(), "response_mask": mask, "rewards": rewards}


def plugin_loss(algorithm, batch, micro_batch_size: int) -> tuple[torch.Tensor, dict[str, float]]:
    """prepare_step, prepare_update and the micro-batch losses summed, as the trainer calls them."""
    step = {name: batch[name] for name in ("old_logprobs", "response_mask", "rewards")}
    step.update(algorithm.prepare_step(step))
    logprobs = batch["logprobs"]
    row_terms, metrics = algorithm.prepare_update(step, lambda: logprobs.detach(), False)
    total = 0
    for start in range(0, len(step["rewards"]), micro_batch_size):
        rows = slice(start, start + micro_batch_size)
        width = int(step["response_mask"][rows].any(dim=0).sum())
        micro = {name: value[rows] if value.dim() == 1 else value[rows, :width] for name, value in step.items()}
        terms = {name: value[rows] for name, value in row_terms.items()}
        total = total + algorithm.micro_batch_loss(logprobs[rows, :width], micro, terms)
    return total, metrics


def gradient(loss, tensor):
    (grad,) = torch.autograd.grad(loss, tensor, retain_graph=True)
    return grad


# --- each objective equals its paper's formula ----------------------------------------------------


@pytest.mark.parametrize("micro_batch_size", [1, 3, GROUP_SIZE * NUM_GROUPS])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_loss_and_gradient_at_any_micro_batch_size_are_the_papers(name, micro_batch_size):
    batch = make_batch(SHIFT[name])
    loss, metrics = plugin_loss(ALGORITHMS[name](GROUP_SIZE, max_response_length=HORIZON), batch, micro_batch_size)
    expected = reference_loss(name, batch["logprobs"], batch)
    torch.testing.assert_close(loss, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(gradient(loss, batch["logprobs"]), gradient(expected, batch["logprobs"]), atol=1e-12, rtol=0)
    assert metrics["loss"] == pytest.approx(expected.item(), abs=1e-12)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_batches_reach_both_sides_of_each_clip(name):
    """What lets the test above fail: some tokens (responses, for GSPO) inside the clip range and
    some outside, for each method's range."""
    batch = make_batch(SHIFT[name])
    mask = batch["response_mask"].bool()
    log_ratio = (batch["logprobs"] - batch["old_logprobs"]).detach()
    if name == "gspo":
        ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1)).exp()
        low, high = 1 - 3e-4, 1 + 4e-4
    else:
        ratio = log_ratio.exp()[mask]
        low, high = {"dr_grpo": (0.8, 1.2), "dapo": (0.8, 1.28), "cispo": (0.0, 5.0)}[name]
    inside = (ratio > low) & (ratio < high)
    assert inside.any() and (~inside).any()


def one_token_pair(ratio: float) -> dict[str, torch.Tensor]:
    """A group of two one-token responses, the right one (A > 0) at `ratio` to the rollout policy,
    the wrong one at 1."""
    return {
        "old_logprobs": torch.zeros(2, 1, dtype=torch.float64),
        "logprobs": torch.tensor([[math.log(ratio)], [0.0]], dtype=torch.float64, requires_grad=True),
        "response_mask": torch.ones(2, 1, dtype=torch.float64),
        "rewards": torch.tensor([1.0, 0.0], dtype=torch.float64),
    }


def test_dapo_clips_higher_than_grpo():
    """A token of a positive advantage at ratio 1.25 still gets DAPO's gradient (ε_high = 0.28), not GRPO's (0.2)."""
    batch = one_token_pair(1.25)
    for algorithm, moves in ((DAPO(2, max_response_length=1), True), (GRPO(2, max_response_length=1), False)):
        loss, _ = plugin_loss(algorithm, batch, 2)
        assert (gradient(loss, batch["logprobs"])[0, 0] != 0) == moves


def test_dr_grpo_advantages_are_group_centred_rewards_without_the_std():
    rows = {"rewards": torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64), "response_mask": torch.ones(4, 2)}
    advantages = DrGRPO(4, max_response_length=2).prepare_step(rows)["advantages"]
    torch.testing.assert_close(advantages, torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64))


def test_gspo_weighs_every_token_of_a_response_alike():
    """∇ of an unclipped response: −A s / |o| · Σ_t ∇log π, the same for each of its tokens."""
    batch = make_batch(1e-5)
    loss, _ = plugin_loss(GSPO(GROUP_SIZE, max_response_length=HORIZON), batch, 5)
    grad, mask = gradient(loss, batch["logprobs"]), batch["response_mask"].bool()
    for row in range(len(mask)):
        tokens = grad[row][mask[row]]
        torch.testing.assert_close(tokens, tokens[:1].expand_as(tokens), atol=1e-15, rtol=0)
    assert (grad[mask] != 0).all()


def test_cispo_keeps_the_gradient_of_tokens_beyond_the_cap():
    """PPO's clip zeroes the gradient of a ratio-10 token with A > 0; CISPO weighs it by the cap (5)."""
    batch = one_token_pair(10.0)
    loss, metrics = plugin_loss(CISPO(2, max_response_length=1), batch, 2)
    advantage = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert gradient(loss, batch["logprobs"])[0, 0].item() == pytest.approx(-5.0 * advantage / 2, rel=1e-12)
    assert metrics["actor/clip_fraction"] == 0.5


def test_cispo_refuses_a_dual_clip():
    with pytest.raises(ValueError, match="CISPO has no dual clip"):
        CISPO(4, max_response_length=8, dual_clip=3.0)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_the_first_update_reports_the_loss_before_any_old_log_prob_is_computed(name):
    """On a step's first update the trainer has no old log-probs yet (it takes them from that
    update's forward pass); the reported loss is still the loss at θ = θ_old."""
    batch = make_batch(SHIFT[name])
    algorithm = ALGORITHMS[name](GROUP_SIZE, max_response_length=HORIZON)
    old = batch["old_logprobs"]
    step = {"response_mask": batch["response_mask"], "rewards": batch["rewards"]}
    step.update(algorithm.prepare_step(step))
    _, metrics = algorithm.prepare_update(step, lambda: old, True)
    assert metrics["loss"] == pytest.approx(float(reference_loss(name, old, {**batch, "old_logprobs": old})), abs=1e-12)


# --- DAPO's overlong shaping, for every algorithm -------------------------------------------------


def test_the_overlong_penalty_is_dapos_equation_13():
    """L_max = 10, L_cache = 4: no penalty up to 6 tokens, then −(|o| − 6)/4, −1 at 10."""
    lengths = torch.tensor([0, 3, 6, 7, 9, 10])
    expected = torch.tensor([0.0, 0.0, 0.0, -0.25, -0.75, -1.0])
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4), expected)
    torch.testing.assert_close(overlong_penalty(lengths, 10, 4, penalty=0.5), expected / 2)


def test_overlong_shaping_changes_the_rewards_that_group_baselines_compare():
    """Two correct answers, one 10 tokens long: with shaping it is the worse of the two."""
    mask = (torch.arange(10) < torch.tensor([3, 10, 3, 3])[:, None]).double()
    rows = {"rewards": torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64), "response_mask": mask}
    shaped = DrGRPO(4, max_response_length=10, overlong_buffer=4).prepare_step(rows)["advantages"]
    torch.testing.assert_close(shaped, torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64))
    assert shaped[1] < shaped[0]


def test_ppo_puts_the_shaped_reward_on_the_last_token():
    mask = (torch.arange(4) < torch.tensor([4, 2])[:, None]).double()
    algorithm = PPO(1, max_response_length=4, overlong_buffer=2, overlong_penalty=0.5)
    token_rewards = algorithm.token_rewards({"rewards": torch.tensor([1.0, 1.0], dtype=torch.float64), "response_mask": mask})
    torch.testing.assert_close(token_rewards[:, [3, 1]].diagonal(), torch.tensor([0.5, 1.0], dtype=torch.float64))


def test_pacs_keeps_the_shaped_label_between_0_and_1():
    """A correct answer at the limit becomes a soft label 1 − p; an incorrect one stays 0 (not −p)."""
    mask = (torch.arange(4) < torch.tensor([4, 4, 1, 1])[:, None]).double()
    algorithm = PACS(4, max_response_length=4, overlong_buffer=2, overlong_penalty=0.6)
    labels = algorithm.labels({"rewards": torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64), "response_mask": mask})
    torch.testing.assert_close(labels, torch.tensor([0.4, 0.0, 1.0, 0.0], dtype=torch.float64))


def test_an_overlong_buffer_beyond_the_maximum_length_is_refused():
    with pytest.raises(ValueError, match="overlong_buffer=20 must not exceed the maximum response length"):
        GRPO(4, max_response_length=16, overlong_buffer=20)


def test_mixed_groups_are_those_whose_rewards_differ():
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 1.0, 0.0])
    assert mixed_groups(rewards, 2).tolist() == [False, False, False, True]
