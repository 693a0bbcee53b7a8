"""The section of the built-in algorithm `cispo` (CISPO, `pacs.algos.cispo`): its options, found by
`pacs.config.algorithms.registry` as every module of this package is."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pacs.algos.aggregation import LossAggregation
from pacs.algos.cispo import CISPO
from pacs.config.algorithms.base import ClippedPolicyGradientConfig


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
