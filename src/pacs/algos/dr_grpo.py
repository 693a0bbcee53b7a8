"""Dr. GRPO: GRPO done right (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
Perspective", arXiv 2503.20783).

GRPO divides each response's advantage by its group's reward std and each response's token sum by
its length; both bias the update (questions of little reward variance weigh more; long wrong
answers are punished less per token, short right ones rewarded more). Dr. GRPO drops both:

    A_i  = R_i − mean_j R_j                          no division by std_j R_j
    ρ_it = π_θ(o_it) / π_old(o_it)
    ℓ_it = max(−A_i ρ_it, −A_i clip(ρ_it, 1 − ε_low, 1 + ε_high))
    L    = 1 / (B · L_max) · Σ_i Σ_t m_it ℓ_it       seq-mean-token-sum-norm: a constant divisor,
                                                     L_max the maximum response length (``max_response_length``)

j runs over the group of i (rows ``[g*n, (g+1)*n)`` answer prompt g), B is the mini-batch's rows,
m the response mask. The paper's code divides the token sum by the generation budget, as TRL's
``loss_type="dr_grpo"`` (with ``scale_rewards="none"``) and verl's ``seq-mean-token-sum-norm`` with
``norm_adv_by_std_in_grpo=False`` do. Defaults: ε_low = ε_high = 0.2, no KL term.
"""

from __future__ import annotations

from typing import Literal

import torch

from pacs.algos.options import ClippedPolicyGradientConfig
from pacs.algos.pg import ClippedPolicyGradient


class DrGRPO(ClippedPolicyGradient):
    """Dr. GRPO as a trainer plug-in: group-centred rewards as advantages, PPO's clipped surrogate,
    ``seq-mean-token-sum-norm``.

    Its options are its constructor's keywords, each described in the configuration reference
    (docs/reference/configuration.md, generated from its section below, `pacs.algos.dr_grpo.DrGrpoConfig`).
    """

    min_group_size = 2

    def prepare_step(self, batch, sum_over_ranks=None) -> dict[str, torch.Tensor]:
        """{"advantages": (B,) R_i − mean_j R_j of the step's ``sequence_rewards``} (and the
        ``rollout_is_terms``)."""
        return self.group_relative_terms(batch, norm_by_std=False)


class DrGrpoConfig(ClippedPolicyGradientConfig):
    builds = DrGRPO

    name: Literal["dr_grpo"] = "dr_grpo"
    """Dr. GRPO: group-centred rewards (no std division) and a constant token-sum divisor
    (`pacs.algos.dr_grpo`)."""
