"""The section of the built-in algorithm `dapo` (DAPO, `pacs.algos.dapo`): its options, found by
`pacs.config.algorithms.registry` as every module of this package is."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pacs.algos.aggregation import LossAggregation
from pacs.algos.dapo import DAPO
from pacs.config.algorithms.base import ClippedPolicyGradientConfig


class DapoConfig(ClippedPolicyGradientConfig):
    builds = DAPO

    name: Literal["dapo"] = "dapo"
    """DAPO's objective: GRPO's advantages, clip-higher, token-level loss (`pacs.algos.dapo`); its
    dynamic sampling is rollout.dynamic_sampling, its overlong shaping algorithm.overlong_buffer."""
    clip_high: float = Field(0.28, gt=0, allow_inf_nan=False)
    """ε_high: the probability ratio is clipped above at 1 + clip_high (DAPO's clip-higher: 0.28)."""
    loss_agg: LossAggregation = "token-mean"
    """How per-token losses are aggregated (DAPO: token-mean, every token of the mini-batch alike)."""
