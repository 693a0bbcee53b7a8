"""The clipped policy-gradient surrogate shared by GRPO, RLOO, the 2025 baselines and PPO
(``pacs.algos.pg``, ``ppo``):

    ℓ_it = max(−A_it ρ_it, −A_it clip(ρ_it, 1 − ε_low, 1 + ε_high)),
    ρ_it = exp(log π_θ(o_it) − log π_old(o_it)); dual clip: for A < 0, ℓ_it = min(ℓ_it, −c · A_it)
"""

from __future__ import annotations

import math

import torch

from pacs.algos.masks import check_same_shape, masked_mean

MAX_LOG_RATIO = 20.0
"""|log ρ| is clamped here before exponentiating so that ρ stays finite (e^20 ≈ 4.9e8); a token
beyond it gets no gradient. verl (the paper's code, ritzz-ai/PACS at 432f9e) does not clamp."""


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
