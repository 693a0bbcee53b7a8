"""The section of the built-in algorithm `gspo` (GSPO, `pacs.algos.gspo`): its options, found by
`pacs.config.algorithms.registry` as every module of this package is."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pacs.algos.aggregation import LossAggregation
from pacs.algos.gspo import GSPO
from pacs.config.algorithms.base import ClippedPolicyGradientConfig


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
