"""The section of the built-in algorithm `ppo` (PPO, `pacs.algos.ppo`): its options, found by
`pacs.config.algorithms.registry` as every module of this package is."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pacs.algos.aggregation import LossAggregation
from pacs.algos.ppo import PPO
from pacs.config.algorithms.base import ClippedPolicyGradientConfig


class PpoConfig(ClippedPolicyGradientConfig):
    builds = PPO

    name: Literal["ppo"] = "ppo"
    """PPO: GAE advantages from a learned critic (settings under `critic`; `pacs.algos.ppo`)."""
    gamma: float = Field(1.0, ge=0, le=1)
    """GAE's discount γ."""
    lam: float = Field(1.0, ge=0, le=1)
    """GAE's λ."""
    value_clip: float | None = Field(0.5, gt=0, allow_inf_nan=False)
    """Clip range of the critic's values around their rollout-time values; None: no clipping."""
    critic_loss_agg: LossAggregation = "token-mean"
    """How the per-token value loss ½·max((V − G)², (V_clipped − G)²) is aggregated."""
    critic_loss_scale: float = Field(1.0, gt=0, allow_inf_nan=False)
    """Multiplies the value loss (16 for the paper's verl critic: 2 for its missing ½, times 8)."""
