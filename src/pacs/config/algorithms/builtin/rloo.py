"""The section of the built-in algorithm `rloo` (RLOO, `pacs.algos.rloo`): its options, found by
`pacs.config.algorithms.registry` as every module of this package is."""

from __future__ import annotations

from typing import Literal

from pacs.algos.rloo import RLOO
from pacs.config.algorithms.base import ClippedPolicyGradientConfig


class RlooConfig(ClippedPolicyGradientConfig):
    builds = RLOO

    name: Literal["rloo"] = "rloo"
    """RLOO: each reward minus the mean of the others to its prompt as the advantage (`pacs.algos.rloo`)."""
