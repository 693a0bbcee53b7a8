"""GSPO: group sequence policy optimisation (Zheng et al. 2025, arXiv 2507.18071).

The reward is given to a whole response, so GSPO clips and weights whole responses: one
importance ratio per response, the geometric mean of its tokens' ratios, and a sequence-level
mean over the group.

    A_i  = (R_i − mean_j R_j) / (std_j R_j + ε)                     GRPO's (std unbiased, ε = 1e-6)
    s_i  = (π_θ(o_i) / π_old(o_i))^(1/|o_i|) = exp(1/|o_i| · Σ_t m_it (log π_θ(o_it) − log π_old(o_it)))
    ℓ_i  = max(−A_i s_i, −A_i clip(s_i, 1 − ε_low, 1 + ε_high))     ε_low = 3e-4, ε_high = 4e-4
    L    = 1/B · Σ_i ℓ_i                                             ``seq-mean-token-mean``

j runs over the group of i (rows ``[g*n, (g+1)*n)`` answer prompt g), |o_i| = Σ_t m_it. The
gradient of an unclipped response is −A_i s_i · 1/|o_i| · Σ_t ∇log π_θ(o_it): every token of a
response weighs alike. The clip range is tiny because s_i is a per-token geometric mean (the paper's
3e-4 / 4e-4).

Per token the loss is ℓ_it = ℓ_i at every response token, so that any loss aggregation applies:
with ``seq-mean-token-mean`` (the default, the paper's) L is the formula above, and for every
aggregation the gradient equals that of verl's token form, ℓ_it = −A_i · sg(s_i) · π_θ(o_it) /
sg(π_θ(o_it)) (verl's ``gspo`` policy loss; TRL's ``importance_sampling_level="sequence"``). The
optional dual clip c acts on s_i as PPO's acts on ρ. |log s_i| is clamped at 20 as
``surrogates.clipped_surrogate`` clamps log ρ.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from pacs.algos.aggregation import LossAggregation
from pacs.algos.masks import check_same_shape, masked_sum
from pacs.algos.options import ClippedPolicyGradientConfig
from pacs.algos.pg import ClippedPolicyGradient
from pacs.algos.surrogates import clipped_surrogate


def sequence_clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO's clipped surrogate with one length-normalised ratio per response, as a per-token loss.

    Formula (m = ``response_mask``, |o_i| = max(Σ_t m_it, 1)):
        log s_i = Σ_t m_it (logprobs_it − old_logprobs_it) / |o_i|
        ℓ_it    = ``surrogates.clipped_surrogate`` of the one-token rows (log s_i, A_i), at every t

    Metrics: "clip_fraction", the fraction of responses whose loss clipping changed; "approx_kl",
    the mean over responses of k3 = s_i − 1 − log s_i (per-token KL(π_old ‖ π_θ), to first order).

    Args:
        logprobs: (B, T) log-probs of the response tokens under the current policy π_θ.
        old_logprobs: (B, T) log-probs under the rollout policy π_old, constants.
        advantages: (B,) per-response advantages A, constants.
        response_mask: (B, T) 1 at response tokens, 0 at padding (float, int or bool).
        clip_low, clip_high, dual_clip: see ``surrogates.clipped_surrogate``.

    Returns:
        (B, T) per-token losses ℓ (the row's ℓ_i at every position), and the metrics as floats.

    Raises:
        ValueError: shapes that differ, ``advantages`` not (B,), or invalid clip values.
    """
    check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs, response_mask=response_mask)
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(
            f"GSPO's advantages are one per response, shape (B,) = {tuple(logprobs.shape[:1])}; got {tuple(advantages.shape)}"
        )
    lengths = response_mask.to(logprobs.dtype).sum(dim=-1).clamp(min=1)
    log_sequence_ratio = masked_sum(logprobs - old_logprobs, response_mask) / lengths
    per_response, metrics = clipped_surrogate(
        log_sequence_ratio.unsqueeze(-1),
        torch.zeros_like(log_sequence_ratio).unsqueeze(-1),
        advantages,
        torch.ones_like(log_sequence_ratio).unsqueeze(-1),
        clip_low=clip_low,
        clip_high=clip_high,
        dual_clip=dual_clip,
    )
    return per_response.expand_as(logprobs), metrics


class GSPO(ClippedPolicyGradient):
    """GSPO as a trainer plug-in: GRPO's advantages (``ClippedPolicyGradient.prepare_step``), the
    sequence-level clipped surrogate (``sequence_clipped_surrogate``), ``seq-mean-token-mean``.

    Its options are its constructor's keywords, each described in the configuration reference
    (docs/reference/configuration.md, generated from its section below, `pacs.algos.gspo.GspoConfig`).
    """

    min_group_size = 2
    per_token_loss = staticmethod(sequence_clipped_surrogate)

    def __init__(
        self,
        group_size: int,
        *,
        clip_low: float = 3e-4,
        clip_high: float = 4e-4,
        loss_agg: str = "seq-mean-token-mean",
        **options,
    ):
        super().__init__(group_size, clip_low=clip_low, clip_high=clip_high, loss_agg=loss_agg, **options)

    def metric_weights(self, minibatch) -> dict[str, float]:
        """`ClippedPolicyGradient.metric_weights` without "actor/clip_fraction" and
        "actor/approx_kl": GSPO's are means over responses (one ratio each), which every rank holds
        equally many of (`sequence_clipped_surrogate`)."""
        weights = super().metric_weights(minibatch)
        return {key: value for key, value in weights.items() if key not in ("actor/clip_fraction", "actor/approx_kl")}


class GspoConfig(ClippedPolicyGradientConfig):
    builds = GSPO

    name: Literal["gspo"] = "gspo"
    """GSPO: one length-normalised importance ratio per response, clipped per response
    (`pacs.algos.gspo`)."""
    clip_low: float = Field(3e-4, gt=0, lt=1)
    """ε_low of the sequence ratio's clip range (the paper: 3e-4)."""
    clip_high: float = Field(4e-4, gt=0, allow_inf_nan=False)
    """ε_high of the sequence ratio's clip range (the paper: 4e-4)."""
    loss_agg: LossAggregation = "seq-mean-token-mean"
    """How per-token losses are aggregated (GSPO: seq-mean-token-mean, a mean over responses)."""
