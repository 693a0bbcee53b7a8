"""The section of the built-in algorithm `dr_grpo` (Dr. GRPO, `pacs.algos.dr_grpo`): its options, found by
`pacs.config.algorithms.registry` as every module of this package is."""

from __future__ import annotations

from typing import Literal

from pacs.algos.dr_grpo import DrGRPO
from pacs.config.algorithms.base import ClippedPolicyGradientConfig


class DrGrpoConfig(ClippedPolicyGradientConfig):
    builds = DrGRPO

    name: Literal["dr_grpo"] = "dr_grpo"
    """Dr. GRPO: group-centred rewards (no std division) and a constant token-sum divisor
    (`pacs.algos.dr_grpo`)."""
