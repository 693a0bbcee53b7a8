"""Specification of GRPO (pacs.algos.grpo), the clipped policy-gradient plug-in it shares with RLOO
and PPO (pacs.algos.pg), and the shared helpers it is built from (pacs.algos): the clipped
surrogate, loss aggregation and KL estimators."""

from __future__ import annotations

import math

import pytest
import torch

from pacs.algos import (
    GRPO,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    PPO,
    RLOO,
    aggregate_loss,
    clipped_surrogate,
    grpo_advantages,
    kl_penalty,
)

GROUP_SIZE = 4
NUM_GROUPS = 4
NUM_TOKENS = 7
HORIZON = 10
CLIP_SETTINGS = [(0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 1.5)]


# --- float64 references, straight from the formulas, one scalar at a time ----------------------


def reference_grpo_advantages(rewards, group_size, norm_by_std, eps):
    advantages = []
    for group in range(len(rewards) // group_size):
        values = [float(rewards[group * group_size + k]) for k in range(group_size)]
        mean = sum(values) / group_size
        std = math.sqrt(sum((value - mean) ** 2 for value in values) / (group_size - 1))
        advantages += [(value - mean) / (std + eps) if norm_by_std else value - mean for value in values]
    return torch.tensor(advantages, dtype=torch.float64)


def reference_token_surrogate(logprob, old_logprob, advantage, clip_low, clip_high, dual_clip):
    ratio = torch.exp(logprob - old_logprob)
    unclipped = -advantage * ratio
    if ratio < 1 - clip_low:
        clipped = -advantage * (1 - clip_low)
    elif ratio > 1 + clip_high:
        clipped = -advantage * (1 + clip_high)
    else:
        clipped = unclipped
    loss = unclipped if unclipped >= clipped else clipped
    if dual_clip is not None and advantage < 0 and -dual_clip * advantage < loss:
        loss = -dual_clip * advantage
    return loss


def reference_kl(logprob, ref_logprob, estimator):
    log_ratio = logprob - ref_logprob
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    return torch.exp(-log_ratio) + log_ratio - 1


def reference_aggregate(row_sums, row_counts, mode, num_rows, num_tokens, max_response_length):
    """row_sums[i] = Σ_t m ℓ of row i; the mini-batch loss of `mode`."""
    if mode == "token-mean":
        return sum(row_sums) / num_tokens
    if mode == "seq-mean-token-sum":
        return sum(row_sums) / num_rows
    if mode == "seq-mean-token-mean":
        return sum(total / max(count, 1) for total, count in zip(row_sums, row_counts)) / num_rows
    return sum(row_sums) / (num_rows * max_response_length)


def reference_aggregate_loss(per_token_loss, response_mask, mode, max_response_length=HORIZON):
    row_sums, row_counts = [], []
    for row in range(per_token_loss.shape[0]):
        total, count = per_token_loss.new_zeros(()), 0
        for position in range(per_token_loss.shape[1]):
            if response_mask[row, position]:
                total = total + per_token_loss[row, position]
                count += 1
        row_sums.append(total)
        row_counts.append(count)
    batch_size = per_token_loss.shape[0]
    return reference_aggregate(row_sums, row_counts, mode, batch_size, sum(row_counts), max_response_length)


def reference_policy_loss(logprobs, rows, entropy, *, options, with_entropy=True):
    """The plug-in's mini-batch loss: surrogate + KL − entropy per token, then aggregated."""
    advantages, mask = rows["advantages"], rows["response_mask"]
    kl_coef, entropy_coef = options.get("kl_coef", 0.0), options.get("entropy_coef", 0.0)
    per_token = torch.zeros_like(logprobs)
    for row in range(logprobs.shape[0]):
        for position in range(logprobs.shape[1]):
            if not mask[row, position]:
                continue
            advantage = advantages[row] if advantages.dim() == 1 else advantages[row, position]
            loss = reference_token_surrogate(
                logprobs[row, position],
                rows["old_logprobs"][row, position],
                advantage,
                options.get("clip_low", 0.2),
                options.get("clip_high", 0.2),
                options.get("dual_clip"),
            )
            if kl_coef:
                kl = reference_kl(logprobs[row, position], rows["ref_logprobs"][row, position], options["kl_estimator"])
                loss = loss + kl_coef * kl
            if entropy_coef and with_entropy:
                loss = loss - entropy_coef * entropy[row, position]
            per_token = per_token.index_put((torch.tensor(row), torch.tensor(position)), loss)
    return reference_aggregate_loss(per_token, mask, options.get("loss_agg", "seq-mean-token-sum-norm"))


# --- batches ---------------------------------------------------------------------------------


def make_batch(*, seed=0, num_groups=NUM_GROUPS):
    """Float64 rollouts with right-padded responses of ragged lengths (1 to NUM_TOKENS)."""
    generator = torch.Generator().manual_seed(seed)
    batch_size = num_groups * GROUP_SIZE
    lengths = torch.randint(1, NUM_TOKENS + 1, (batch_size,), generator=generator)
    lengths[0] = NUM_TOKENS
    response_mask = (torch.arange(NUM_TOKENS) < lengths[:, None]).to(torch.float64)
    old_logprobs = -3 * torch.rand(batch_size, NUM_TOKENS, generator=generator, dtype=torch.float64)
    shift = 0.4 * torch.randn(batch_size, NUM_TOKENS, generator=generator, dtype=torch.float64)
    rewards = torch.randint(2, (batch_size,), generator=generator).to(torch.float64)
    rewards[:GROUP_SIZE] = 1
    return {
        "old_logprobs": old_logprobs,
        "logprobs": (old_logprobs + shift).requires_grad_(),
        "ref_logprobs": old_logprobs + 0.3 * torch.randn(old_logprobs.shape, generator=generator, dtype=torch.float64),
        "values": torch.rand(batch_size, NUM_TOKENS, generator=generator, dtype=torch.float64),
        "entropy": torch.rand(batch_size, NUM_TOKENS, generator=generator, dtype=torch.float64).requires_grad_(),
        "response_mask": response_mask,
        "rewards": rewards,
    }


def micro_batches(rows, size):
    """(row slice, tensors) per micro-batch, trailing all-padding columns trimmed as the trainer does."""
    batch_size = rows["response_mask"].shape[0]
    for start in range(0, batch_size, size):
        selected = slice(start, start + size)
        width = int(rows["response_mask"][selected].any(dim=0).sum())
        yield selected, {name: value[selected] if value.dim() == 1 else value[selected, :width] for name, value in rows.items()}


def grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors, retain_graph=True, allow_unused=True, materialize_grads=True)


# --- GRPO advantages -------------------------------------------------------------------------


@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_advantages_match_reference(norm_by_std):
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.3, 0.9, 0.1, 0.5], dtype=torch.float64)
    advantages = grpo_advantages(rewards, 4, norm_by_std=norm_by_std, eps=1e-4)
    expected = reference_grpo_advantages(rewards, 4, norm_by_std, 1e-4)
    torch.testing.assert_close(advantages, expected, atol=1e-12, rtol=0)


def test_grpo_advantages_divide_by_the_unbiased_std():
    advantages = grpo_advantages(torch.tensor([1.0, 0.0]), 2, eps=1e-12)
    torch.testing.assert_close(advantages, torch.tensor([0.5, -0.5]) / math.sqrt(0.5))


def test_grpo_advantages_are_zero_in_groups_with_one_reward_value():
    advantages = grpo_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), 3)
    assert torch.equal(advantages, torch.zeros(6))


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("group_size", [3, 6, 7, 8])
def test_grpo_advantages_of_a_group_of_equal_rewards_are_exactly_zero(group_size, dtype, norm_by_std):
    """Not the rounding error of x − mean x divided by std + eps (float32, eight 0.7s: ±0.056)."""
    rewards = torch.tensor([0.7] * group_size + [1.0] + [0.0] * (group_size - 1), dtype=dtype)
    advantages = grpo_advantages(rewards, group_size, norm_by_std=norm_by_std)
    assert torch.equal(advantages[:group_size], torch.zeros(group_size, dtype=dtype))
    assert advantages[group_size] > 0


def test_grpo_advantages_of_low_precision_rewards_are_float32():
    assert grpo_advantages(torch.tensor([1.0, 0.0], dtype=torch.bfloat16), 2).dtype == torch.float32


# --- clipped surrogate -----------------------------------------------------------------------


@pytest.mark.parametrize("per_token_advantages", [False, True])
@pytest.mark.parametrize(("clip_low", "clip_high", "dual_clip"), CLIP_SETTINGS)
def test_clipped_surrogate_matches_reference(clip_low, clip_high, dual_clip, per_token_advantages):
    batch = make_batch()
    logprobs, mask = batch["logprobs"], batch["response_mask"]
    advantages = torch.randn(mask.shape if per_token_advantages else mask.shape[:1], dtype=torch.float64)
    per_token, _ = clipped_surrogate(
        logprobs, batch["old_logprobs"], advantages, mask, clip_low=clip_low, clip_high=clip_high, dual_clip=dual_clip
    )
    expected = torch.stack(
        [
            torch.stack(
                [
                    reference_token_surrogate(
                        logprobs[row, position],
                        batch["old_logprobs"][row, position],
                        advantages[row] if not per_token_advantages else advantages[row, position],
                        clip_low,
                        clip_high,
                        dual_clip,
                    )
                    for position in range(NUM_TOKENS)
                ]
            )
            for row in range(mask.shape[0])
        ]
    )
    is_response = mask.bool()
    torch.testing.assert_close(per_token[is_response], expected[is_response], atol=1e-12, rtol=0)
    weights = torch.rand(mask.shape, dtype=torch.float64) * mask
    (grad,) = grads((weights * per_token).sum(), logprobs)
    (expected_grad,) = grads((weights * expected).sum(), logprobs)
    torch.testing.assert_close(grad, expected_grad, atol=1e-12, rtol=0)


def test_clipping_zeroes_the_gradient_of_exactly_the_clipped_tokens():
    """ε_low = 0.2, ε_high = 0.3, c = 3: with A = +1 the ratios 1.5 and 5 are clipped above; with
    A = −1 the ratio 0.5 is clipped below and 5 by the dual clip (loss −c·A = 3)."""
    ratios = torch.tensor([0.5, 0.9, 1.1, 1.5, 5.0], dtype=torch.float64)
    logprobs = ratios.log().repeat(2, 1).requires_grad_()
    advantages = torch.tensor([1.0, -1.0], dtype=torch.float64)
    mask = torch.ones(2, 5, dtype=torch.float64)
    per_token, metrics = clipped_surrogate(
        logprobs, torch.zeros_like(mask), advantages, mask, clip_low=0.2, clip_high=0.3, dual_clip=3.0
    )
    expected = torch.tensor([[-0.5, -0.9, -1.1, -1.3, -1.3], [0.8, 0.9, 1.1, 1.5, 3.0]], dtype=torch.float64)
    torch.testing.assert_close(per_token, expected, atol=1e-12, rtol=0)
    (grad,) = grads(per_token.sum(), logprobs)
    clipped = torch.tensor([[False, False, False, True, True], [True, False, False, False, True]])
    assert torch.equal(grad == 0, clipped)
    assert metrics["clip_fraction"] == pytest.approx(4 / 10)


def test_without_dual_clip_a_negative_advantage_loss_grows_with_the_ratio():
    logprobs = torch.tensor([[math.log(5.0)]], dtype=torch.float64)
    per_token, metrics = clipped_surrogate(logprobs, torch.zeros_like(logprobs), torch.tensor([-1.0]), torch.ones(1, 1))
    torch.testing.assert_close(per_token, torch.tensor([[5.0]], dtype=torch.float64))
    assert metrics["clip_fraction"] == 0


def test_on_policy_surrogate_is_minus_the_advantage_with_nothing_clipped():
    batch = make_batch()
    advantages = torch.randn(batch["rewards"].shape, dtype=torch.float64)
    old_logprobs = batch["old_logprobs"]
    per_token, metrics = clipped_surrogate(old_logprobs, old_logprobs, advantages, batch["response_mask"])
    torch.testing.assert_close(per_token, -advantages[:, None].expand_as(per_token))
    assert metrics == {"clip_fraction": 0.0, "approx_kl": 0.0}


def test_approx_kl_is_the_mean_k3_estimate_over_response_tokens():
    logprobs = torch.tensor([[math.log(2.0), math.log(0.5), 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    _, metrics = clipped_surrogate(logprobs, torch.zeros_like(logprobs), torch.tensor([1.0]), mask)
    expected = ((2 - 1 - math.log(2)) + (0.5 - 1 - math.log(0.5))) / 2
    assert metrics["approx_kl"] == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("padding_value", [1e6, -1e6, math.inf, math.nan])
def test_surrogate_padding_values_change_neither_loss_nor_gradient(padding_value):
    batch = make_batch()
    mask, advantages = batch["response_mask"], torch.randn(batch["rewards"].shape, dtype=torch.float64)
    padded = torch.where(mask.bool(), batch["logprobs"].detach(), padding_value).requires_grad_()

    def loss_and_grad(logprobs):
        per_token, _ = clipped_surrogate(logprobs, batch["old_logprobs"], advantages, mask, dual_clip=3.0)
        loss = aggregate_loss(per_token, mask, "token-mean")
        return loss, grads(loss, logprobs)[0]

    loss, grad = loss_and_grad(batch["logprobs"])
    padded_loss, padded_grad = loss_and_grad(padded)
    assert torch.equal(loss, padded_loss)
    assert torch.equal(grad, padded_grad)


# --- loss aggregation ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_aggregation_matches_reference(mode):
    batch = make_batch()
    per_token = batch["logprobs"] * batch["values"]
    loss = aggregate_loss(per_token, batch["response_mask"], mode, max_response_length=HORIZON)
    expected = reference_aggregate_loss(per_token, batch["response_mask"], mode)
    torch.testing.assert_close(loss, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(grads(loss, batch["logprobs"]), grads(expected, batch["logprobs"]), atol=1e-12, rtol=0)


@pytest.mark.parametrize("micro_batch_size", [1, 3, GROUP_SIZE * NUM_GROUPS])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batch_shares_sum_to_the_mini_batch_loss(mode, micro_batch_size):
    batch = make_batch()
    mask = batch["response_mask"]
    per_token = batch["logprobs"] * batch["values"]
    totals = {"num_rows": mask.shape[0], "num_tokens": float(mask.sum()), "max_response_length": HORIZON}
    whole = aggregate_loss(per_token, mask, mode, max_response_length=HORIZON)
    shares = sum(
        aggregate_loss(micro["per_token"], micro["response_mask"], mode, **totals)
        for _, micro in micro_batches({"per_token": per_token, "response_mask": mask}, micro_batch_size)
    )
    torch.testing.assert_close(shares, whole, atol=1e-12, rtol=0)
    torch.testing.assert_close(grads(shares, batch["logprobs"]), grads(whole, batch["logprobs"]), atol=1e-12, rtol=0)


def test_seq_mean_token_sum_norm_divides_by_the_horizon_not_the_padded_width():
    per_token = torch.tensor([[1.0, 2.0, 0.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss = aggregate_loss(per_token, mask, "seq-mean-token-sum-norm", max_response_length=100)
    torch.testing.assert_close(loss, torch.tensor(7.0 / (2 * 100)))


def test_seq_mean_token_mean_averages_each_row_over_its_own_tokens():
    per_token = torch.tensor([[1.0, 3.0, 0.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(aggregate_loss(per_token, mask, "seq-mean-token-mean"), torch.tensor((2.0 + 4.0) / 2))


# --- KL estimators ---------------------------------------------------------------------------


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_kl_estimators_match_their_formulas_at_response_tokens_and_are_zero_at_padding(estimator):
    batch = make_batch()
    logprobs, ref_logprobs, mask = batch["logprobs"], batch["ref_logprobs"], batch["response_mask"]
    kl = kl_penalty(logprobs, ref_logprobs, mask, estimator)
    expected = torch.stack(
        [
            torch.stack([reference_kl(logprobs[row, t], ref_logprobs[row, t], estimator) for t in range(NUM_TOKENS)])
            for row in range(logprobs.shape[0])
        ]
    )
    expected = torch.where(mask.bool(), expected, 0.0)
    torch.testing.assert_close(kl, expected, atol=1e-12, rtol=0)


def test_kl_estimators_on_one_token():
    logprobs, ref_logprobs, mask = torch.tensor([-1.0]), torch.tensor([-2.0]), torch.ones(1)
    torch.testing.assert_close(kl_penalty(logprobs, ref_logprobs, mask, "k1"), torch.tensor([1.0]))
    torch.testing.assert_close(kl_penalty(logprobs, ref_logprobs, mask, "k2"), torch.tensor([0.5]))
    torch.testing.assert_close(kl_penalty(logprobs, ref_logprobs, mask, "k3"), torch.tensor([math.exp(-1) + 1 - 1]))


@pytest.mark.parametrize("estimator", KL_ESTIMATORS)
def test_kl_estimators_are_zero_when_the_policies_agree(estimator):
    logprobs = torch.tensor([-0.5, -3.0])
    assert torch.equal(kl_penalty(logprobs, logprobs, torch.ones(2), estimator), torch.zeros(2))


# --- the clipped policy-gradient plug-in (shared by GRPO, RLOO and PPO) ----------------------

PLUGIN_OPTIONS = [
    dict(),
    dict(loss_agg="token-mean", clip_high=0.28, kl_coef=0.1, kl_estimator="k3", entropy_coef=0.01),
    dict(loss_agg="seq-mean-token-mean", dual_clip=1.5, kl_coef=0.05, kl_estimator="k2"),
    dict(loss_agg="seq-mean-token-sum", kl_coef=0.2, kl_estimator="k2", entropy_coef=0.02),
]


@pytest.mark.parametrize("micro_batch_size", [1, 3, 8])
@pytest.mark.parametrize("options", PLUGIN_OPTIONS)
@pytest.mark.parametrize("algorithm_class", [GRPO, RLOO, PPO])
def test_plugin_micro_batches_give_the_mini_batch_loss_and_gradient(algorithm_class, options, micro_batch_size):
    """prepare_step on the step's 16 rows; the mini-batch is groups 1-2 (rows 4-11); the summed
    micro-batch losses equal the reference mini-batch loss in value and gradient."""
    batch = make_batch()
    logprobs, entropy = batch["logprobs"], batch["entropy"]
    algorithm = algorithm_class(GROUP_SIZE, max_response_length=HORIZON, **options)
    step = {name: batch[name] for name in ("old_logprobs", "response_mask", "rewards", "ref_logprobs", "values")}
    step.update(algorithm.prepare_step(step))
    rows = slice(GROUP_SIZE, 3 * GROUP_SIZE)
    minibatch = {name: value[rows] for name, value in step.items()}
    row_terms, metrics = algorithm.prepare_update(minibatch, lambda: logprobs[rows].detach(), False)
    total = 0
    for selected, micro in micro_batches({**minibatch, **row_terms}, micro_batch_size):
        width = micro["response_mask"].shape[1]
        micro_row_terms = {name: micro.pop(name) for name in row_terms}
        micro["entropy"] = entropy[rows][selected, :width]
        total = total + algorithm.micro_batch_loss(logprobs[rows][selected, :width], micro, micro_row_terms)
    expected = reference_policy_loss(logprobs[rows], minibatch, entropy[rows], options=options)
    torch.testing.assert_close(total, expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(grads(total, logprobs, entropy), grads(expected, logprobs, entropy), atol=1e-12, rtol=0)
    expected_metric = reference_policy_loss(logprobs[rows], minibatch, None, options=options, with_entropy=False)
    assert metrics["loss"] == pytest.approx(float(expected_metric.detach()), abs=1e-12)


def test_first_update_after_a_rollout_needs_no_logprob_pass():
    batch = make_batch()
    algorithm = GRPO(GROUP_SIZE, max_response_length=HORIZON)
    rows = {name: batch[name] for name in ("old_logprobs", "response_mask", "rewards")}
    rows.update(algorithm.prepare_step(rows))

    def forbidden():
        raise AssertionError("current_logprobs() called although the policy is the rollout policy")

    _, metrics = algorithm.prepare_update(rows, forbidden, True)
    on_policy_surrogate = -rows["advantages"][:, None].expand(-1, NUM_TOKENS)
    expected = reference_aggregate_loss(on_policy_surrogate, rows["response_mask"], "seq-mean-token-sum-norm")
    assert metrics["loss"] == pytest.approx(float(expected), abs=1e-12)
    assert metrics["actor/clip_fraction"] == 0 and metrics["actor/approx_kl"] == 0


def test_plugin_reports_the_fraction_of_groups_with_mixed_rewards():
    rewards = torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    rows = {"rewards": rewards, "old_logprobs": torch.zeros(8, 2), "response_mask": torch.ones(8, 2)}
    algorithm = GRPO(GROUP_SIZE, max_response_length=HORIZON)
    rows.update(algorithm.prepare_step(rows))
    _, metrics = algorithm.prepare_update(rows, lambda: rows["old_logprobs"], True)
    assert metrics["groups/mixed_fraction"] == 0.5
    assert set(metrics) == {"loss", "actor/clip_fraction", "actor/approx_kl", "advantages/mean", "groups/mixed_fraction"}


@pytest.mark.parametrize(
    ("options", "needs"),
    [
        (dict(), set()),
        (dict(kl_coef=0.1), {"ref_logprobs"}),
        (dict(entropy_coef=0.01), {"entropy"}),
        (dict(kl_coef=0.1, entropy_coef=0.01), {"ref_logprobs", "entropy"}),
    ],
)
def test_needs_lists_only_the_tensors_the_options_use(options, needs):
    assert GRPO(GROUP_SIZE, max_response_length=HORIZON, **options).needs == frozenset(needs)


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(loss_agg="mean"), r"unknown loss_agg 'mean'; valid: 'token-mean', 'seq-mean-token-sum', "),
        (dict(kl_estimator="k4"), r"unknown kl_estimator 'k4'; valid: 'k1', 'k2', 'k3'"),
        (dict(clip_low=0.0), r"clip_low must be in \(0, 1\] .*got 0.0"),
        (dict(clip_low=-0.1), r"clip_low must be in \(0, 1\] .*got -0.1"),
        (dict(clip_high=0.0), r"clip_high must be > 0 .*got 0.0"),
        (dict(clip_high=math.nan), r"clip_high must be > 0 .*got nan"),
        (dict(dual_clip=1.0), r"dual_clip must be None or a finite number > 1"),
        (dict(kl_coef=-0.1), r"kl_coef must be a finite number >= 0"),
        (dict(eps=0.0), r"eps must be a finite number > 0 \(added to the group's reward std\), got 0.0"),
        (dict(max_response_length=0), r"max_response_length must be a positive integer \(the maximum response length\), got 0"),
    ],
)
def test_invalid_options_are_rejected_naming_the_value_and_what_is_valid(options, message):
    with pytest.raises(ValueError, match=message):
        GRPO(GROUP_SIZE, **{"max_response_length": HORIZON, **options})


@pytest.mark.parametrize("clip_low", [0.0, -0.2])
def test_clipped_surrogate_rejects_non_positive_clip(clip_low):
    logprobs = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=r"clip_low must be in \(0, 1\]"):
        clipped_surrogate(logprobs, logprobs, torch.ones(1), torch.ones(1, 2), clip_low=clip_low)


def test_advantages_of_the_wrong_shape_are_rejected():
    logprobs = torch.zeros(2, 3)
    expected = r"advantages must have shape \(B,\) = \(2,\) or \(B, T\) = \(2, 3\).*got \(3,\)"
    with pytest.raises(ValueError, match=expected):
        clipped_surrogate(logprobs, logprobs, torch.ones(3), torch.ones(2, 3))


def test_unknown_kl_estimator_is_rejected():
    with pytest.raises(ValueError, match=r"unknown kl_estimator 'k0'"):
        kl_penalty(torch.zeros(2), torch.zeros(2), torch.ones(2), "k0")


def test_seq_mean_token_sum_norm_without_horizon_is_rejected():
    with pytest.raises(ValueError, match=r"'seq-mean-token-sum-norm' needs max_response_length, the maximum response length"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 3), "seq-mean-token-sum-norm")


def test_unknown_loss_aggregation_is_rejected():
    with pytest.raises(ValueError, match=r"unknown loss_agg 'sum'"):
        aggregate_loss(torch.zeros(2, 3), torch.ones(2, 3), "sum")


def test_grpo_rejects_groups_of_one():
    with pytest.raises(ValueError, match=r"GRPO needs group_size >= 2 \(responses per prompt, rollout.n\), got 1"):
        GRPO(1, max_response_length=HORIZON)
    with pytest.raises(ValueError, match=r"GRPO's group-relative advantage needs group_size >= 2"):
        grpo_advantages(torch.zeros(3), 1)
