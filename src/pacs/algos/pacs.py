"""PACS: reinforcement learning from verifiable rewards as supervised learning (arXiv 2509.02522).

For each prompt the policy samples a group of ``n`` responses; a verifier scores each with an
outcome reward ``R_i ∈ [0, 1]`` (usually 0 or 1). PACS predicts ``R_i`` from a score that the
policy itself carries and minimises a weighted binary cross-entropy:

    reward proxy   logratio:      r_i = β · Σ_t m_it · (log π_θ(o_it) − log π_ref(o_it))
                   mean_logprob:  r_i = β · Σ_t m_it · log π_θ(o_it) / Σ_t m_it
    reference      rollout:       π_ref = π_old, the policy that sampled the step (the authors' code)
                   fixed:         π_ref = the frozen reference model (the paper's text: the initial
                                  policy, hard-reset to the current one every
                                  ``train.reference_reset_every`` steps, with the optimizer's state)
    score          rloo:          ψ_i = r_i − 1/(n−1) · Σ_{j≠i} r_j
                   grpo:          ψ_i = (r_i − mean_j r_j) / max(std_j r_j + 1e-6, β · s₀)   (unbiased
                                  std; s₀ = GRPO_SPREAD_FLOOR = 1 nat, see below)
                   naive:         ψ_i = r_i
    class weight   question:      w_i = n / (K · #{j : Y_j = Y_i}) in a group with K > 1 distinct
                                  outcomes Y, w_i = 1 in a group with a single outcome; Y is the
                                  verifier's reward before overlong shaping (R = Y without it)
                   none:          w_i = 1
                   only_positive: w_i = 1[R_i = 1]
                   only_negative: w_i = 1[R_i = 0]
    loss           L = 1/B · Σ_i w_i · BCEWithLogits(ψ_i, R_i)
                     = −1/B · Σ_i w_i · [R_i log σ(ψ_i) + (1 − R_i) log(1 − σ(ψ_i))]
    advantages     A_i = −∂/∂r_i Σ_j w_j · BCEWithLogits(ψ_j, R_j), so −∇_θ L = 1/B · Σ_i A_i ∇_θ r_i
    sampler        with rollout_is_cap = C (off by default), each response's whole coefficient times
    correction     its own weight:  −∇_θ L_ρ = 1/B · Σ_i w_i · A_i ∇_θ r_i, from the response's ratio
                   sequence:        ρ_i = π_old(o_i) / μ(o_i) = exp(Σ_t m_it (log π_old(o_it) − log μ(o_it)))
                   geometric_mean:  ρ_i = exp(Σ_t m_it (log π_old(o_it) − log μ(o_it)) / Σ_t m_it)
                   rollout_is_mode truncate (default):  w_i = min(ρ_i, C)
                                   mask:                w_i = ρ_i · 1[F ≤ ρ_i ≤ C], F = rollout_is_floor or 1/C
                   (`sampler_corrected_coefficients`; `pacs train`, the TRL and verl integrations)
    overlong       with overlong_buffer = L_cache > 0 (off by default): the label is
    shaping        R_i ← clip(R_i + p · R_length(o_i), 0, 1), DAPO's penalty (``shaping.overlong_penalty``)
                   kept in the label range: a correct response near the length limit becomes a soft
                   label 1 − p · R_length, an incorrect one stays 0. The class weights stay those of
                   the unshaped outcomes Y, so shaping only lowers a long response's label, and with
                   it its push: a soft label as a class of its own would get the weight n / K of a
                   whole class (with six short correct answers, one long one at 0.75 and one wrong,
                   `question` would push the long one 4× harder than each short one)

``m`` is the response mask, sums and means over ``j`` run inside the prompt group of ``i``, and
the weights are constants. The gradient is an actor-critic update: ``−∇L = β/B Σ_k A_k ∇log π_θ(o_k)``
with ``A_k = e_k − mean_{i≠k} e_i`` and ``e_i = w_i (R_i − σ(ψ_i))`` (for ``logratio`` + ``rloo``).

The sampler correction, derived. μ is the rollout engine's sampling distribution (vLLM's
log-probs of its own samples), π_old the trainer's policy at rollout time; the loss is written
for samples of π_old, the responses come from μ. With ∂L/∂ψ_i = −e_i / B and, for ``rloo``,
∂ψ_i/∂r_k = 1 if i = k else −1/(n−1) (same group), the chain rule gives

    ∂L/∂r_k = Σ_i ∂L/∂ψ_i · ∂ψ_i/∂r_k = −1/B · (e_k − 1/(n−1) · Σ_{i≠k} e_i) = −A_k / B,
    −∇_θ L  = −Σ_k ∂L/∂r_k ∇_θ r_k   = 1/B · Σ_k A_k ∇_θ r_k,

a sum of one term per sampled response o_k. Its correction is per-response importance weighting:
A'_k = ρ_k · A_k, as verl's TIS and TRL's correction scale a sample's advantage by its own ratio,
with ρ_k one weight per response (PACS classifies whole responses), truncated at C or masked
outside [F, C] (`importance.rollout_is_weights`; ``rollout_is_level`` "sequence", the product of
its tokens' ratios, or "geometric_mean", that product's T-th root, which stays near 1 for long
responses where the product spreads over orders of magnitude). A response of weight 0 (masked)
gets coefficient 0. What it estimates is approximate: A_k depends on the whole group (the
leave-one-out baseline, the class weight w_k through how many others share Y_k, and σ(ψ_k)
through the others' r on later updates), and ρ_k corrects o_k alone, so the estimate is
E_{o_k∼π_old, o_{−k}∼μ}[A_k ∇r_k], the group's statistics taken from the behaviour policy μ:

    first update (r = 0, σ(ψ) = 1/2, binary rewards): A_k depends on o_k through Y_k only, so both
        expectations are (f(1) − f(0)) · ∇P_{π_old}(Y = 1) for a function f of the group; the
        corrected gradient is the true one times a positive factor f_μ(1) − f_μ(0) over
        f_{π_old}(1) − f_{π_old}(0): exact with ``weighting=none`` (the baseline's mean cancels
        against E[∇log π] = 0), a rescaling with ``question`` (a different step size, the same
        direction; `tests/algos/test_algos_rollout_is.py` enumerates n = 4 in float64);
    later updates: σ(ψ_k) depends on the others' r, drawn from μ, so the estimate is biased in
        direction too (the same enumeration at θ ≠ θ_old).

Truncation (min(ρ, C)) down-weights exactly the responses the newer policy prefers, which a long
response's sequence ratio reaches easily; `rollout_is/ess`, the effective sample size over N,
warns when the weights leave less than half a batch (`importance.sampler_correction_metrics`).
Weighting each BCE
term instead, L = 1/B · Σ_i ρ_i w_i BCE(ψ_i, R_i), is not this: through the leave-one-out
centring its coefficient is ∂L/∂r_k = −1/B · (ρ_k e_k − 1/(n−1) · Σ_{i≠k} ρ_i e_i), so a response
of weight 0 is still pushed by the others' errors (rewards [1, 1, 1, 0] and ρ [1, 1, 1, 0] at
r = 0 give ∂L/∂r = [−1/36, −1/36, −1/36, +1/12] where the per-response form gives [−1/9, −1/9, −1/9, 0];
`tests/algos/test_algos_rollout_is.py`). The reported loss is L itself: the correction changes the
gradient, not what PACS predicts.

The two references differ on the first update after a rollout: against π_old, θ = θ_old gives r = 0
and ψ = 0 (that update is RLOO's, scaled by β; the ``grpo`` score's too, scaled by (n − 1)/(n s₀)
where the spread floor holds it); against a fixed π_ref, r_i = β · log(π_old(o_i) /
π_ref(o_i)) already, so σ(ψ) starts from how far the policy has moved from the reference. The paper's
text (v2, section 3.4) resets π_ref "to a recent snapshot of the online policy" periodically, as
ProRL does (Liu et al. 2025, arXiv 2505.24864), because r grows against a fixed reference; it gives
no period.

The ``grpo`` score's spread floor. Against the rollout reference every r is exactly 0 on a step's
first update, where the authors' formula (r − mean) / (std + 1e-6) has value 0 and derivative
∂ψ_i/∂r_j = (δ_ij − 1/n) / 1e-6: coefficients of order 1e5, which only gradient clipping tames.
The floor β · s₀ on the denominator, s₀ = 1 nat of summed log-ratio, keeps the score's sensitivity
at most that of ``rloo``'s per nat: while the group's spread is below β · s₀ the score is
(r_i − mean r) / (β s₀) = (n − 1)/n · ψ_rloo / (β s₀), so the first update is RLOO's at the scale
of β = 1 whatever β; once the spread exceeds it, the authors' formula holds exactly. Scaled by β,
the floor keeps the score a function of the log-ratios alone, as the unfloored formula is. The
authors' ``norm_adv_by_std_in_grpo=False`` variant, r_i − mean_j r_j, is (n − 1)/n · ψ_rloo: the
``rloo`` score with β · (n − 1)/n.

``pacs_loss`` is the composition
``pacs_loss_from_proxy(reward_proxy(...), rewards, ...)``; ``pacs_loss_from_proxy`` is in turn
built from ``group_scores`` and ``class_weights``. Rows ``[g*n, (g+1)*n)`` of every batch belong to
prompt ``g``.
"""

from __future__ import annotations

import math
import typing
from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from pacs.algos.aggregation import (
    LOSS_AGG_MODES,
    aggregation_weights,
    weighted_token_sum,
)
from pacs.algos.base import MiniBatchTotals
from pacs.algos.groups import (
    GRPO_STD_EPS,
    group_normalised,
    group_view,
    leave_one_out_centred,
)
from pacs.algos.importance import RolloutIsLevel, check_rollout_is, rollout_is_weights
from pacs.algos.kl import check_kl_penalty, kl_penalty
from pacs.algos.masks import check_choice, check_same_shape, masked_mean, masked_sum
from pacs.algos.options import BaseAlgorithmConfig, RunSettings
from pacs.algos.shaping import check_overlong_shaping, response_lengths, shaped_rewards

LOSS_NOTE = (
    "note: PACS's loss is a cross-entropy of logits ψ that start each step from the policy's log-ratio to its "
    "reference: 0 with the default pacs_reference=rollout (π_θ = π_old after every rollout), so the loss stays near "
    "ln 2 = 0.693 (exactly ln 2 on each step's first update, with the default weighting); with pacs_reference=fixed "
    "it starts from how far the policy has moved from the reference. Learning shows in reward/mean and the "
    "validation pass@k, not in the loss"
)
"""What the trainer tells a user who watches PACS's loss sit at 0.693 in the progress bar."""


def inert_beta_note(beta: float) -> str:
    """What a run with `beta` other than 1 under the ``grpo`` estimator is told: β changes nothing there."""
    return (
        f"note: algorithm.beta={beta:g} has no effect with algorithm.estimator='grpo': its score divides the β-scaled "
        f"proxy by max(its spread, β·{GRPO_SPREAD_FLOOR:g}), so β cancels (but for the spread's 1e-6); β scales the "
        "score with estimator='rloo' or 'naive'"
    )


Proxy = Literal["logratio", "mean_logprob"]
PROXIES: tuple[str, ...] = typing.get_args(Proxy)
Estimator = Literal["rloo", "grpo", "naive"]
ESTIMATORS: tuple[str, ...] = typing.get_args(Estimator)
Weighting = Literal["question", "none", "only_positive", "only_negative"]
WEIGHTINGS: tuple[str, ...] = typing.get_args(Weighting)
Reference = Literal["rollout", "fixed"]
REFERENCES: tuple[str, ...] = typing.get_args(Reference)
GRPO_SPREAD_FLOOR = 1.0
"""s₀: the ``grpo`` score divides by max(std r + 1e-6, β · s₀) in the trainer and the integrations
(module docstring: at r = 0 the first update is then RLOO's at β = 1's scale, instead of 1e5 times it)."""


def reward_proxy(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    beta: float = 1.0,
    proxy: str = "logratio",
) -> torch.Tensor:
    """Per-response reward proxy built from the policy's log-probabilities.

    Formula (``m`` = ``response_mask``):
        logratio:     r_i = β · Σ_t m_it · (logprobs_it − old_logprobs_it)
        mean_logprob: r_i = β · Σ_t m_it · logprobs_it / max(Σ_t m_it, 1)

    Args:
        logprobs: (B, T) log-probs of the response tokens under the current policy π_θ.
        old_logprobs: (B, T) log-probs of the same tokens under the rollout policy π_old,
            constants. Unused by ``mean_logprob`` but still shape-checked.
        response_mask: (B, T) 1 at response tokens, 0 at padding (float, int or bool). Padding
            positions contribute nothing, whatever their log-prob values.
        beta: proxy scale β, a finite float.
        proxy: ``"logratio"`` or ``"mean_logprob"``.

    Returns:
        (B,) proxy rewards r.

    Raises:
        ValueError: unknown ``proxy``, non-finite ``beta``, ``logprobs`` not 2-D, or the three
            tensors not of one shape.
    """
    check_choice("proxy", proxy, PROXIES)
    if not math.isfinite(beta):
        raise ValueError(f"beta must be a finite number, got {beta!r}")
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be 2-D (B, T), got shape {tuple(logprobs.shape)}")
    check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, response_mask=response_mask)
    if proxy == "logratio":
        return beta * masked_sum(logprobs - old_logprobs, response_mask)
    return beta * masked_mean(logprobs, response_mask)


def group_scores(
    proxy_rewards: torch.Tensor, group_size: int, *, estimator: str = "rloo", spread_floor: float = 0.0
) -> torch.Tensor:
    """Score ψ of each response relative to the other responses to its prompt.

    Formula (sums, means and std over the n = ``group_size`` rows of the group of i):
        rloo:  ψ_i = r_i − 1/(n−1) · Σ_{j≠i} r_j
        grpo:  ψ_i = (r_i − mean_j r_j) / max(std_j r_j + 1e-6, spread_floor), std unbiased
               (divides by n − 1); spread_floor 0 is the authors' formula, whose derivative at an
               all-equal group is (δ_ij − 1/n) / 1e-6; the trainer passes β · GRPO_SPREAD_FLOOR
        naive: ψ_i = r_i

    Args:
        proxy_rewards: (B,) proxy rewards r, B a multiple of ``group_size``.
        group_size: responses per prompt n; at least 2 for ``rloo`` and ``grpo``.
        estimator: ``"rloo"``, ``"grpo"`` or ``"naive"``.
        spread_floor: the smallest denominator of ``grpo``, a finite number >= 0; unused by the others.

    Returns:
        (B,) scores ψ (logits of the predicted reward).

    Raises:
        ValueError: unknown ``estimator``, B not a multiple of ``group_size``,
            ``group_size < 2`` with ``rloo``/``grpo``, or a negative or non-finite ``spread_floor``.
    """
    check_choice("estimator", estimator, ESTIMATORS)
    group_view(proxy_rewards, group_size)  # B must hold whole groups, whatever the estimator
    if estimator == "naive":
        return proxy_rewards
    if group_size < 2:
        raise ValueError(
            f"estimator {estimator!r} needs group_size >= 2, got {group_size}: the leave-one-out "
            "baseline (rloo) and the group std (grpo) need at least 2 responses per prompt; "
            "set rollout.n >= 2 or use estimator='naive'"
        )
    if estimator == "rloo":
        return leave_one_out_centred(proxy_rewards, group_size)
    if not (math.isfinite(spread_floor) and spread_floor >= 0):
        raise ValueError(f"spread_floor must be a finite number >= 0 (0: the authors' grpo score), got {spread_floor!r}")
    return group_normalised(proxy_rewards, group_size, eps=GRPO_STD_EPS, floor=spread_floor)


def class_weights(rewards: torch.Tensor, group_size: int, *, weighting: str = "question") -> torch.Tensor:
    """Per-response class weights, constants (no gradient).

    Formula (K = number of distinct reward values in the group of i, n = ``group_size``):
        question:      w_i = n / (K · #{j in group: R_j = R_i}) if K > 1, else w_i = 1
        none:          w_i = 1
        only_positive: w_i = 1 if R_i = 1 else 0
        only_negative: w_i = 1 if R_i = 0 else 0

    With ``question`` every class present in a group gets the same total weight n / K, so a
    group's weights sum to n. Rewards are compared exactly (a verifier's soft rewards form their
    own classes); pass the outcomes before overlong shaping (``pacs_loss_from_proxy``'s ``outcomes``).

    Args:
        rewards: (B,) rewards R, B a multiple of ``group_size``.
        group_size: responses per prompt n.
        weighting: ``"question"``, ``"none"``, ``"only_positive"`` or ``"only_negative"``.

    Returns:
        (B,) weights w, in ``rewards``' dtype if it is floating point, else the default dtype.

    Raises:
        ValueError: unknown ``weighting`` or B not a multiple of ``group_size``.
    """
    check_choice("weighting", weighting, WEIGHTINGS)
    rewards = rewards.detach()
    grouped = group_view(rewards, group_size)
    dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    if weighting == "none":
        return torch.ones_like(rewards, dtype=dtype)
    if weighting == "only_positive":
        return (rewards == 1).to(dtype)
    if weighting == "only_negative":
        return (rewards == 0).to(dtype)
    same_reward = grouped.unsqueeze(-1) == grouped.unsqueeze(-2)  # (G, n, n): R_j == R_i at [g, i, j]
    class_sizes = same_reward.sum(dim=-1)  # (G, n): #{j : R_j == R_i}
    earlier = torch.ones(group_size, group_size, dtype=torch.bool, device=rewards.device).tril(diagonal=-1)
    first_of_class = ~(same_reward & earlier).any(dim=-1)  # (G, n): no earlier row has R_i
    num_classes = first_of_class.sum(dim=-1, keepdim=True)  # (G, 1): K
    balanced = group_size / (num_classes * class_sizes).to(dtype)
    weights = torch.where(num_classes > 1, balanced, torch.ones_like(balanced))
    return weights.reshape(-1)


def pacs_loss_from_proxy(
    proxy_rewards: torch.Tensor,
    rewards: torch.Tensor,
    group_size: int,
    *,
    estimator: str = "rloo",
    weighting: str = "question",
    outcomes: torch.Tensor | None = None,
    spread_floor: float = 0.0,
) -> torch.Tensor:
    """PACS loss given the proxy rewards.

    Formula: L = 1/B · Σ_i w_i · BCEWithLogits(ψ_i, R_i) with ψ = ``group_scores(proxy_rewards)``
    and w = ``class_weights(outcomes)``.

    Args:
        proxy_rewards: (B,) proxy rewards r (see ``reward_proxy``), B a multiple of ``group_size``.
        rewards: (B,) labels R in [0, 1] (soft labels allowed), overlong shaping included.
        group_size: responses per prompt n.
        estimator: see ``group_scores``.
        weighting: see ``class_weights``.
        outcomes: (B,) the outcomes Y the class weights count, the verifier's rewards before
            overlong shaping (module docstring); None: R itself.
        spread_floor: the ``grpo`` score's smallest denominator (``group_scores``).

    Returns:
        0-dim loss.

    Raises:
        ValueError: shapes differ, a reward lies outside [0, 1], or as ``group_scores`` and
            ``class_weights`` raise.
    """
    check_same_shape(proxy_rewards=proxy_rewards, rewards=rewards)
    rewards = rewards.to(proxy_rewards.dtype)
    if not bool(((rewards >= 0) & (rewards <= 1)).all()):
        raise ValueError(f"rewards must lie in [0, 1], got min {rewards.min().item()} and max {rewards.max().item()}")
    scores = group_scores(proxy_rewards, group_size, estimator=estimator, spread_floor=spread_floor)
    if outcomes is not None:
        check_same_shape(rewards=rewards, outcomes=outcomes)
    weights = class_weights(rewards if outcomes is None else outcomes.to(rewards.dtype), group_size, weighting=weighting)
    losses = F.binary_cross_entropy_with_logits(scores, rewards, reduction="none")
    return (weights * losses).mean()


def pacs_advantages(
    proxy_rewards: torch.Tensor,
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    estimator: str = "rloo",
    weighting: str = "question",
    spread_floor: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PACS's per-response advantages for prompt groups named by id (rows of a group anywhere in the
    batch, groups of any sizes), and the summed loss whose gradient they are.

    Formula (ψ and w inside each group as in ``group_scores`` and ``class_weights``):
        S   = Σ_i w_i · BCEWithLogits(ψ_i, R_i)          over the rows of every scored group
        A_i = −∂S/∂r_i,   so that   −∇_θ L = 1/B · Σ_i A_i ∇_θ r_i   for L = S / B.
    With ``rloo``, A_i = e_i − 1/(n−1) · Σ_{j≠i} e_j with e_i = w_i (R_i − σ(ψ_i)) (the module
    docstring's actor-critic form); at θ = θ_old the logratio proxy is r = 0, so σ(ψ) = 1/2.
    ``rloo`` and ``grpo`` need two rows to compare: a group of one row is not scored (A = 0, no
    term in S); ``naive`` scores it alone.

    Args:
        proxy_rewards: (B,) proxy rewards r (see ``reward_proxy``); constants here.
        rewards: (B,) verifier rewards R in [0, 1] (soft labels allowed).
        group_ids: (B,) integer id of each row's prompt.
        estimator: see ``group_scores``.
        weighting: see ``class_weights``.
        spread_floor: the ``grpo`` score's smallest denominator (``group_scores``); the integrations
            pass β · GRPO_SPREAD_FLOOR.

    Returns:
        (0-dim S, (B,) A), in ``proxy_rewards``' dtype, without gradient.

    Raises:
        ValueError: shapes differ, ``group_ids`` not integers, a reward outside [0, 1], or an unknown
            option.
    """
    check_choice("estimator", estimator, ESTIMATORS)
    check_choice("weighting", weighting, WEIGHTINGS)
    check_same_shape(proxy_rewards=proxy_rewards, rewards=rewards, group_ids=group_ids)
    if group_ids.is_floating_point() or group_ids.is_complex():
        raise ValueError(f"group_ids must be integers (one id per prompt), got {group_ids.dtype}")
    _, group_of_row, group_sizes = torch.unique(group_ids, return_inverse=True, return_counts=True)
    row_group_size = group_sizes[group_of_row]  # (B,)
    proxy = proxy_rewards.detach().clone().requires_grad_(True)
    total = proxy.new_zeros(())
    smallest_scored = 1 if estimator == "naive" else 2
    for size in sorted(set(row_group_size.tolist())):
        if size < smallest_scored:
            continue
        rows = torch.nonzero(row_group_size == size).squeeze(-1)
        rows = rows[torch.argsort(group_of_row[rows], stable=True)]  # each group's rows adjacent
        mean_loss = pacs_loss_from_proxy(
            proxy[rows], rewards[rows], size, estimator=estimator, weighting=weighting, spread_floor=spread_floor
        )
        total = total + mean_loss * len(rows)
    if not total.requires_grad:
        return total.detach(), torch.zeros_like(proxy.detach())
    (gradient,) = torch.autograd.grad(total, proxy)
    return total.detach(), -gradient


def sampler_corrected_coefficients(coefficients: torch.Tensor, response_weights: torch.Tensor) -> torch.Tensor:
    """The sampler-mismatch correction for PACS: each response's whole gradient coefficient scaled by
    its own importance weight (per-response importance weighting with the group's statistics from
    the behaviour policy: the true gradient up to a positive factor on a step's first update,
    biased in direction on later ones; module docstring).

    Formula (A = ``coefficients``, ρ = ``response_weights``, μ the sampler, e.g. vLLM):
        −∇_θ L_ρ = 1/B · Σ_k ρ_k · A_k · ∇_θ r_k,    i.e.   A'_k = ρ_k · A_k
    as verl's TIS and TRL's correction scale a sample's advantage by its own ratio. ρ is one weight
    per response: the truncated (min(ρ, C)) or masked (0 outside [F, C]) sequence ratio
    π_old(o_k) / μ(o_k) = exp(Σ_t m_kt (log π_old(o_kt) − log μ(o_kt))), or its geometric mean per
    token. A response of weight 0 has coefficient 0 (the module docstring derives it, and why
    weighting each BCE term by ρ_i is not it).

    Args:
        coefficients: (B,) per-response gradient coefficients, constants: PACS's advantages A (see
            ``pacs_advantages``) or c = ∂L/∂r = −A/B (the map is linear, either works).
        response_weights: (B,) per-response weights ρ ≥ 0, constants.

    Returns:
        (B,) ρ ⊙ coefficients, in the wider of the two dtypes.

    Raises:
        ValueError: shapes differ, or a weight is negative or not finite.
    """
    check_same_shape(coefficients=coefficients, response_weights=response_weights)
    weights = response_weights.detach()
    if not bool((torch.isfinite(weights) & (weights >= 0)).all()):
        raise ValueError(
            f"response_weights must be finite and >= 0, got min {weights.min().item()} and max {weights.max().item()}"
        )
    return coefficients.detach() * weights


def pacs_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    rewards: torch.Tensor,
    group_size: int,
    *,
    beta: float = 1.0,
    proxy: str = "logratio",
    estimator: str = "rloo",
    weighting: str = "question",
    spread_floor: float = 0.0,
) -> torch.Tensor:
    """PACS loss for a batch of whole prompt groups.

    Formula: L = 1/B · Σ_i w_i · BCEWithLogits(ψ_i, R_i), with r = ``reward_proxy``,
    ψ = ``group_scores(r)`` and w = ``class_weights(R)`` (see the module docstring).

    Args:
        logprobs: (B, T) log-probs of the response tokens under the current policy.
        old_logprobs: (B, T) log-probs of the same tokens under the rollout policy.
        response_mask: (B, T) 1 at response tokens, 0 at padding (float, int or bool).
        rewards: (B,) verifier rewards in [0, 1]; rows [g*n, (g+1)*n) share prompt g.
        group_size: responses per prompt n; B must be a multiple of n.
        beta: proxy scale β, finite.
        proxy: ``"logratio"`` or ``"mean_logprob"``.
        estimator: ``"rloo"``, ``"grpo"`` or ``"naive"``.
        weighting: ``"question"``, ``"none"``, ``"only_positive"`` or ``"only_negative"``.
        spread_floor: the ``grpo`` score's smallest denominator (``group_scores``; 0: the authors'
            formula, the trainer's is β · GRPO_SPREAD_FLOOR).

    Returns:
        0-dim loss, differentiable w.r.t. ``logprobs``.

    Raises:
        ValueError: for any invalid shape, option, ``beta``, reward value or group size, with a
            message naming the argument and what would be valid.
    """
    proxy_rewards = reward_proxy(logprobs, old_logprobs, response_mask, beta=beta, proxy=proxy)
    if rewards.shape != proxy_rewards.shape:
        raise ValueError(
            f"rewards must have shape (B,) = ({logprobs.shape[0]},), one per row of logprobs "
            f"{tuple(logprobs.shape)}; got {tuple(rewards.shape)}"
        )
    return pacs_loss_from_proxy(
        proxy_rewards, rewards, group_size, estimator=estimator, weighting=weighting, spread_floor=spread_floor
    )


class PACS:
    """PACS as a trainer plug-in (`pacs.algos.base.Algorithm`): the exact mini-batch loss at any
    micro-batch size, groups split across micro-batches included.

    r_i depends on row i's tokens only, and θ is fixed within one optimizer update, so with the
    constants c_i = ∂L/∂r_i computed once from the whole mini-batch (no gradient through the model):

        Σ_micro ∇_θ Σ_{i ∈ micro} c_i · r_i(θ)  =  Σ_i c_i ∇_θ r_i(θ)  =  ∇_θ L.

    Computing c needs r at the current θ, i.e. a no-grad pass over the mini-batch; on the first
    update after a rollout θ = θ_old and r is known in closed form (logratio: r = 0 so ψ = 0, or
    against a fixed reference β Σ_t (old_logprobs − ref_logprobs); mean_logprob: from
    `old_logprobs`), so that pass is skipped.

    Optional, off by default as for every algorithm: a KL penalty to the frozen reference policy
    and an entropy bonus, added per token and aggregated by `loss_agg` (see
    `aggregation.aggregation_weights`):

        L_total = L + Σ_i v_i Σ_t m_it (kl_coef · k_it − entropy_coef · H_it)

    with v the aggregation weights of the mini-batch and k the per-token estimator
    `kl_estimator` (`kl.kl_penalty`): "k2" follows the gradient of KL(π_θ ‖ π_ref), "k3" (the
    default) that of KL(π_ref ‖ π_θ); "k1", whose expected gradient is zero, is refused when
    kl_coef > 0. The reported "loss" is L alone.
    """

    rollout_is_levels: tuple[str, ...] = ("sequence", "geometric_mean")
    """The levels of the sampler correction that PACS takes: its loss classifies whole responses,
    so one weight per response scales its whole gradient coefficient (module docstring): the
    product of its tokens' ratios, or their geometric mean; no token level."""
    startup_note: str | None = LOSS_NOTE
    """Printed once when a run starts: the loss that sits near ln 2 is not a stalled run."""

    def __init__(
        self,
        group_size: int,
        *,
        beta: float = 1.0,
        proxy: str = "logratio",
        estimator: str = "rloo",
        weighting: str = "question",
        kl_coef: float = 0.0,
        kl_estimator: str = "k3",
        entropy_coef: float = 0.0,
        loss_agg: str = "seq-mean-token-sum-norm",
        max_response_length: int | None = None,
        rollout_is_cap: float | None = None,
        rollout_is_mode: str = "truncate",
        rollout_is_level: str = "sequence",
        rollout_is_floor: float | None = None,
        overlong_buffer: int = 0,
        overlong_penalty: float = 1.0,
        pacs_reference: str = "rollout",
    ):
        check_choice("proxy", proxy, PROXIES)
        check_choice("pacs_reference", pacs_reference, REFERENCES)
        if pacs_reference == "fixed" and proxy != "logratio":
            raise ValueError(f"pacs_reference='fixed' with proxy={proxy!r}: only the logratio proxy has a reference policy")
        check_overlong_shaping(overlong_buffer, overlong_penalty, max_response_length)
        check_rollout_is(rollout_is_cap, rollout_is_mode, rollout_is_level, rollout_is_floor, levels=self.rollout_is_levels)
        check_choice("estimator", estimator, ESTIMATORS)
        check_choice("weighting", weighting, WEIGHTINGS)
        check_choice("loss_agg", loss_agg, LOSS_AGG_MODES)
        for name, coef in (("kl_coef", kl_coef), ("entropy_coef", entropy_coef)):
            if not (math.isfinite(coef) and coef >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {coef!r}")
        check_kl_penalty(kl_coef, kl_estimator)
        self.group_size = group_size
        self.beta, self.proxy, self.estimator, self.weighting = beta, proxy, estimator, weighting
        self.kl_coef, self.kl_estimator, self.entropy_coef = kl_coef, kl_estimator, entropy_coef
        self.loss_agg, self.max_response_length = loss_agg, max_response_length
        self.rollout_is_cap, self.rollout_is_mode, self.rollout_is_floor = rollout_is_cap, rollout_is_mode, rollout_is_floor
        self.rollout_is_level = rollout_is_level
        self.spread_floor = beta * GRPO_SPREAD_FLOOR
        if estimator == "grpo" and beta != 1.0:
            self.startup_note = f"{LOSS_NOTE}\n{inert_beta_note(beta)}"
        self.overlong_buffer, self.overlong_penalty = overlong_buffer, overlong_penalty
        self.reference_name = "ref_logprobs" if pacs_reference == "fixed" else "old_logprobs"
        self.regularised = kl_coef > 0 or entropy_coef > 0
        self.needs = (
            frozenset({"ref_logprobs"} if kl_coef > 0 or pacs_reference == "fixed" else set())
            | frozenset({"entropy"} if entropy_coef > 0 else set())
            | frozenset({"sampler_logprobs"} if rollout_is_cap is not None else set())
        )
        self.first_update_may_supply_old_logprobs = True
        """No step term reads the old log-probs: the correction's weight of a response depends on
        its own old log-probs alone, so rows whose old log-probs the first update gives get theirs
        in their micro-batch (``micro_batch_loss``)."""

    def prepare_step(self, batch, sum_over_ranks=None) -> dict[str, torch.Tensor]:
        """``rollout_is_terms``: PACS's other terms depend on the current policy, so they are made per update."""
        return self.rollout_is_terms(batch)

    def rollout_is_terms(self, batch) -> dict[str, torch.Tensor]:
        """With ``rollout_is_cap`` and ``batch``'s "old_logprobs", {"rollout_is_weight": (B,) w, one
        truncated or masked ratio per response, of ``rollout_is_level``} (module docstring); else {} (without old log-probs,
        as in ``prepare_step`` when the first update gives some of them, the weights are made per
        mini- or micro-batch: ``prepare_update``, ``micro_batch_loss``)."""
        if self.rollout_is_cap is None or "old_logprobs" not in batch:
            return {}
        weights = rollout_is_weights(
            batch["old_logprobs"], batch["sampler_logprobs"], batch["response_mask"], self.rollout_is_cap,
            mode=self.rollout_is_mode, level=self.rollout_is_level, floor=self.rollout_is_floor,
        )  # fmt: skip
        return {"rollout_is_weight": weights}

    def _rollout_is_weight(self, rows) -> torch.Tensor | None:
        """(B,) the rows' correction weights: the step term, else made from their own "old_logprobs"
        (the same numbers: a response's weight depends on its own log-probs alone); None without
        ``rollout_is_cap`` or while the rows have no old log-probs yet (the step's first update)."""
        if "rollout_is_weight" in rows:
            return rows["rollout_is_weight"]
        return self.rollout_is_terms(rows).get("rollout_is_weight")

    def _proxy(self, logprobs: torch.Tensor, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B,) r of ``logprobs`` against the reference: "old_logprobs" (rollout) or "ref_logprobs" (fixed)."""
        return reward_proxy(logprobs, rows[self.reference_name], rows["response_mask"], beta=self.beta, proxy=self.proxy)

    def _current_proxy(self, minibatch, current_logprobs, policy_is_rollout_policy: bool) -> torch.Tensor:
        """(B,) r at the current θ. On the first update after a rollout θ = θ_old, so logratio's
        r against π_old is 0 exactly, and otherwise r comes from `old_logprobs` (from
        `current_logprobs()` when the trainer has not computed them yet); later, one no-grad pass."""
        if not policy_is_rollout_policy:
            return self._proxy(current_logprobs(), minibatch)
        if self.proxy == "logratio" and self.reference_name == "old_logprobs":
            return torch.zeros_like(minibatch["rewards"])
        logprobs = minibatch["old_logprobs"] if "old_logprobs" in minibatch else current_logprobs()
        return self._proxy(logprobs, {**minibatch, "old_logprobs": logprobs})

    def labels(self, rows) -> torch.Tensor:
        """(B,) the labels R: the verifier's rewards, with ``overlong_buffer`` > 0 lowered by DAPO's
        overlong penalty and kept in [0, 1] (module docstring)."""
        rewards = rows["rewards"]
        if not self.overlong_buffer:
            return rewards
        shaped = shaped_rewards(
            rewards,
            response_lengths(rows),
            max_length=self.max_response_length,
            buffer=self.overlong_buffer,
            penalty=self.overlong_penalty,
        )
        return shaped.clamp(0, 1).to(rewards.dtype)

    def prepare_update(self, minibatch, current_logprobs, policy_is_rollout_policy, totals=None):
        """row_terms["proxy_grad"]: (B,) c_i = ∂L/∂r_i of the global mini-batch loss (L is a mean
        over its `totals.num_rows` rows; groups are whole on each share, so ψ and the class weights
        are local; the class weights count the unshaped rewards, the labels are shaped), times each
        row's own ρ_i with the sampler correction (`sampler_corrected_coefficients`) when the rows'
        old log-probs are known (else `micro_batch_loss` scales it), and then
        row_terms["rollout_is_weight"] (B,) ρ; metrics: this share's loss L (uncorrected) and the mean
        predicted probability of success σ(ψ) on correct (R = 1) and incorrect (R = 0) rows."""
        totals = totals or MiniBatchTotals.of(minibatch["response_mask"])
        proxy_rewards = self._current_proxy(minibatch, current_logprobs, policy_is_rollout_policy)
        proxy_rewards = proxy_rewards.detach().requires_grad_(True)
        rewards = minibatch["rewards"]
        loss = pacs_loss_from_proxy(
            proxy_rewards,
            self.labels(minibatch),
            self.group_size,
            estimator=self.estimator,
            weighting=self.weighting,
            outcomes=rewards,
            spread_floor=self.spread_floor,
        )
        (proxy_grad,) = torch.autograd.grad(loss * (len(rewards) / totals.num_rows), proxy_rewards)
        row_terms = {}
        weights = self._rollout_is_weight(minibatch)
        if weights is not None:
            proxy_grad = sampler_corrected_coefficients(proxy_grad, weights)
            row_terms["rollout_is_weight"] = weights
        scores = group_scores(proxy_rewards.detach(), self.group_size, estimator=self.estimator, spread_floor=self.spread_floor)
        predicted = torch.sigmoid(scores)
        metrics = {"loss": float(loss.detach())}
        if self.overlong_buffer:
            metrics["reward/overlong_penalty"] = float((self.labels(minibatch) - rewards).mean())
        for name, rows in (("correct", rewards == 1), ("incorrect", rewards == 0)):
            if rows.any():
                metrics[f"pacs/predicted_p_on_{name}"] = float(predicted[rows].mean())
        row_terms["proxy_grad"] = proxy_grad
        if self.regularised:
            row_terms["regulariser_weight"] = aggregation_weights(
                minibatch["response_mask"],
                self.loss_agg,
                num_rows=totals.num_rows,
                num_tokens=totals.num_tokens,
                max_response_length=self.max_response_length,
            )
        return row_terms, metrics

    def metric_weights(self, minibatch) -> dict[str, float]:
        """The predicted probabilities are means over the share's correct or incorrect rows; the
        loss is a mean over all its rows (see `pacs.algos.base`)."""
        rewards = minibatch["rewards"]
        return {
            "pacs/predicted_p_on_correct": float((rewards == 1).sum()),
            "pacs/predicted_p_on_incorrect": float((rewards == 0).sum()),
        }

    def micro_batch_loss(self, logprobs, micro, row_terms) -> torch.Tensor:
        """Σ_{i ∈ micro} c_i · r_i(θ) (+ this micro-batch's share of the KL penalty and entropy
        bonus): its gradient is this micro-batch's share of ∇L_total. On the step's first update,
        whose rows had no old log-probs for ``prepare_update``, c_i is scaled here by the weight
        ρ_i of the old log-probs the update's forward pass gave (π_old = π_θ, detached): the
        coefficient ``prepare_update`` would have made, exactly."""
        coefficients = row_terms["proxy_grad"]
        if "rollout_is_weight" not in row_terms and (weights := self._rollout_is_weight(micro)) is not None:
            coefficients = sampler_corrected_coefficients(coefficients, weights)
        loss = (coefficients * self._proxy(logprobs, micro)).sum()
        if not self.regularised:
            return loss
        per_token = torch.zeros_like(logprobs)
        if self.kl_coef > 0:
            kl = kl_penalty(logprobs, micro["ref_logprobs"], micro["response_mask"], self.kl_estimator)
            per_token = per_token + self.kl_coef * kl
        if self.entropy_coef > 0:
            per_token = per_token - self.entropy_coef * micro["entropy"]
        return loss + weighted_token_sum(per_token, micro["response_mask"], row_terms["regulariser_weight"])


class PacsConfig(BaseAlgorithmConfig):
    builds = PACS

    name: Literal["pacs"] = "pacs"
    """PACS (arXiv 2509.02522): the outcome reward as a label, predicted from the policy's own
    log-probs by a weighted binary cross-entropy (`pacs.algos.pacs`)."""
    beta: float = Field(1.0, gt=0, allow_inf_nan=False)
    """β, the scale of the reward proxy."""
    proxy: Proxy = "logratio"
    """The reward proxy: `logratio`, β·Σ_t (log π_θ − log π_old) (the paper's); `mean_logprob`,
    β·mean_t log π_θ."""
    estimator: Estimator = "rloo"
    """The score ψ of a response against the others to its prompt: `rloo`, its proxy minus their
    mean; `grpo`, group-normalised; `naive`, its proxy alone."""
    weighting: Weighting = "question"
    """Class weights of the cross-entropy: `question`, classes balanced within each group; `none`;
    `only_positive` / `only_negative`, one class only."""
    rollout_is_level: RolloutIsLevel = "sequence"
    """What one weight of the correction covers: PACS classifies whole responses, so one ρ per
    response scales its whole gradient coefficient: `sequence`, the product of its tokens' ratios;
    `geometric_mean`, that product's per-token geometric mean, near 1 for long responses (its
    effective sample size, rollout_is/ess, stays high where the product's collapses)."""
    pacs_reference: Reference = "rollout"
    """The reference π_ref of the logratio proxy: `rollout`, the policy that sampled the step (the
    authors' code: ψ = 0 on a step's first update); `fixed`, the frozen reference model, the
    initial policy (the paper's text), reset to the current policy every train.reference_reset_every
    steps with the optimizer's state (train.reference_reset_optimizer)."""

    def uses_reference(self) -> bool:
        return super().uses_reference() or self.pacs_reference == "fixed"

    def problems(self, config: RunSettings) -> list[str]:
        found = [*super().problems(config), *self._kl_problems(in_reward=False)]
        if self.pacs_reference == "fixed" and self.proxy != "logratio":
            found.append(
                f"algorithm.pacs_reference='fixed' with algorithm.proxy='{self.proxy}': only the logratio proxy, "
                "β·Σ_t (log π_θ − log π_ref), has a reference; use proxy=logratio or pacs_reference=rollout"
            )
        if config.rollout.n < 2 and self.estimator != "naive":
            found.append(
                f"rollout.n={config.rollout.n} with algorithm.name='pacs', algorithm.estimator='{self.estimator}': "
                "the group baseline needs at least 2 responses per prompt; set rollout.n >= 2 "
                "(or algorithm.estimator='naive')"
            )
        return found
