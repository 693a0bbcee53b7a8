"""The sampler correction: importance weights between the policy the trainer recomputes (π_old)
and the one that sampled the responses (a vLLM engine's, or an older policy's with asynchronous
rollouts), truncated or masked (verl's TIS and MIS, IcePop), and the diagnostics logged for it.
"""

from __future__ import annotations

import math
import typing
import warnings
from collections.abc import Sequence
from typing import Literal

import torch

from pacs.algos.masks import check_choice, check_same_shape
from pacs.algos.surrogates import MAX_LOG_RATIO

RolloutIsMode = Literal["truncate", "mask"]
"""How the sampler correction bounds a ratio (``rollout_is_weights``): truncated at the cap, or masked outside a range."""


ROLLOUT_IS_MODES: tuple[str, ...] = typing.get_args(RolloutIsMode)


RolloutIsLevel = Literal["token", "sequence", "geometric_mean"]
"""What one sampler-correction weight covers (``rollout_is_weights``): a token, or a whole response
(the product of its tokens' ratios, or their geometric mean)."""


ROLLOUT_IS_LEVELS: tuple[str, ...] = typing.get_args(RolloutIsLevel)

ESS_WARNING_BELOW = 0.5
"""`sampler_correction_metrics` warns when rollout_is/ess, the effective sample size over N, falls
below this. The weighted estimate's variance is about that of an unweighted one over ESS units
(Kish), so below 1/2 the correction costs more than half the batch: a lognormal ratio of
sd(log ρ) = σ has ESS/N = exp(−σ²) before truncation, 1/2 at σ ≈ 0.83, which a long response's
sequence ratio passes easily (rollout_is_level=geometric_mean keeps it near 1)."""


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
    algorithm's: PACS weighs whole responses, so "sequence" or "geometric_mean"); ``floor`` None or a number in
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
                  geometric_mean:
                             ρ_i  = exp(Σ_t m_it · (old_it − μ_it) / max(Σ_t m_it, 1))         (B,)
                                  the per-token geometric mean of the sequence ratio, as AReaL's
                                  and OpenRLHF's sequence-level masks use
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
      Its geometric mean stays near 1 whatever T (sd(log ρ) shrinks as 1/√T for independent tokens):
      a weight per response that holds up for long responses, no longer an unbiased ratio of the
      two policies' response probabilities.

    Args:
        old_logprobs, sampler_logprobs: (B, T) log-probs of the response tokens under π_old and μ.
        response_mask: (B, T) 1 at response tokens.
        cap: C >= 1.
        mode: "truncate" or "mask" (``ROLLOUT_IS_MODES``).
        level: "token" (weights (B, T)), "sequence" or "geometric_mean" (one per response, (B,)).
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
    elif level == "geometric_mean":
        log_ratio, mask = log_ratio.sum(dim=-1) / mask.sum(dim=-1).clamp(min=1), torch.ones_like(mask[:, 0])
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
    and geometric_mean levels), response tokens for (B, T) weights (the token level). ρ_u is a
    unit's ratio π_old/μ before truncation or masking: exp(Σ_t m_it (old_it − μ_it)) per response
    (the sequence ratio, whatever the level), exp(old_it − μ_it) per token. A unit is truncated
    when its weight is C (truncate mode: ρ_u ≥ C at the unit's level),
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
    truncated = (
        applied >= float(torch.tensor(cap, dtype=weights.dtype))
    ).sum()  # C as the weights hold it (min(ρ, C) in float32)
    masked = (applied == 0).sum()
    sums: list[int | torch.Tensor] = [
        applied.numel(),
        applied.sum(),
        applied.square().sum(),
        truncated,
        k3.sum(),
        is_response.sum(),
        masked,
    ]
    log_ratio_max = float(log_ratios.max()) if log_ratios.numel() else -math.inf
    return torch.tensor([float(value) for value in sums], dtype=torch.float64), log_ratio_max


def sampler_correction_metrics(sums: torch.Tensor, log_ratio_max: float) -> dict[str, float]:
    """The correction's diagnostics from ``sampler_correction_sums`` (summed over processes; the
    maximum over them), N = #u units:

        rollout_is/weight_mean          Σ_u w_u / N                      (1 when μ = π_old)
        rollout_is/ratio_max            max_u ρ_u before truncation      (log clamped at MAX_LOG_RATIO)
        rollout_is/truncated_fraction   #{u : w_u = C} / N               (truncate mode: ρ ≥ C)
        rollout_is/masked_fraction      #{u : w_u = 0} / N               (mask mode: ρ_u outside [F, C])
        rollout_is/ess                  (Σ_u w_u)² / (N · Σ_u w_u²) ∈ (0, 1], the effective sample
                                        size as a fraction of N (1: equal weights); nan when all w are 0;
                                        below ESS_WARNING_BELOW a warning says so
        rollout_is/sampler_kl           Σ_t k3_t / #tokens, KL(μ ‖ π_old) per response token

    Returns: those six floats (nan where a denominator is 0: the logger writes null).

    Warns (UserWarning): rollout_is/ess < ESS_WARNING_BELOW, with what to change (one message, so
    Python's default filter shows it once per process).
    """
    units, weight_sum, weight_square_sum, truncated, kl_sum, tokens, masked = sums.tolist()

    def ratio(numerator: float, denominator: float) -> float:
        return numerator / denominator if denominator else math.nan

    ess = ratio(weight_sum**2, units * weight_square_sum)
    if ess < ESS_WARNING_BELOW:
        warnings.warn(
            f"rollout_is/ess < {ESS_WARNING_BELOW}: the sampler correction's weights leave less than half the batch's "
            "effective size (the sampler μ is far from π_old; the metric logs each step's value, this warning shows "
            "once); lower rollout.max_staleness, or set algorithm.rollout_is_level=geometric_mean for long responses",
            stacklevel=2,
        )
    return {
        "rollout_is/weight_mean": ratio(weight_sum, units),
        "rollout_is/ratio_max": math.exp(min(log_ratio_max, MAX_LOG_RATIO)) if units else math.nan,
        "rollout_is/truncated_fraction": ratio(truncated, units),
        "rollout_is/masked_fraction": ratio(masked, units),
        "rollout_is/ess": ess,
        "rollout_is/sampler_kl": ratio(kl_sum, tokens),
    }
