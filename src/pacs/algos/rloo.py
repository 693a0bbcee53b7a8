"""RLOO: REINFORCE with a leave-one-out baseline (Kool et al. 2019; Ahmadian et al. 2024, arXiv
2402.14740).

Each response's advantage is its reward minus the mean reward of the other responses to its
prompt, shared by all of its tokens:

    A_i = R_i − 1/(n−1) · Σ_{j≠i} R_j  =  n/(n−1) · (R_i − mean_j R_j)

and the policy follows PPO's clipped surrogate on A (``pacs.algos.pg``). j runs over the group of
i; rows ``[g*n, (g+1)*n)`` of every batch belong to prompt g. On the first update after a rollout
the PACS gradient is β times this one (``tests/algos/test_algos_property.py``).
"""

from __future__ import annotations

from typing import Literal

import torch

from pacs.algos.groups import check_group_size, leave_one_out_centred
from pacs.algos.options import ClippedPolicyGradientConfig
from pacs.algos.pg import ClippedPolicyGradient


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Leave-one-out advantages, constants (no gradient).

    Formula: A_i = R_i − 1/(n−1) · Σ_{j≠i} R_j over the n = ``group_size`` rows of the group of i.

    Args:
        rewards: (B,) rewards R, B a multiple of ``group_size``.
        group_size: responses per prompt n, at least 2 (the baseline of n = 1 is undefined).

    Returns:
        (B,) advantages, at least float32.

    Raises:
        ValueError: ``group_size < 2``, ``rewards`` not 1-D, or B not a multiple of ``group_size``.
    """
    check_group_size(group_size, 2, "RLOO's leave-one-out baseline")
    rewards = rewards.detach().to(torch.promote_types(rewards.dtype, torch.float32))
    return leave_one_out_centred(rewards, group_size)


class RLOO(ClippedPolicyGradient):
    """RLOO as a trainer plug-in: ``rloo_advantages`` per step, then the clipped policy gradient.

    Its options are its constructor's keywords, each described in the configuration reference
    (docs/reference/configuration.md, generated from its section below, `pacs.algos.rloo.RlooConfig`).
    """

    min_group_size = 2

    def prepare_step(self, batch, sum_over_ranks=None) -> dict[str, torch.Tensor]:
        """{"advantages": (B,) ``rloo_advantages`` of the step's ``sequence_rewards``} (and the
        ``rollout_is_terms``)."""
        return {**self.rollout_is_terms(batch), "advantages": rloo_advantages(self.sequence_rewards(batch), self.group_size)}


class RlooConfig(ClippedPolicyGradientConfig):
    builds = RLOO

    name: Literal["rloo"] = "rloo"
    """RLOO: each reward minus the mean of the others to its prompt as the advantage (`pacs.algos.rloo`)."""
