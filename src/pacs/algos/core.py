"""Shared tensor helpers for the algorithms in ``pacs.algos``.

Notation used across the package:

- ``B``: number of responses in a batch; ``T``: number of response token positions.
- ``n`` (``group_size``): responses sampled per prompt; rows ``[g*n, (g+1)*n)`` of a batch share
  prompt ``g``, so a batch holds ``G = B // n`` groups.
- ``response_mask``: 1 at response tokens, 0 at padding.

Masked reductions:

    masked_sum(v, m)  = Σ_t m_t · v_t
    masked_mean(v, m) = Σ_t m_t · v_t / max(Σ_t m_t, 1)

Policy-gradient building blocks shared by GRPO, RLOO and PPO (``pacs.algos.pg``, ``ppo``):

    clipped surrogate (PPO)   ℓ_it = max(−A_it ρ_it, −A_it clip(ρ_it, 1 − ε_low, 1 + ε_high)),
                              ρ_it = exp(log π_θ(o_it) − log π_old(o_it)); dual clip: for A < 0,
                              ℓ_it = min(ℓ_it, −c · A_it)
    loss aggregation          L = Σ_i w_i Σ_t m_it ℓ_it, w_i set by the mode (``aggregation_weights``)
    KL penalty to π_ref       k2 (gradient of KL(π_θ ‖ π_ref)) or k3 (gradient of KL(π_ref ‖ π_θ)),
                              per token (``kl_penalty``)

Pure tensor math: imports torch only.
"""

from __future__ import annotations

import math
import typing
from collections.abc import Sequence
from typing import Literal

import torch

LossAggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
"""How per-token losses are aggregated (``aggregation_weights``); the type of the `loss_agg` options."""
LOSS_AGG_MODES: tuple[str, ...] = typing.get_args(LossAggregation)
KlEstimator = Literal["k1", "k2", "k3"]
"""The per-token KL estimators of ``kl_penalty``."""
KL_ESTIMATORS: tuple[str, ...] = typing.get_args(KlEstimator)
RolloutIsMode = Literal["truncate", "mask"]
"""How the sampler correction bounds a ratio (``rollout_is_weights``): truncated at the cap, or masked outside a range."""
ROLLOUT_IS_MODES: tuple[str, ...] = typing.get_args(RolloutIsMode)
RolloutIsLevel = Literal["token", "sequence"]
"""What one sampler-correction weight covers (``rollout_is_weights``): a token, or a whole response."""
ROLLOUT_IS_LEVELS: tuple[str, ...] = typing.get_args(RolloutIsLevel)

MAX_LOG_RATIO = 20.0
"""|log ρ| is clamped here before exponentiating so that ρ stays finite (e^20 ≈ 4.9e8); a token
beyond it gets no gradient. verl (the paper's code, ritzz-ai/PACS at 432f9e) does not clamp."""


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum of ``values`` over ``dim`` at positions where ``mask`` is 1.

    Formula: ``Σ_t mask_t · values_t``. Positions where ``mask`` is 0 contribute exactly 0 (and
    no gradient), even when ``values`` holds inf or nan there.

    Args:
        values: float tensor of any shape, e.g. (B, T).
        mask: tensor of the same shape as ``values`` with entries in {0, 1} (float, int or bool).
        dim: dimension to reduce.

    Returns:
        ``values`` reduced over ``dim``, e.g. (B,) for (B, T) inputs with ``dim=-1``.
    """
    check_same_shape(values=values, mask=mask)
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Mean of ``values`` over ``dim`` at positions where ``mask`` is 1.

    Formula: ``Σ_t mask_t · values_t / max(Σ_t mask_t, 1)``. The denominator is clamped at 1 so an
    all-masked slice gives 0 instead of 0/0.

    Args:
        values: float tensor of any shape, e.g. (B, T).
        mask: tensor of the same shape as ``values`` with entries in {0, 1} (float, int or bool).
        dim: dimension to reduce.

    Returns:
        ``values`` averaged over ``dim``, e.g. (B,) for (B, T) inputs with ``dim=-1``.
    """
    token_counts = mask.to(values.dtype).sum(dim).clamp(min=1)
    return masked_sum(values, mask, dim) / token_counts


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise ValueError unless all keyword tensors have one shape.

    Args:
        **tensors: tensors of any shape, keyed by the argument name reported in the error.

    Raises:
        ValueError: naming every argument with its shape, e.g.
            ``shape mismatch: logprobs (4, 7), response_mask (4, 6); all must have one shape``.
    """
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch: {listed}; all must have one shape")


def group_view(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """View a flat batch as one row per prompt group.

    Formula: ``out[g, k] = values[g * n + k]`` with ``n = group_size``.

    Args:
        values: (B,) tensor, B a multiple of ``group_size``.
        group_size: responses per prompt ``n`` (a positive integer).

    Returns:
        (B // n, n) view of ``values``.

    Raises:
        ValueError: if ``values`` is not 1-D, ``group_size`` is not a positive integer, or B is not
            a multiple of ``group_size``.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    if values.dim() != 1:
        raise ValueError(f"expected a 1-D (B,) tensor of per-response values, got shape {tuple(values.shape)}")
    batch_size = values.shape[0]
    if batch_size % group_size != 0:
        raise ValueError(
            f"batch size {batch_size} is not a multiple of group_size {group_size}; "
            f"each prompt's {group_size} responses must be whole, consecutive rows"
        )
    return values.view(batch_size // group_size, group_size)


GRPO_STD_EPS = 1e-6
"""Added to the group standard deviation before dividing by it (as in verl's GRPO)."""


def _shifted_to_first_of_group(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) values → (B // n, n) float64 ``d[g, k] = x[g·n + k] − x[g·n]`` (differentiable)."""
    grouped = group_view(values, group_size).to(torch.float64)
    return grouped - grouped[:, :1]


def leave_one_out_centred(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """Each value minus the mean of the other values of its group (differentiable).

    Formula: ``out_i = x_i − 1/(n−1) · Σ_{j≠i} x_j`` over the n = ``group_size`` rows of i's group,
    computed in float64 on ``d_j = x_j − x_first`` (the same value: the shift cancels), so that a
    group whose values are all equal gets exactly 0 (every d_j is then exactly 0) rather than
    rounding error.

    Args:
        values: (B,) tensor, B a multiple of ``group_size`` (callers check n ≥ 2).

    Returns:
        (B,) centred values in ``values``' dtype, with gradient if ``values`` has one.
    """
    shifted = _shifted_to_first_of_group(values, group_size)
    others_mean = (shifted.sum(dim=-1, keepdim=True) - shifted) / (group_size - 1)
    return (shifted - others_mean).reshape(-1).to(values.dtype)


def group_normalised(values: torch.Tensor, group_size: int, *, divide_by_std: bool = True, eps: float) -> torch.Tensor:
    """Each value centred on its group's mean, and divided by the group's std (differentiable).

    Formula: ``out_i = (x_i − mean_j x_j) / (std_j x_j + eps)``, std unbiased (divides by n − 1,
    as ``torch.std`` and verl); without the division when ``divide_by_std`` is False. Computed in
    float64 on ``d_j = x_j − x_first`` (mean and std are shifted alike, so ``out`` is unchanged),
    so that a group whose values are all equal gets exactly 0 (every d_j is then exactly 0; in
    float32, eight rewards 0.7 lie 6e-8 from their computed mean, which the division by
    std + eps = 6e-8 + 1e-6 would turn into 0.056).
    The gradient is the formula's: at an all-equal group ``∂out_i/∂x_j = (δ_ij − 1/n) / eps``.

    Args:
        values: (B,) tensor, B a multiple of ``group_size`` (callers check n ≥ 2).

    Returns:
        (B,) normalised values in ``values``' dtype, with gradient if ``values`` has one.
    """
    shifted = _shifted_to_first_of_group(values, group_size)
    centred = shifted - shifted.mean(dim=-1, keepdim=True)
    if divide_by_std:
        centred = centred / (shifted.std(dim=-1, keepdim=True) + eps)
    return centred.reshape(-1).to(values.dtype)


def mixed_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which prompt groups have rewards that are not all equal (the groups whose group-relative
    advantages, and PACS's class-weighted residuals, are not all zero).

    Args:
        rewards: (B,) rewards, B a multiple of ``group_size``.
        group_size: responses per prompt n.

    Returns:
        (B // n,) bool: R_gk ≠ R_g0 for some k.
    """
    grouped = group_view(rewards, group_size)
    return (grouped != grouped[:, :1]).any(dim=-1)


def mixed_group_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Fraction of prompt groups whose rewards are not all equal: mean of ``mixed_groups``."""
    return float(mixed_groups(rewards, group_size).float().mean())


def check_overlong_shaping(buffer: int, penalty: float, horizon: int | None) -> None:
    """Raise ValueError unless DAPO's overlong shaping (``overlong_penalty``) can be computed:
    ``buffer`` an integer in [0, horizon] (0: off), ``penalty`` a finite number >= 0, and the
    maximum response length ``horizon`` known when ``buffer`` > 0."""
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 0:
        raise ValueError(f"overlong_buffer must be an integer >= 0 (response tokens; 0: no shaping), got {buffer!r}")
    if not (math.isfinite(penalty) and penalty >= 0):
        raise ValueError(f"overlong_penalty must be a finite number >= 0, got {penalty!r}")
    if buffer and (horizon is None or buffer > horizon):
        raise ValueError(
            f"overlong_buffer={buffer} must not exceed the maximum response length (horizon={horizon!r}): "
            "the penalty grows over the last overlong_buffer tokens before it"
        )


def overlong_penalty(response_mask: torch.Tensor, max_length: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, Eq. 13), added to the
    outcome reward so that a response nearing the length limit earns less, whatever its outcome.

    Formula (|o_i| = Σ_t m_it, L_max = ``max_length``, L_cache = ``buffer``, p = ``penalty``):
        R_length(o_i) = 0                                   |o_i| ≤ L_max − L_cache
                      = ((L_max − L_cache) − |o_i|) / L_cache   L_max − L_cache < |o_i| ≤ L_max
                      = −1                                  |o_i| > L_max
        returned:  p · R_length(o_i)   (verl's ``overlong_buffer.penalty_factor``; DAPO: p = 1)

    Args:
        response_mask: (B, T) 1 at response tokens.
        max_length: L_max, the maximum response length (``data.max_response_length``).
        buffer: L_cache, 1 <= L_cache <= L_max.
        penalty: p >= 0.

    Returns:
        (B,) penalties in [−p, 0], float32 or wider, constants.
    """
    check_overlong_shaping(buffer, penalty, max_length)
    if buffer == 0:
        raise ValueError("overlong_penalty needs buffer >= 1 (buffer 0 switches the shaping off)")
    dtype = torch.promote_types(response_mask.dtype, torch.float32) if response_mask.is_floating_point() else torch.float32
    lengths = response_mask.detach().to(dtype).sum(dim=-1)
    excess = (lengths - (max_length - buffer)).clamp(min=0) / buffer
    return -penalty * excess.clamp(max=1)


def shaped_rewards(
    rewards: torch.Tensor, response_mask: torch.Tensor, *, max_length: int | None, buffer: int, penalty: float
) -> torch.Tensor:
    """The outcome rewards with DAPO's overlong penalty added (``overlong_penalty``, ``buffer`` >= 1):
    (B,) R_i + p · R_length(o_i), constants, at least float32."""
    shaping = overlong_penalty(response_mask, max_length, buffer, penalty)
    dtype = torch.promote_types(rewards.dtype, shaping.dtype)
    return rewards.detach().to(dtype) + shaping.to(dtype)


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    """Raise ValueError unless ``value`` is one of ``choices``.

    Args:
        name: option name reported in the error, e.g. ``"estimator"``.
        value: the option value given.
        choices: the valid values.

    Raises:
        ValueError: e.g. ``unknown estimator 'foo'; valid: 'rloo', 'grpo', 'naive'``.
    """
    if value not in choices:
        valid = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"unknown {name} {value!r}; valid: {valid}")


def check_group_size(group_size: int, minimum: int, needed_by: str) -> None:
    """Raise ValueError unless ``group_size`` is an integer of at least ``minimum``.

    Args:
        group_size: responses per prompt n (``rollout.n``).
        minimum: the smallest valid n.
        needed_by: what needs it, reported in the error, e.g. ``"RLOO's leave-one-out baseline"``.

    Raises:
        ValueError: e.g. ``RLOO's leave-one-out baseline needs group_size >= 2 (responses per
            prompt, rollout.n), got 1``.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < minimum:
        raise ValueError(
            f"{needed_by} needs group_size >= {minimum} (responses per prompt, rollout.n), got {group_size!r}"
        )


def check_clip_range(clip_low: float, clip_high: float, dual_clip: float | None = None) -> None:
    """Raise ValueError unless the PPO clip range ``[1 − clip_low, 1 + clip_high]`` is valid.

    Valid: ``0 < clip_low <= 1`` (the lower bound 1 − clip_low lies in [0, 1)), ``clip_high > 0``
    (``inf`` switches the upper clip off), and ``dual_clip`` None or a finite number > 1.

    Raises:
        ValueError: naming the argument, its value and the valid range.
    """
    if not 0 < clip_low <= 1:
        raise ValueError(f"clip_low must be in (0, 1] (the ratio is clipped at 1 - clip_low), got {clip_low!r}")
    if not clip_high > 0:
        raise ValueError(f"clip_high must be > 0 (the ratio is clipped at 1 + clip_high), got {clip_high!r}")
    if dual_clip is not None and not (math.isfinite(dual_clip) and dual_clip > 1):
        raise ValueError(f"dual_clip must be None or a finite number > 1 (e.g. 3.0), got {dual_clip!r}")


def per_token_advantages(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """``advantages`` broadcastable against the (B, T) per-token tensors of a policy loss: (B, 1)
    for per-response advantages (B,), as they are when per token (B, T).

    Raises:
        ValueError: ``logprobs`` not 2-D, the three (B, T) tensors of different shapes, or
            ``advantages`` neither (B,) nor (B, T).
    """
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be 2-D (B, T), got shape {tuple(logprobs.shape)}")
    check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, response_mask=response_mask)
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(
            f"advantages must have shape (B,) = {tuple(logprobs.shape[:1])} or (B, T) = "
            f"{tuple(logprobs.shape)}, matching logprobs; got {tuple(advantages.shape)}"
        )
    return advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token clipped surrogate loss of PPO (Schulman et al. 2017, arXiv 1707.06347), with the
    optional dual clip of Ye et al. 2020 (arXiv 1912.09729).

    Formula (ε_low = ``clip_low``, ε_high = ``clip_high``, c = ``dual_clip``):
        ρ_it = exp(clamp(logprobs_it − old_logprobs_it, −20, 20))
        ℓ_it = max(−A_it · ρ_it, −A_it · clip(ρ_it, 1 − ε_low, 1 + ε_high))
        dual clip, where A_it < 0:  ℓ_it = min(ℓ_it, −c · A_it)
    Minimising ℓ maximises the clipped objective; its gradient is zero at clipped tokens.
    Padding positions (``response_mask`` 0) get ρ = 1 whatever their log-probs, so their finite
    ``ℓ = −A`` carries no nan into the gradient; aggregate with the mask (``aggregate_loss``).

    Metrics, over response tokens:
        clip_fraction: fraction of tokens where clipping (either clip) changed ℓ from −A·ρ.
        approx_kl:     mean of k3 = ρ − 1 − log ρ, an unbiased estimate of KL(π_old ‖ π_θ) from
                       the rollout samples (0 on-policy).

    Args:
        logprobs: (B, T) log-probs of the response tokens under the current policy π_θ.
        old_logprobs: (B, T) log-probs under the rollout policy π_old, constants.
        advantages: (B,) per response (broadcast over its tokens) or (B, T) per token, constants.
        response_mask: (B, T) 1 at response tokens, 0 at padding (float, int or bool).
        clip_low: ε_low in (0, 1].
        clip_high: ε_high > 0.
        dual_clip: c > 1, or None for no dual clip.

    Returns:
        (B, T) per-token losses ℓ, and the metrics as floats.

    Raises:
        ValueError: invalid clip values (see ``check_clip_range``), ``logprobs`` not 2-D, shapes
            that differ, or ``advantages`` neither (B,) nor (B, T).
    """
    check_clip_range(clip_low, clip_high, dual_clip)
    token_advantages = per_token_advantages(logprobs, old_logprobs, advantages, response_mask)
    is_response = response_mask.bool()
    log_ratio = torch.where(is_response, logprobs - old_logprobs, torch.zeros_like(logprobs))
    log_ratio = log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio)
    unclipped = -token_advantages * ratio
    clipped = -token_advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    losses = torch.maximum(unclipped, clipped)
    changed = clipped > unclipped
    if dual_clip is not None:
        floor = -dual_clip * token_advantages
        dual_clipped = (token_advantages < 0) & (floor < losses)
        losses = torch.where(dual_clipped, floor, losses)
        changed = changed | dual_clipped
    with torch.no_grad():
        metrics = {
            "clip_fraction": float(masked_mean(changed.to(log_ratio.dtype).flatten(), is_response.flatten())),
            "approx_kl": float(masked_mean((ratio - 1 - log_ratio).flatten(), is_response.flatten())),
        }
    return losses, metrics


def outcome_token_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token rewards with each outcome reward on its response's last token.

    Formula: r_it = R_i if t = max{t' : m_it' = 1} else 0; a row without response tokens gets no
    reward.

    Args:
        rewards: (B,) outcome rewards R.
        response_mask: (B, T) 1 at response tokens, 0 at padding (float, int or bool).

    Returns:
        (B, T) token rewards, at least float32.

    Raises:
        ValueError: ``response_mask`` not 2-D or ``rewards`` not (B,).
    """
    if response_mask.dim() != 2 or rewards.shape != response_mask.shape[:1]:
        raise ValueError(
            f"expected rewards (B,) and response_mask (B, T), got {tuple(rewards.shape)} and "
            f"{tuple(response_mask.shape)}"
        )
    is_response = response_mask.bool()
    positions = torch.arange(response_mask.shape[1], device=response_mask.device).expand_as(is_response)
    last = torch.where(is_response, positions, -1).max(dim=-1).values  # (B,): -1 for an empty row
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    token_rewards = torch.zeros(response_mask.shape, dtype=dtype, device=response_mask.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    token_rewards[rows, last[rows]] = rewards.detach()[rows].to(dtype)
    return token_rewards


def aggregation_weights(
    response_mask: torch.Tensor,
    mode: str,
    *,
    num_rows: int | None = None,
    num_tokens: float | None = None,
    horizon: int | None = None,
) -> torch.Tensor:
    """Per-row weights w with which a loss mode aggregates per-token losses: L = Σ_i w_i Σ_t m_it ℓ_it.

    The modes are defined over a mini-batch (one optimizer update) of ``num_rows`` rows holding
    ``num_tokens`` response tokens in all; because every w_i depends on row i and those two
    mini-batch constants only, the weights of any subset of rows (a micro-batch) give exactly
    that subset's share of the mini-batch loss:

        token-mean:               w_i = 1 / num_tokens
        seq-mean-token-sum:       w_i = 1 / num_rows
        seq-mean-token-mean:      w_i = 1 / (num_rows · max(Σ_t m_it, 1))
        seq-mean-token-sum-norm:  w_i = 1 / (num_rows · horizon)

    ``seq-mean-token-sum-norm`` is Dr. GRPO's unbiased aggregation (Liu et al. 2025, arXiv
    2503.20783; verl's name, used by the paper's GRPO baseline): token sums divided by a constant,
    the maximum response length, so that no response's tokens are up- or down-weighted by its
    length. verl divides by the padded width of each micro-batch tensor instead, which varies with
    the batch's longest response (and here with how the trainer trims padding per micro-batch), so
    the same tokens would get different weights in different batches; the constant ``horizon``
    keeps the weight a fixed 1 / (num_rows · horizon), as Dr. GRPO intends.

    Args:
        response_mask: (b, T) response mask of the rows to weight (float, int or bool).
        mode: one of ``LOSS_AGG_MODES``.
        num_rows: rows in the whole mini-batch; None: b (these rows are the mini-batch).
        num_tokens: response tokens in the whole mini-batch, > 0; None: the mask's sum, at least 1.
        horizon: the maximum response length, required by ``seq-mean-token-sum-norm``.

    Returns:
        (b,) weights, float64 for a float64 mask and float32 otherwise, no gradient.

    Raises:
        ValueError: unknown ``mode``, ``response_mask`` not 2-D, non-positive ``num_rows``,
            ``num_tokens`` or ``horizon``, or a missing ``horizon`` for ``seq-mean-token-sum-norm``.
    """
    check_choice("loss_agg", mode, LOSS_AGG_MODES)
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be 2-D (B, T), got shape {tuple(response_mask.shape)}")
    dtype = torch.float64 if response_mask.dtype == torch.float64 else torch.float32
    token_counts = response_mask.to(dtype).sum(dim=-1)
    if num_rows is None:
        num_rows = response_mask.shape[0]
    elif isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
        raise ValueError(f"num_rows must be a positive integer (rows in the mini-batch), got {num_rows!r}")
    if num_tokens is None:
        num_tokens = max(float(token_counts.sum()), 1.0)
    elif not num_tokens > 0:
        raise ValueError(f"num_tokens must be > 0 (response tokens in the mini-batch), got {num_tokens!r}")
    ones = torch.ones_like(token_counts)
    if mode == "token-mean":
        return ones / num_tokens
    if mode == "seq-mean-token-sum":
        return ones / num_rows
    if mode == "seq-mean-token-mean":
        return 1 / (num_rows * token_counts.clamp(min=1))
    if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
        raise ValueError(
            f"loss_agg 'seq-mean-token-sum-norm' needs horizon, the maximum response length, as a "
            f"positive integer; got {horizon!r}"
        )
    return ones / (num_rows * horizon)


def weighted_token_sum(per_token: torch.Tensor, response_mask: torch.Tensor, row_weights: torch.Tensor) -> torch.Tensor:
    """Formula: ``Σ_i w_i Σ_t m_it · per_token_it``.

    Args:
        per_token: (B, T) per-token values, e.g. losses.
        response_mask: (B, T) 1 at response tokens, 0 at padding.
        row_weights: (B,) weights w, e.g. from ``aggregation_weights``; cast to ``per_token``'s dtype.

    Returns:
        0-dim sum, differentiable w.r.t. ``per_token``.
    """
    row_sums = masked_sum(per_token, response_mask)
    check_same_shape(row_sums=row_sums, row_weights=row_weights)
    return (row_weights.to(row_sums.dtype) * row_sums).sum()


def aggregate_loss(
    per_token_loss: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    *,
    num_rows: int | None = None,
    num_tokens: float | None = None,
    horizon: int | None = None,
) -> torch.Tensor:
    """These rows' share of a mini-batch loss under loss aggregation ``mode``.

    Formula: ``L = Σ_i w_i Σ_t m_it ℓ_it`` with w from ``aggregation_weights`` (see there for the
    modes). Called on each micro-batch with the mini-batch's ``num_rows`` and ``num_tokens``, the
    shares sum to the mini-batch loss, in value and gradient. Without them the rows are taken to
    be the whole mini-batch, e.g. token-mean is ``Σ_it m ℓ / Σ_it m``.

    Args:
        per_token_loss: (b, T) per-token losses ℓ.
        response_mask: (b, T) 1 at response tokens, 0 at padding (float, int or bool).
        mode: one of ``LOSS_AGG_MODES``.
        num_rows, num_tokens, horizon: see ``aggregation_weights``.

    Returns:
        0-dim loss, differentiable w.r.t. ``per_token_loss``.

    Raises:
        ValueError: as ``aggregation_weights``, or shapes that differ.
    """
    check_same_shape(per_token_loss=per_token_loss, response_mask=response_mask)
    weights = aggregation_weights(response_mask, mode, num_rows=num_rows, num_tokens=num_tokens, horizon=horizon)
    return weighted_token_sum(per_token_loss, response_mask, weights)


def check_kl_penalty(kl_coef: float, kl_estimator: str, *, in_reward: bool = False) -> None:
    """Raise ValueError unless ``kl_estimator`` can serve as a KL penalty with weight ``kl_coef``.

    ``k1`` is refused as a loss (``kl_coef > 0`` and not ``in_reward``): its expected gradient is
    zero (see ``kl_penalty``), so it adds noise and pulls π_θ nowhere. Subtracted from the reward
    (``in_reward``) an estimate is a constant, not differentiated, and k1 is the classic choice.

    Raises:
        ValueError: an unknown ``kl_estimator``, or ``"k1"`` with ``kl_coef > 0``, naming the valid
            choices.
    """
    check_choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    if kl_estimator == "k1" and kl_coef > 0 and not in_reward:
        raise ValueError(
            f"kl_estimator 'k1' with kl_coef={kl_coef!r}: as a loss on tokens sampled from the policy, "
            "k1 = log π_θ − log π_ref has expected gradient zero (E[∇log π_θ] = 0), so it adds noise and "
            "does not regularise; valid with kl_coef > 0: 'k2' (follows the gradient of KL(π_θ ‖ π_ref)), "
            "'k3' (follows the gradient of KL(π_ref ‖ π_θ); GRPO's default); or subtract k1 from the reward "
            "instead (kl_in_reward=true, the classic PPO-RLHF penalty)"
        )


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Per-token KL estimators between π_θ and the reference π_ref on tokens sampled from π_θ
    (J. Schulman, "Approximating KL divergence", 2020, http://joschu.net/blog/kl-approx.html).

    Formula (δ_it = ref_logprobs_it − logprobs_it = log π_ref(o_it) − log π_θ(o_it) at response
    tokens, δ = 0 at padding, so padding gives exactly 0 and no gradient, whatever its log-probs):
        k1 = −δ                 value: unbiased for KL(π_θ ‖ π_ref), high variance, can be < 0
        k2 = ½ δ²               value: biased, low variance
        k3 = exp(δ) − δ − 1     value: unbiased for KL(π_θ ‖ π_ref), low variance, ≥ 0

    As a loss, back-propagated on samples o ~ π_old = π_θ (the sample itself held fixed), the
    estimators follow different divergences; in expectation over o given its prefix:
        k1:  ∇k1 = ∇log π_θ(o),                        E = 0: no regularisation, only noise
        k2:  ∇k2 = (log π_θ(o) − log π_ref(o)) ∇log π_θ(o),   E = ∇KL(π_θ ‖ π_ref)  (forward)
        k3:  ∇k3 = (1 − π_ref(o)/π_θ(o)) ∇log π_θ(o),        E = ∇KL(π_ref ‖ π_θ)  (reverse; GRPO's)
    so k1 is refused as a penalty (``check_kl_penalty``); k2 and k3 both pull π_θ towards π_ref.
    verl clamps k3 (its ``low_var_kl``) to [−10, 10]; pacs does not: the clamp binds where
    π_ref(o)/π_θ(o) > e^2.6 ≈ 13, on the tokens π_θ has made much rarer than π_ref, and there sets
    the gradient to 0, so the penalty would stop pulling exactly where it is most needed (and
    k3's gradient would no longer be that of KL(π_ref ‖ π_θ)). The paper's baselines use no KL term.

    Args:
        logprobs: (B, T) log-probs under the current policy π_θ.
        ref_logprobs: (B, T) log-probs of the same tokens under the reference policy π_ref.
        response_mask: (B, T) 1 at response tokens, 0 at padding (float, int or bool).
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        (B, T) per-token estimates, exactly 0 at padding positions.

    Raises:
        ValueError: unknown ``estimator`` or shapes that differ.
    """
    check_choice("kl_estimator", estimator, KL_ESTIMATORS)
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs, response_mask=response_mask)
    delta = torch.where(response_mask.bool(), ref_logprobs - logprobs, torch.zeros_like(logprobs))
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return 0.5 * delta**2
    return torch.exp(delta) - delta - 1


def check_rollout_is(
    cap: float | None,
    mode: str = "truncate",
    level: str = "token",
    floor: float | None = None,
    *,
    levels: Sequence[str] = ROLLOUT_IS_LEVELS,
) -> None:
    """Raise ValueError unless the sampler correction's options (``rollout_is_weights``) fit
    together: ``cap`` None (no correction) or a finite C >= 1; ``mode`` one of ``ROLLOUT_IS_MODES``,
    "mask" only with a cap (C is the top of the kept range); ``level`` one of ``levels`` (the
    algorithm's: PACS weighs whole responses, so "sequence" only); ``floor`` None or a number in
    (0, 1], and only with mode "mask" (a floor above 1 would drop on-policy units, whose ratio is 1).
    Each message starts with the option's name."""
    if cap is not None and not (isinstance(cap, (int, float)) and not isinstance(cap, bool) and math.isfinite(cap) and cap >= 1):
        raise ValueError(f"rollout_is_cap must be None (no correction) or a finite number >= 1, got {cap!r}")
    check_choice("rollout_is_mode", mode, ROLLOUT_IS_MODES)
    if level not in levels:
        why = "" if "token" in levels else " (the correction weighs each response's whole gradient coefficient by one ratio)"
        raise ValueError(f"rollout_is_level={level!r} is not valid here; valid: {', '.join(map(repr, levels))}{why}")
    if mode == "mask" and cap is None:
        raise ValueError(
            "rollout_is_mode='mask' needs rollout_is_cap, the top C of the kept range [rollout_is_floor, C] "
            "(None: no correction at all)"
        )
    if floor is None:
        return
    if mode != "mask":
        raise ValueError(
            f"rollout_is_floor={floor!r} with rollout_is_mode={mode!r}: the floor is the bottom of mask mode's kept "
            "range; set rollout_is_mode='mask', or leave rollout_is_floor None"
        )
    if not (isinstance(floor, (int, float)) and not isinstance(floor, bool) and 0 < floor <= 1):
        raise ValueError(
            f"rollout_is_floor must be None (1/rollout_is_cap) or a number in (0, 1] (a floor above 1 would drop "
            f"on-policy units, whose ratio is 1), got {floor!r}"
        )


def rollout_is_weights(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    response_mask: torch.Tensor,
    cap: float,
    *,
    mode: str = "truncate",
    level: str = "token",
    floor: float | None = None,
) -> torch.Tensor:
    """Importance-sampling weights for the sampler mismatch: the responses were sampled by μ (the
    rollout engine), while the losses are written for π_old (the trainer's policy at rollout
    time). Constants.

    Formula (m = ``response_mask``, C = ``cap``, F = ``floor``, 1/C when None):
        ratio ρ   token:     ρ_it = π_old(o_it) / μ(o_it) = exp(old_it − μ_it)                  (B, T)
                  sequence:  ρ_i  = Π_t (π_old(o_it) / μ(o_it))^m_it
                                  = exp(Σ_t m_it · (old_it − μ_it))                            (B,)
        weight w  truncate:  w = min(ρ, C)                 verl's TIS, TRL's `vllm_importance_sampling_correction`
                  mask:      w = ρ · 1[F ≤ ρ ≤ C]          verl's MIS (rollout_is_mode="mask"), IcePop
    and w = 0 at padding (token level). The mask is compared in log space (log F ≤ log ρ ≤ log C),
    so a ratio that would overflow is masked, never inf · 0.

    Which sources, and where pacs differs from them:
    - verl's rollout correction (``verl.trainer.ppo.rollout_corr_helper.compute_rollout_correction_weights``,
      verl 0.9: rollout_is "token" or "sequence"; a rollout_is_threshold "F_C" string is IcePop,
      w = ρ inside [F, C] and 0 outside; a number is TIS) and its earlier ``rollout_is_mode="mask"``
      (MIS, verl docs/advance/rollout_is.md: rollout_is_threshold_lower defaults to 1/upper, as F
      here). That MIS dropped masked units from the loss's token count (its response_mask); here,
      as in verl 0.9's IcePop, a masked unit keeps its place in the loss aggregation with weight 0,
      so masking never rescales the other units' gradients.
    - IcePop (Ring-1T, arXiv 2510.18855): each token's clipped surrogate times
      M(ρ_t) with M(k) = k if k ∈ [α, β] else 0: ``mode="mask"``, ``level="token"``, F = α, C = β.
    - A sequence ratio is a product of T token ratios, so for long responses it spreads over many
      orders of magnitude: a mask's floor drops many of them, and a truncated weight can drift towards 0.

    Args:
        old_logprobs, sampler_logprobs: (B, T) log-probs of the response tokens under π_old and μ.
        response_mask: (B, T) 1 at response tokens.
        cap: C >= 1.
        mode: "truncate" or "mask" (``ROLLOUT_IS_MODES``).
        level: "token" (weights (B, T)) or "sequence" (one per response, (B,)).
        floor: F in (0, 1] with mode "mask"; None: 1/C.

    Returns:
        (B, T) or (B,) weights in [0, C], in the wider of the inputs' dtypes and float32.
    """
    check_rollout_is(cap, mode, level, floor)
    check_same_shape(old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs, response_mask=response_mask)
    dtype = torch.promote_types(torch.promote_types(old_logprobs.dtype, sampler_logprobs.dtype), torch.float32)
    mask = response_mask.to(dtype)
    log_ratio = (old_logprobs.detach().to(dtype) - sampler_logprobs.detach().to(dtype)) * mask
    if level == "sequence":
        log_ratio, mask = log_ratio.sum(dim=-1), torch.ones_like(mask[:, 0])
    if mode == "truncate":
        return log_ratio.exp().clamp(max=cap) * mask
    low = math.log(1 / cap if floor is None else floor)
    kept = (log_ratio >= low) & (log_ratio <= math.log(cap)) & mask.bool()
    return torch.where(kept, log_ratio.exp(), torch.zeros_like(log_ratio))


def sampler_correction_sums(
    weights: torch.Tensor, old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, response_mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, float]:
    """What this share of a step contributes to the correction's diagnostics
    (``sampler_correction_metrics``): sums that add up over processes, and a maximum.

    The units u are those the weights w come in: responses for (B,) weights (PACS; the sequence
    level), response tokens for (B, T) weights (the token level). ρ_u is a unit's ratio π_old/μ
    before truncation or masking: exp(Σ_t m_it (old_it − μ_it)) per response, exp(old_it − μ_it)
    per token. A unit is truncated when ρ_u > C and its weight is not 0 (truncate mode: w_u = C),
    masked when its weight is 0 (mask mode: ρ_u outside [F, C]; truncate mode: only a ratio that
    underflowed to 0), so the counts follow the applied weights, whichever mode made them. With
    δ_t = log π_old(o_t) − log μ(o_t) at response tokens, k3_t = exp(δ_t) − δ_t − 1 ≥ 0 estimates
    KL(μ ‖ π_old) from μ's samples (``kl_penalty``'s k3 with π_old in place of π_ref).

    Args:
        weights: (B,) or (B, T) applied weights w (``rollout_is_weights``).
        old_logprobs, sampler_logprobs, response_mask: (B, T).
        cap: the truncation C.

    Returns:
        (7,) float64 [#u, Σ_u w_u, Σ_u w_u², #truncated, Σ_t k3_t, #tokens, #masked], and
        max_u log ρ_u (−inf when there is no unit).
    """
    check_same_shape(old_logprobs=old_logprobs, sampler_logprobs=sampler_logprobs, response_mask=response_mask)
    is_response = response_mask.bool()
    delta = torch.where(is_response, old_logprobs.double() - sampler_logprobs.to(old_logprobs.device).double(), 0.0)
    if weights.dim() == 1:
        check_same_shape(weights=weights, rows=delta[:, 0])
        log_ratios, applied = delta.sum(dim=-1), weights.double()
    else:
        check_same_shape(weights=weights, delta=delta)
        log_ratios, applied = delta[is_response], weights.double()[is_response]
    k3 = torch.where(is_response, delta.exp() - delta - 1, 0.0)
    truncated = ((log_ratios > math.log(cap)) & (applied > 0)).sum()
    masked = (applied == 0).sum()
    sums = [applied.numel(), applied.sum(), applied.square().sum(), truncated, k3.sum(), is_response.sum(), masked]
    log_ratio_max = float(log_ratios.max()) if log_ratios.numel() else -math.inf
    return torch.tensor([float(value) for value in sums], dtype=torch.float64), log_ratio_max


def sampler_correction_metrics(sums: torch.Tensor, log_ratio_max: float) -> dict[str, float]:
    """The correction's diagnostics from ``sampler_correction_sums`` (summed over processes; the
    maximum over them), N = #u units:

        rollout_is/weight_mean          Σ_u w_u / N                      (1 when μ = π_old)
        rollout_is/ratio_max            max_u ρ_u before truncation      (log clamped at MAX_LOG_RATIO)
        rollout_is/truncated_fraction   #{u : ρ_u > C, w_u > 0} / N      (0 in mask mode)
        rollout_is/masked_fraction      #{u : w_u = 0} / N               (mask mode: ρ_u outside [F, C])
        rollout_is/ess                  (Σ_u w_u)² / (N · Σ_u w_u²) ∈ (0, 1], the effective sample
                                        size as a fraction of N (1: equal weights); nan when all w are 0
        rollout_is/sampler_kl           Σ_t k3_t / #tokens, KL(μ ‖ π_old) per response token

    Returns: those six floats (nan where a denominator is 0: the logger writes null).
    """
    units, weight_sum, weight_square_sum, truncated, kl_sum, tokens, masked = sums.tolist()

    def ratio(numerator: float, denominator: float) -> float:
        return numerator / denominator if denominator else math.nan

    return {
        "rollout_is/weight_mean": ratio(weight_sum, units),
        "rollout_is/ratio_max": math.exp(min(log_ratio_max, MAX_LOG_RATIO)) if units else math.nan,
        "rollout_is/truncated_fraction": ratio(truncated, units),
        "rollout_is/masked_fraction": ratio(masked, units),
        "rollout_is/ess": ratio(weight_sum**2, units * weight_square_sum),
        "rollout_is/sampler_kl": ratio(kl_sum, tokens),
    }
