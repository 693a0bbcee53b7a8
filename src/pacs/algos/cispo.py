"""CISPO: clipped importance-sampling-weight policy optimisation (MiniMax 2025, "MiniMax-M1",
arXiv 2506.13585, section 3.1).

PPO's clip zeroes the gradient of every token whose ratio left the clip range, and those are often
the rare tokens of a reasoning turn ("However", "Wait") that the update most needs. CISPO keeps
every token's gradient and clips its importance weight instead, as a constant:

    A_i    = (R_i − mean_j R_j) / (std_j R_j + ε)                   GRPO's (std unbiased, ε = 1e-6)
    ρ_it   = π_θ(o_it) / π_old(o_it)
    r̂_it   = clip(ρ_it, 1 − ε_low, 1 + ε_high)
    ℓ_it   = −sg(r̂_it) · A_i · log π_θ(o_it)                        sg: no gradient through r̂
    L      = 1 / Σ_i |o_i| · Σ_i Σ_t m_it ℓ_it                       ``token-mean``

so ∇ℓ_it = −r̂_it A_i ∇log π_θ(o_it): REINFORCE with a truncated importance weight. The paper sets
no lower bound (ε_low "large": here ε_low = 1, the bound 1 − ε_low = 0) and tunes the upper one;
the default ε_high = 4 caps r̂ at 5, ScaleRL's ε_max (arXiv 2510.13786) that TRL recommends. j runs
over the group of i (rows ``[g*n, (g+1)*n)`` answer prompt g), m is the response mask. verl's
``cispo`` policy loss computes this ℓ; TRL's ``loss_type="cispo"`` the same with no lower bound and
its ``epsilon_high`` the cap itself (1 + ε_high here). There is no dual clip: nothing is clipped
away. The loss's value depends on log π_θ itself, not only on ρ (it is not a surrogate objective's
value); its gradient is the point.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from pacs.algos.aggregation import LossAggregation
from pacs.algos.masks import masked_mean
from pacs.algos.options import ClippedPolicyGradientConfig
from pacs.algos.pg import ClippedPolicyGradient
from pacs.algos.surrogates import MAX_LOG_RATIO, check_clip_range, per_token_advantages


def cispo_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO's per-token loss with the clipped importance weight held constant.

    Formula: ℓ_it = −sg(clip(ρ_it, 1 − clip_low, 1 + clip_high)) · A_it · logprobs_it, with
    ρ_it = exp(clamp(logprobs_it − old_logprobs_it, −20, 20)); 0 at padding, whatever the log-probs
    there.

    Metrics, over response tokens: "clip_fraction", the fraction whose weight was clipped (ρ ≠ r̂);
    "approx_kl", the mean of k3 = ρ − 1 − log ρ (KL(π_old ‖ π_θ)).

    Args:
        logprobs: (B, T) log-probs of the response tokens under the current policy π_θ.
        old_logprobs: (B, T) log-probs under the rollout policy π_old, constants.
        advantages: (B,) per response or (B, T) per token, constants.
        response_mask: (B, T) 1 at response tokens, 0 at padding (float, int or bool).
        clip_low: ε_low in (0, 1] (1: no lower bound).
        clip_high: ε_high > 0.

    Returns:
        (B, T) per-token losses ℓ, and the metrics as floats.

    Raises:
        ValueError: invalid clip values, shapes that differ, or ``advantages`` neither (B,) nor (B, T).
    """
    check_clip_range(clip_low, clip_high)
    token_advantages = per_token_advantages(logprobs, old_logprobs, advantages, response_mask)
    is_response = response_mask.bool()
    log_ratio = torch.where(is_response, logprobs - old_logprobs, torch.zeros_like(logprobs)).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    ratio = log_ratio.exp().detach()
    weight = ratio.clamp(1 - clip_low, 1 + clip_high)
    response_logprobs = torch.where(is_response, logprobs, torch.zeros_like(logprobs))
    losses = -weight * token_advantages * response_logprobs
    with torch.no_grad():
        metrics = {
            "clip_fraction": float(masked_mean((weight != ratio).to(ratio.dtype).flatten(), is_response.flatten())),
            "approx_kl": float(masked_mean((ratio - 1 - log_ratio).flatten(), is_response.flatten())),
        }
    return losses, metrics


class CISPO(ClippedPolicyGradient):
    """CISPO as a trainer plug-in: GRPO's advantages (``ClippedPolicyGradient.prepare_step``), the
    clipped-weight REINFORCE loss (``cispo_surrogate``), ``token-mean``.

    ``clip_low`` and ``clip_high`` bound the importance weight, and there is no dual clip. Its
    options are its constructor's keywords, each described in the configuration reference
    (docs/reference/configuration.md, generated from its section below, `pacs.algos.cispo.CispoConfig`).
    """

    min_group_size = 2
    per_token_loss = staticmethod(cispo_surrogate)
    surrogate_needs_logprobs = True

    def __init__(
        self,
        group_size: int,
        *,
        clip_low: float = 1.0,
        clip_high: float = 4.0,
        loss_agg: str = "token-mean",
        dual_clip: None = None,
        **options,
    ):
        if dual_clip is not None:
            raise ValueError(f"CISPO has no dual clip (no token's gradient is clipped away); got dual_clip={dual_clip!r}")
        super().__init__(group_size, clip_low=clip_low, clip_high=clip_high, loss_agg=loss_agg, **options)


class CispoConfig(ClippedPolicyGradientConfig):
    builds = CISPO

    name: Literal["cispo"] = "cispo"
    """CISPO: REINFORCE with each token's importance weight clipped and held constant
    (`pacs.algos.cispo`)."""
    clip_low: float = Field(1.0, gt=0, le=1)
    """The importance weight is clipped below at 1 − clip_low (1: no lower bound, as the paper)."""
    clip_high: float = Field(4.0, gt=0, allow_inf_nan=False)
    """The importance weight is clipped above at 1 + clip_high (4: ScaleRL's cap of 5)."""
    loss_agg: LossAggregation = "token-mean"
    """How per-token losses are aggregated (CISPO: token-mean)."""
    dual_clip: None = None
    """CISPO has no dual clip: no token's gradient is clipped away."""
