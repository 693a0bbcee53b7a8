"""Specification of the importance-sampling correction of the sampler mismatch
(`algorithm.rollout_is_cap`, `rollout_is_mode` truncate or mask, `rollout_is_level` token or
sequence, `rollout_is_floor`): the weights' formula, how they enter PACS's gradient (each
response's whole coefficient times its own weight) and the clipped policy gradient (each token's
clipped surrogate times its token's or its response's weight), and the diagnostics, checked in
float64 against loops written from the formulas."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from pacs.algos.grpo import GRPO
from pacs.algos.importance import ESS_WARNING_BELOW, rollout_is_weights, sampler_correction_metrics, sampler_correction_sums
from pacs.algos.pacs import PACS, pacs_advantages

GROUP_SIZE, GROUPS, TOKENS, CAP, BETA = 4, 3, 6, 2.0, 1.5


def bounded(ratio: float, mode: str, cap: float = CAP, floor: float | None = None) -> float:
    """A ratio's weight, from the formula: min(ρ, C) truncated; ρ inside [F, C] (F = 1/C unless
    given), else 0, masked."""
    if mode == "truncate":
        return min(ratio, cap)
    return ratio if (1 / cap if floor is None else floor) <= ratio <= cap else 0.0


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


def weights_of(batch, mode: str = "truncate", level: str = "token", cap: float = CAP, floor: float | None = None):
    return rollout_is_weights(
        batch["old_logprobs"], batch["sampler_logprobs"], batch["response_mask"], cap, mode=mode, level=level, floor=floor
    )


@pytest.mark.parametrize(("mode", "token_cap", "floor"), [("truncate", CAP, None), ("mask", 1.2, None), ("mask", 1.2, 0.9)])
def test_weights_are_the_bounded_ratio_of_each_token_and_of_each_response(mode, token_cap, floor):
    """Token ratios lie within e^±0.4: the token cases that mask need a cap (and floor) inside that."""
    batch = mismatched_batch()
    per_token = weights_of(batch, mode, "token", token_cap, floor)
    per_response = weights_of(batch, mode, "sequence", CAP, floor)
    assert per_token.shape == batch["old_logprobs"].shape and per_response.shape == batch["rewards"].shape
    for i in range(len(batch["rewards"])):
        product = 1.0
        for t in range(TOKENS):
            ratio = math.exp(batch["old_logprobs"][i, t] - batch["sampler_logprobs"][i, t])
            in_response = batch["response_mask"][i, t] == 1
            expected = bounded(ratio, mode, token_cap, floor) if in_response else 0.0
            assert per_token[i, t].item() == pytest.approx(expected, abs=1e-15)
            product *= ratio if in_response else 1.0
        assert per_response[i].item() == pytest.approx(bounded(product, mode, CAP, floor), rel=1e-13)
    if mode == "truncate":
        assert (per_response == CAP).any() and (per_response < 1).any()
    else:  # some responses and tokens kept, some masked above the cap, or below the floor
        assert (per_response == 0).any() and (per_response > 0).any()
        assert ((per_token == 0) & (batch["response_mask"] == 1)).any() and (per_token > 0).any()


def test_a_masked_ratio_too_large_for_the_dtype_is_zero_not_nan():
    """ρ = e^1000 overflows to inf; the mask is decided on log ρ, so the weight is 0 (never inf · 0)."""
    old, sampler, mask = torch.tensor([[500.0, 500.0]]), torch.zeros(1, 2), torch.ones(1, 2)
    for level in ("token", "sequence"):
        weights = rollout_is_weights(old, sampler, mask, CAP, mode="mask", level=level)
        assert torch.equal(weights, torch.zeros_like(weights))


def reference_pacs_loss(proxies, rewards) -> torch.Tensor:
    """L = 1/B Σ_i w_i BCE(ψ_i, R_i) of given proxies, leave-one-out scores and question weights,
    one response at a time."""
    terms = []
    for i in range(len(rewards)):
        group = range(i - i % GROUP_SIZE, i - i % GROUP_SIZE + GROUP_SIZE)
        score = proxies[i] - sum(proxies[j] for j in group if j != i) / (GROUP_SIZE - 1)
        labels = [rewards[j].item() for j in group]
        classes = set(labels)
        weight = GROUP_SIZE / (len(classes) * labels.count(rewards[i].item())) if len(classes) > 1 else 1.0
        label = rewards[i]
        terms.append(weight * -(label * F.logsigmoid(score) + (1 - label) * F.logsigmoid(-score)))
    return sum(terms) / len(rewards)


def reference_corrected_gradient(logprobs, batch, mode: str) -> torch.Tensor:
    """∇ w.r.t. the log-probs of 1/B Σ_k w_k c_k r_k(θ), c_k = ∂L/∂r_k (`reference_pacs_loss`) and
    w_k the bounded ratio Π_t π_old(o_kt)/μ(o_kt) (`bounded`), from the module docstring's
    formula, loop by loop."""
    old, mask, rewards = batch["old_logprobs"], batch["response_mask"], batch["rewards"]
    proxies = [(BETA * ((logprobs[i] - old[i]) * mask[i]).sum()).detach().requires_grad_() for i in range(len(rewards))]
    coefficients = torch.autograd.grad(reference_pacs_loss(proxies, rewards), proxies)
    gradient = torch.zeros_like(logprobs)
    for k in range(len(rewards)):
        ratio = math.exp(sum((old[k, t] - batch["sampler_logprobs"][k, t]).item() for t in range(TOKENS) if mask[k, t] == 1))
        gradient[k] = bounded(ratio, mode) * coefficients[k] * BETA * mask[k]
    return gradient


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_pacs_scales_each_responses_whole_coefficient_by_its_bounded_weight(mode):
    batch = mismatched_batch()
    algorithm = PACS(GROUP_SIZE, beta=BETA, rollout_is_cap=CAP, rollout_is_mode=mode)
    assert "sampler_logprobs" in algorithm.needs
    minibatch = {**batch, **algorithm.prepare_step(batch)}
    generator = torch.Generator().manual_seed(1)
    logprobs = (
        batch["old_logprobs"] + 0.3 * torch.randn(batch["old_logprobs"].shape, generator=generator, dtype=torch.float64)
    ).requires_grad_()
    row_terms, metrics = algorithm.prepare_update(minibatch, lambda: logprobs.detach(), policy_is_rollout_policy=False)
    (gradient,) = torch.autograd.grad(algorithm.micro_batch_loss(logprobs, minibatch, row_terms), logprobs)
    proxies = [
        BETA * ((logprobs[i] - batch["old_logprobs"][i]) * batch["response_mask"][i]).sum() for i in range(len(batch["rewards"]))
    ]
    assert metrics["loss"] == pytest.approx(reference_pacs_loss(proxies, batch["rewards"]).item(), abs=1e-12)
    torch.testing.assert_close(gradient, reference_corrected_gradient(logprobs.detach(), batch, mode), atol=1e-12, rtol=0)
    weights = minibatch["rollout_is_weight"]
    assert (weights == (CAP if mode == "truncate" else 0)).any() and ((weights > 0) & (weights < 1)).any()


def test_a_response_of_weight_zero_gets_coefficient_zero():
    """The example of issue 43, at θ = θ_old (r = 0, σ(ψ) = 1/2): rewards [1, 1, 1, 0] give class
    weights [2/3, 2/3, 2/3, 2], errors e = [1/3, 1/3, 1/3, −1] and A = e_k − mean_{i≠k} e_i =
    [4/9, 4/9, 4/9, −4/3]; ∂L/∂r = −A/B with B = 4, times ρ = [1, 1, 1, 0]. Weighting the BCE
    terms by ρ instead gave [−1/36, −1/36, −1/36, +1/12]."""
    algorithm = PACS(GROUP_SIZE, rollout_is_cap=CAP)
    minibatch = {
        "old_logprobs": torch.zeros(4, 3, dtype=torch.float64),
        "response_mask": torch.ones(4, 3, dtype=torch.float64),
        "rewards": torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64),
        "rollout_is_weight": torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64),
    }
    row_terms, _ = algorithm.prepare_update(minibatch, lambda: minibatch["old_logprobs"], policy_is_rollout_policy=True)
    expected = torch.tensor([-1 / 9, -1 / 9, -1 / 9, 0.0], dtype=torch.float64)
    torch.testing.assert_close(row_terms["proxy_grad"], expected, atol=1e-15, rtol=0)
    assert row_terms["proxy_grad"][3] == 0


@pytest.mark.parametrize("ratio", [3.0, 0.25])
def test_a_response_masked_above_the_cap_or_below_the_floor_gets_coefficient_zero(ratio):
    """The same example with the weights made by mask mode from the log-probs: the last response's
    ratio (3 > C = 2, or 1/4 < F = 1/C = 1/2) masks it, the others' ratio 1 keeps them, so
    ∂L/∂r = [−1/9, −1/9, −1/9, 0] (truncating would have kept it at weight min(ρ, 2))."""
    algorithm = PACS(GROUP_SIZE, rollout_is_cap=CAP, rollout_is_mode="mask")
    old_logprobs = torch.full((4, 3), -1.0, dtype=torch.float64)
    sampler_logprobs = old_logprobs.clone()
    sampler_logprobs[3, 0] -= math.log(ratio)
    batch = {
        "old_logprobs": old_logprobs, "sampler_logprobs": sampler_logprobs,
        "response_mask": torch.ones(4, 3, dtype=torch.float64), "rewards": torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64),
    }  # fmt: skip
    minibatch = {**batch, **algorithm.prepare_step(batch)}
    torch.testing.assert_close(minibatch["rollout_is_weight"], torch.tensor([1.0, 1.0, 1.0, 0.0], dtype=torch.float64))
    row_terms, _ = algorithm.prepare_update(minibatch, lambda: old_logprobs, policy_is_rollout_policy=True)
    expected = torch.tensor([-1 / 9, -1 / 9, -1 / 9, 0.0], dtype=torch.float64)
    torch.testing.assert_close(row_terms["proxy_grad"], expected, atol=1e-15, rtol=0)
    assert row_terms["proxy_grad"][3] == 0


@pytest.mark.parametrize(("mode", "level"), [("truncate", "token"), ("truncate", "sequence"), ("mask", "sequence")])
def test_the_policy_gradient_scales_each_tokens_surrogate_by_its_tokens_or_its_responses_weight(mode, level):
    batch = mismatched_batch()
    options = {"rollout_is_cap": CAP, "rollout_is_mode": mode, "rollout_is_level": level}
    corrected, plain = GRPO(GROUP_SIZE, max_response_length=TOKENS, **options), GRPO(GROUP_SIZE, max_response_length=TOKENS)
    generator = torch.Generator().manual_seed(1)
    logprobs = batch["old_logprobs"] + 0.05 * torch.randn(batch["old_logprobs"].shape, generator=generator, dtype=torch.float64)
    losses = {}
    for name, algorithm in (("corrected", corrected), ("plain", plain)):
        minibatch = {**batch, **algorithm.prepare_step(batch)}
        per_token, _ = algorithm._policy_loss(logprobs, minibatch)
        losses[name] = per_token
    weights = weights_of(batch, mode, level)
    per_token_weights = weights if level == "token" else weights[:, None].expand(-1, TOKENS)
    torch.testing.assert_close(losses["corrected"], losses["plain"] * per_token_weights, atol=1e-15, rtol=0)
    if mode == "mask":  # a masked response loses every token's surrogate
        assert (weights == 0).any() and (losses["corrected"][weights == 0] == 0).all()


@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize(("per_response", "cap"), [(True, CAP), (False, 1.2)])  # token ratios lie within e^±0.4
def test_the_diagnostics_are_the_weights_statistics_over_responses_or_tokens(per_response, cap, mode):
    """Mean and ESS of the applied weights, the largest ratio before truncation or masking, the
    fractions truncated (above the cap, kept at it) and masked (weight 0), and the k3 estimate of
    KL(μ ‖ π_old) per token, from loops over the units (responses at the sequence level, response
    tokens at the token level)."""
    batch = mismatched_batch()
    old, sampler, mask = batch["old_logprobs"], batch["sampler_logprobs"], batch["response_mask"]
    weights = rollout_is_weights(old, sampler, mask, cap, mode=mode, level="sequence" if per_response else "token")
    ratios, kl_terms = [], []
    for i in range(len(batch["rewards"])):
        token_ratios = [math.exp(old[i, t] - sampler[i, t]) for t in range(TOKENS) if mask[i, t] == 1]
        kl_terms += [r - math.log(r) - 1 for r in token_ratios]
        ratios += [math.prod(token_ratios)] if per_response else token_ratios
    applied = [bounded(ratio, mode, cap) for ratio in ratios]
    halves = [slice(0, 6), slice(6, None)]  # two processes' shares, summed as the trainer sums them
    parts = [sampler_correction_sums(weights[rows], old[rows], sampler[rows], mask[rows], cap) for rows in halves]
    metrics = sampler_correction_metrics(parts[0][0] + parts[1][0], max(parts[0][1], parts[1][1]))
    assert metrics["rollout_is/weight_mean"] == pytest.approx(sum(applied) / len(applied), rel=1e-12)
    assert metrics["rollout_is/ratio_max"] == pytest.approx(max(ratios), rel=1e-12)
    outside = sum(not 1 / cap <= r <= cap for r in ratios) / len(ratios)
    if mode == "truncate":
        assert metrics["rollout_is/truncated_fraction"] == sum(r > cap for r in ratios) / len(ratios) > 0
        assert metrics["rollout_is/masked_fraction"] == 0
    else:
        assert metrics["rollout_is/truncated_fraction"] == 0 and metrics["rollout_is/masked_fraction"] == outside > 0
    ess = sum(applied) ** 2 / (len(applied) * sum(w * w for w in applied))
    assert metrics["rollout_is/ess"] == pytest.approx(ess, rel=1e-12) and 0 < ess < 1
    assert metrics["rollout_is/sampler_kl"] == pytest.approx(sum(kl_terms) / len(kl_terms), rel=1e-12)


def test_without_mismatch_every_weight_is_one_and_nothing_is_lost():
    batch = mismatched_batch()
    old, mask = batch["old_logprobs"], batch["response_mask"]
    for mode in ("truncate", "mask"):
        weights = rollout_is_weights(old, old, mask, CAP, mode=mode, level="sequence")
        metrics = sampler_correction_metrics(*sampler_correction_sums(weights, old, old, mask, CAP))
        assert metrics == {
            "rollout_is/weight_mean": 1.0,
            "rollout_is/ratio_max": 1.0,
            "rollout_is/truncated_fraction": 0.0,
            "rollout_is/masked_fraction": 0.0,
            "rollout_is/ess": 1.0,
            "rollout_is/sampler_kl": 0.0,
        }


def test_a_cap_below_one_is_refused():
    with pytest.raises(ValueError, match="rollout_is_cap must be None .* or a finite number >= 1, got 0.5"):
        PACS(GROUP_SIZE, rollout_is_cap=0.5)


def test_pacs_refuses_the_token_level_naming_the_valid_one():
    with pytest.raises(ValueError, match="rollout_is_level='token' is not valid here; valid: 'sequence'"):
        PACS(GROUP_SIZE, rollout_is_cap=CAP, rollout_is_level="token")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rollout_is_mode": "mask"}, "rollout_is_mode='mask' needs rollout_is_cap"),
        ({"rollout_is_cap": CAP, "rollout_is_floor": 0.5}, "rollout_is_floor=0.5 with rollout_is_mode='truncate'"),
        ({"rollout_is_cap": CAP, "rollout_is_mode": "mask", "rollout_is_floor": 1.5}, r"rollout_is_floor must be .* in \(0, 1\]"),
        ({"rollout_is_cap": CAP, "rollout_is_mode": "clip"}, "unknown rollout_is_mode 'clip'; valid: 'truncate', 'mask'"),
        (
            {"rollout_is_cap": CAP, "rollout_is_level": "geometric"},
            "rollout_is_level='geometric' is not valid here; valid: 'token', 'sequence'",
        ),
    ],
)
def test_options_that_do_not_fit_together_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        GRPO(GROUP_SIZE, max_response_length=TOKENS, **options)


def test_the_geometric_mean_level_is_the_per_token_mean_of_the_log_ratio_of_each_response():
    batch = mismatched_batch()
    weights = weights_of(batch, "truncate", "geometric_mean", cap=1.1)
    for i in range(len(batch["rewards"])):
        logs = [
            float(batch["old_logprobs"][i, t] - batch["sampler_logprobs"][i, t])
            for t in range(TOKENS)
            if batch["response_mask"][i, t] == 1
        ]
        assert weights[i].item() == pytest.approx(min(math.exp(sum(logs) / len(logs)), 1.1), rel=1e-13)
    assert (weights == 1.1).any() and (weights < 1).any()


def test_pacs_weighs_each_response_by_the_geometric_mean_of_its_ratio_when_asked():
    batch = mismatched_batch()
    algorithm = PACS(GROUP_SIZE, rollout_is_cap=CAP, rollout_is_level="geometric_mean")
    torch.testing.assert_close(
        algorithm.prepare_step(batch)["rollout_is_weight"], weights_of(batch, "truncate", "geometric_mean"), atol=0, rtol=0
    )


def test_a_long_responses_geometric_mean_weight_keeps_an_effective_sample_size_its_product_loses():
    """Independent token log-ratios N(−s²/2, s²) (E[ρ_t] = 1), s = 0.2, over 200 tokens: the
    product's sd(log ρ) is 2.8, its ESS/N near exp(−8); the geometric mean's is 0.014."""
    generator = torch.Generator().manual_seed(0)
    rows, tokens, spread = 256, 200, 0.2
    old = torch.zeros(rows, tokens, dtype=torch.float64)
    sampler = -(spread * torch.randn(rows, tokens, generator=generator, dtype=torch.float64) - spread**2 / 2)
    mask = torch.ones(rows, tokens, dtype=torch.float64)
    ess = {}
    for level in ("sequence", "geometric_mean"):
        weights = rollout_is_weights(old, sampler, mask, 1e6, level=level)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ess[level] = sampler_correction_metrics(*sampler_correction_sums(weights, old, sampler, mask, 1e6))["rollout_is/ess"]
        assert bool(caught) == (ess[level] < ESS_WARNING_BELOW)
    assert ess["sequence"] < 0.1 and ess["geometric_mean"] > 0.99


@pytest.mark.parametrize(("weights", "warned"), [([1.0, 1.0, 1.0, 0.0], False), ([2.0, 0.1, 0.1, 0.1], True)])
def test_an_effective_sample_size_below_half_the_batch_is_warned_about(weights, warned):
    """ESS/N = 3/4 for three equal weights and a zero; (2.3)²/(4 · 4.03) = 0.33 for one dominant weight."""
    old = torch.zeros(4, 1, dtype=torch.float64)
    mask = torch.ones(4, 1, dtype=torch.float64)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sampler_correction_metrics(*sampler_correction_sums(torch.tensor(weights, dtype=torch.float64), old, old, mask, CAP))
    messages = [str(warning.message) for warning in caught]
    assert bool(messages) == warned
    assert all("rollout_is/ess < 0.5" in message and "rollout_is_level=geometric_mean" in message for message in messages)


def toy_policy_gradients(weighting: str, later_update: bool) -> dict[str, torch.Tensor]:
    """Exact enumeration, float64: responses are 2 tokens from a vocabulary of 3 (9 responses, each
    position its own softmax: logits θ of shape (2, 3)), Y = 1 when the tokens sum to a multiple of
    3, groups of n = 4 (6561 groups). β = 1, logratio proxy against π_old, no truncation. The policy
    gradient −∇L = 1/n Σ_k A_k ∇r_k(θ) of one group, in expectation:

        true:        groups ∼ π_old
        corrected:   groups ∼ μ, each term times ρ_k = π_old(o_k)/μ(o_k)
        uncorrected: groups ∼ μ

    at θ = θ_old (the first update: r = 0) or at θ a step away from it (a later update: r ≠ 0)."""
    group_size, vocabulary = 4, 3
    generator = torch.Generator().manual_seed(1)
    theta_old = torch.randn(2, vocabulary, generator=generator, dtype=torch.float64)
    theta_mu = theta_old + 0.7 * torch.randn(2, vocabulary, generator=generator, dtype=torch.float64)
    theta = theta_old + (0.5 * torch.randn(2, vocabulary, generator=generator, dtype=torch.float64) if later_update else 0)
    tokens = torch.cartesian_prod(torch.arange(vocabulary), torch.arange(vocabulary))  # (9, 2)
    outcomes = ((tokens.sum(dim=-1) % 3) == 0).double()

    def log_probs(logits):  # (9,) log π(o) of every response
        return logits.log_softmax(dim=-1).gather(-1, tokens.T).sum(dim=0)

    one_hot = F.one_hot(tokens, vocabulary).double()  # (9, 2, 3)
    score_function = (one_hot - theta.softmax(dim=-1)).reshape(len(tokens), -1)  # (9, 6): ∇_θ log π_θ(o)
    groups = torch.cartesian_prod(*[torch.arange(len(tokens))] * group_size)  # (6561, 4) response ids
    rows = groups.reshape(-1)
    proxy = (log_probs(theta) - log_probs(theta_old))[rows]
    group_ids = torch.arange(len(groups)).repeat_interleave(group_size)
    _, advantages = pacs_advantages(proxy, outcomes[rows], group_ids, weighting=weighting)
    per_row = advantages[:, None] * score_function[rows] / group_size  # (B, 6)
    ratio = (log_probs(theta_old) - log_probs(theta_mu)).exp()[rows]

    def expectation(logits, terms):
        group_probability = log_probs(logits)[groups].sum(dim=-1).exp()  # (G,)
        return (group_probability[:, None] * terms.reshape(len(groups), group_size, -1).sum(dim=1)).sum(dim=0)

    return {
        "true": expectation(theta_old, per_row),
        "corrected": expectation(theta_mu, ratio[:, None] * per_row),
        "uncorrected": expectation(theta_mu, per_row),
    }


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(a @ b / (a.norm() * b.norm()))


@pytest.mark.parametrize("weighting", ["none", "question"])
def test_on_the_first_update_the_correction_gives_the_true_gradient_up_to_a_positive_factor(weighting):
    """With r = 0, A_k depends on o_k through Y_k alone, so both expectations are multiples of
    ∇P(Y = 1): `none` exactly, `question` rescaled (its class weights count the others, drawn from μ);
    without the correction the direction is wrong."""
    gradients = toy_policy_gradients(weighting, later_update=False)
    true, corrected = gradients["true"], gradients["corrected"]
    factor = float(corrected @ true / (true @ true))
    torch.testing.assert_close(corrected, factor * true, atol=1e-13 * float(true.norm()), rtol=0)
    if weighting == "none":
        assert factor == pytest.approx(1.0, abs=1e-12)
    else:
        assert factor > 0 and abs(factor - 1) > 1e-3
    assert cosine(gradients["uncorrected"], true) < 1 - 1e-3


@pytest.mark.parametrize("weighting", ["none", "question"])
def test_on_a_later_update_the_correction_is_biased_in_direction(weighting):
    """Once r ≠ 0, σ(ψ_k) depends on the others' r, drawn from μ: not a rescaling any more."""
    gradients = toy_policy_gradients(weighting, later_update=True)
    assert cosine(gradients["corrected"], gradients["true"]) < 1 - 1e-4
