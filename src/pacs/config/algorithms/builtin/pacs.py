"""The section of the built-in algorithm `pacs` (PACS, `pacs.algos.pacs`): its options, found by
`pacs.config.algorithms.registry` as every module of this package is."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pacs.algos.importance import RolloutIsLevel
from pacs.algos.pacs import PACS, Estimator, Proxy, Reference, Weighting
from pacs.config.algorithms.base import BaseAlgorithmConfig, RunSettings


class PacsConfig(BaseAlgorithmConfig):
    builds = PACS

    name: Literal["pacs"] = "pacs"
    """PACS (arXiv 2509.02522): the outcome reward as a label, predicted from the policy's own
    log-probs by a weighted binary cross-entropy (`pacs.algos.pacs`)."""
    beta: float = Field(1.0, gt=0, allow_inf_nan=False)
    """β, the scale of the reward proxy."""
    proxy: Proxy = "logratio"
    """The reward proxy: `logratio`, β·Σ_t (log π_θ − log π_old) (the paper's); `mean_logprob`,
    β·mean_t log π_θ."""
    estimator: Estimator = "rloo"
    """The score ψ of a response against the others to its prompt: `rloo`, its proxy minus their
    mean; `grpo`, group-normalised; `naive`, its proxy alone."""
    weighting: Weighting = "question"
    """Class weights of the cross-entropy: `question`, classes balanced within each group; `none`;
    `only_positive` / `only_negative`, one class only."""
    rollout_is_level: RolloutIsLevel = "sequence"
    """What one weight of the correction covers: PACS classifies whole responses, so one ρ per
    response scales its whole gradient coefficient: `sequence`, the product of its tokens' ratios;
    `geometric_mean`, that product's per-token geometric mean, near 1 for long responses (its
    effective sample size, rollout_is/ess, stays high where the product's collapses)."""
    pacs_reference: Reference = "rollout"
    """The reference π_ref of the logratio proxy: `rollout`, the policy that sampled the step (the
    authors' code: ψ = 0 on a step's first update); `fixed`, the frozen reference model, the
    initial policy (the paper's text), reset to the current policy every train.reference_reset_every
    steps with the optimizer's state (train.reference_reset_optimizer)."""

    def uses_reference(self) -> bool:
        return super().uses_reference() or self.pacs_reference == "fixed"

    def problems(self, config: RunSettings) -> list[str]:
        found = [*super().problems(config), *self._kl_problems(in_reward=False)]
        if self.pacs_reference == "fixed" and self.proxy != "logratio":
            found.append(
                f"algorithm.pacs_reference='fixed' with algorithm.proxy='{self.proxy}': only the logratio proxy, "
                "β·Σ_t (log π_θ − log π_ref), has a reference; use proxy=logratio or pacs_reference=rollout"
            )
        if config.rollout.n < 2 and self.estimator != "naive":
            found.append(
                f"rollout.n={config.rollout.n} with algorithm.name='pacs', algorithm.estimator='{self.estimator}': "
                "the group baseline needs at least 2 responses per prompt; set rollout.n >= 2 "
                "(or algorithm.estimator='naive')"
            )
        return found
