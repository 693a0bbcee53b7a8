"""GRPO: group-relative policy optimisation (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300).

For each prompt the policy samples a group of n responses with outcome rewards R; each response's
advantage is its reward relative to the group, shared by all of its tokens:

    A_i = (R_i − mean_j R_j) / (std_j R_j + ε)     std unbiased (divides by n − 1), as torch.std and verl
    A_i =  R_i − mean_j R_j                          with norm_by_std=False (Dr. GRPO, arXiv 2503.20783)

and the policy follows PPO's clipped surrogate on A (``pacs.algos.pg``), by default with the Dr. GRPO
aggregation ``seq-mean-token-sum-norm`` that the paper's GRPO baseline used. j runs over the group
of i; rows ``[g*n, (g+1)*n)`` of every batch belong to prompt g.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from pacs.algos.groups import GRPO_STD_EPS, check_group_size, group_normalised
from pacs.algos.options import ClippedPolicyGradientConfig
from pacs.algos.pg import ClippedPolicyGradient


def check_std_eps(eps: float) -> None:
    """Raise ValueError unless ``eps``, added to a group's std, is a finite number > 0."""
    if not (math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0 (added to the group's reward std), got {eps!r}")


def grpo_advantages(
    rewards: torch.Tensor, group_size: int, *, norm_by_std: bool = True, eps: float = GRPO_STD_EPS
) -> torch.Tensor:
    """Group-normalised advantages, constants (no gradient).

    Formula (mean and std over the n = ``group_size`` rows of the group of i):
        norm_by_std:  A_i = (R_i − mean_j R_j) / (std_j R_j + eps),  std unbiased (divides by n − 1)
        otherwise:    A_i =  R_i − mean_j R_j
    A group whose rewards are all equal gets A = 0.

    Args:
        rewards: (B,) rewards R, B a multiple of ``group_size``.
        group_size: responses per prompt n, at least 2.
        norm_by_std: divide by the group's std (GRPO) or not (Dr. GRPO).
        eps: added to the std, > 0.

    Returns:
        (B,) advantages, at least float32.

    Raises:
        ValueError: ``group_size < 2``, ``eps`` not > 0, ``rewards`` not 1-D, or B not a multiple
            of ``group_size``.
    """
    check_group_size(group_size, 2, "GRPO's group-relative advantage")
    check_std_eps(eps)
    rewards = rewards.detach().to(torch.promote_types(rewards.dtype, torch.float32))
    return group_normalised(rewards, group_size, divide_by_std=norm_by_std, eps=eps)


class GRPO(ClippedPolicyGradient):
    """GRPO as a trainer plug-in: ``grpo_advantages`` per step, then the clipped policy gradient.

    Its options are its constructor's keywords, each described in the configuration reference
    (docs/reference/configuration.md, generated from its section below, `pacs.algos.grpo.GrpoConfig`). With ``kl_coef = 0`` and
    ``entropy_coef = 0``, ``needs`` is empty: no reference model is loaded.
    """

    min_group_size = 2

    def __init__(self, group_size: int, *, norm_by_std: bool = True, eps: float = GRPO_STD_EPS, **options):
        super().__init__(group_size, **options)
        check_std_eps(eps)
        self.norm_by_std, self.eps = norm_by_std, eps

    def prepare_step(self, batch, sum_over_ranks=None) -> dict[str, torch.Tensor]:
        """{"advantages": (B,) ``grpo_advantages`` of the step's ``sequence_rewards``} (and the
        ``rollout_is_terms``)."""
        return self.group_relative_terms(batch, norm_by_std=self.norm_by_std, eps=self.eps)


class GrpoConfig(ClippedPolicyGradientConfig):
    builds = GRPO

    name: Literal["grpo"] = "grpo"
    """GRPO: group-normalised outcome rewards as every token's advantage (`pacs.algos.grpo`)."""
    norm_by_std: bool = True
    """Divide group-centred rewards by the group's standard deviation."""
