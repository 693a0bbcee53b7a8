"""The section of the built-in algorithm `grpo` (GRPO, `pacs.algos.grpo`): its options, found by
`pacs.config.algorithms.registry` as every module of this package is."""

from __future__ import annotations

from typing import Literal

from pacs.algos.grpo import GRPO
from pacs.config.algorithms.base import ClippedPolicyGradientConfig


class GrpoConfig(ClippedPolicyGradientConfig):
    builds = GRPO

    name: Literal["grpo"] = "grpo"
    """GRPO: group-normalised outcome rewards as every token's advantage (`pacs.algos.grpo`)."""
    norm_by_std: bool = True
    """Divide group-centred rewards by the group's standard deviation."""
