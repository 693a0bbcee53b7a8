"""DAPO: decoupled clip and dynamic sampling policy optimisation (Yu et al. 2025, arXiv 2503.14476).

GRPO's group-normalised advantages, without a KL term, with four changes; the objective's two are
this module, the other two are options every algorithm of pacs can use:

    A_i  = (R_i − mean_j R_j) / (std_j R_j + ε)      GRPO's (std unbiased, ε = 1e-6)
    ρ_it = π_θ(o_it) / π_old(o_it)
    ℓ_it = max(−A_i ρ_it, −A_i clip(ρ_it, 1 − ε_low, 1 + ε_high))
                                      1. clip-higher: ε_low = 0.2, ε_high = 0.28 (decoupled), so that
                                         unlikely tokens of good answers can gain probability
    L    = 1 / Σ_i |o_i| · Σ_i Σ_t m_it ℓ_it
                                      2. token-level loss (``token-mean`` over the mini-batch): each
                                         token weighs the same, however long its response
    3. dynamic sampling (``rollout.dynamic_sampling``, the trainer's): prompts are drawn again until
       the step holds ``train.batch_size`` groups whose rewards are not all equal, up to
       ``rollout.max_sampling_rounds`` rounds (``pacs.train.dynamic_sampling``)
    4. overlong reward shaping (``overlong_buffer`` L_cache, ``overlong_penalty`` p; the options of
       every algorithm): R_i ← R_i + p · R_length(o_i) ∈ [R_i − p, R_i], the penalty growing linearly
       over the last L_cache tokens before the maximum length (``shaping.overlong_penalty``)

j runs over the group of i (rows ``[g*n, (g+1)*n)`` answer prompt g), m is the response mask. The
paper's rewards are ±1 and pacs's 0/1: the same relative length penalty is p = 0.5 here for the
paper's p = 1 (advantages are scale-free, the penalty is not). TRL's ``loss_type="dapo"`` and verl's
vanilla policy loss with ``loss_agg_mode="token-mean"`` and ``clip_ratio_high=0.28`` compute this
objective (verl adds its dual clip, ``clip_ratio_c = 3``, which DAPO does not have).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pacs.algos.aggregation import LossAggregation
from pacs.algos.options import ClippedPolicyGradientConfig
from pacs.algos.pg import ClippedPolicyGradient


class DAPO(ClippedPolicyGradient):
    """DAPO's objective as a trainer plug-in: GRPO's advantages (``ClippedPolicyGradient.prepare_step``),
    clip-higher, token-level loss.

    Its options are its constructor's keywords, each described in the configuration reference
    (docs/reference/configuration.md, generated from its section below, `pacs.algos.dapo.DapoConfig`).
    """

    min_group_size = 2

    def __init__(self, group_size: int, *, clip_high: float = 0.28, loss_agg: str = "token-mean", **options):
        super().__init__(group_size, clip_high=clip_high, loss_agg=loss_agg, **options)


class DapoConfig(ClippedPolicyGradientConfig):
    builds = DAPO

    name: Literal["dapo"] = "dapo"
    """DAPO's objective: GRPO's advantages, clip-higher, token-level loss (`pacs.algos.dapo`); its
    dynamic sampling is rollout.dynamic_sampling, its overlong shaping algorithm.overlong_buffer."""
    clip_high: float = Field(0.28, gt=0, allow_inf_nan=False)
    """ε_high: the probability ratio is clipped above at 1 + clip_high (DAPO's clip-higher: 0.28)."""
    loss_agg: LossAggregation = "token-mean"
    """How per-token losses are aggregated (DAPO: token-mean, every token of the mini-batch alike)."""
