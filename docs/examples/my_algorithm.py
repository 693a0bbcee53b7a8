"""REINFORCE with a group baseline, as a pacs algorithm defined outside pacs.

    A_i = R_i − b_i         b_i = mean of R over i's group (baseline=group_mean), or 0 (baseline=none)
    L   = −(1/N) Σ_i A_i · (1/|y_i|) Σ_t log π_θ(y_it | x_i, y_i<t)      N: responses in the mini-batch

Train with it: pacs train algorithm.name=my_algorithm:ReinforceConfig algorithm.baseline=group_mean
"""

from __future__ import annotations

from typing import Literal

import torch

from pacs.algos.base import AlgorithmBase, MiniBatchTotals
from pacs.config import BaseAlgorithmConfig


class Reinforce(AlgorithmBase):
    """The algorithm: `prepare_update` and `micro_batch_loss` are all it must write; `prepare_step`
    and `startup_note` override `AlgorithmBase`'s defaults."""

    startup_note = "note: REINFORCE with a group baseline (my_algorithm.py)"

    def __init__(self, group_size: int, *, max_response_length: int, baseline: str = "group_mean"):
        super().__init__(group_size, max_response_length=max_response_length)
        self.baseline = baseline

    def prepare_step(self, batch, sum_over_ranks=None):
        """{"advantages": (B,) A = R − b}, once per step; a group's rows are contiguous."""
        rewards = batch["rewards"].view(-1, self.group_size)
        if self.baseline == "group_mean":
            rewards = rewards - rewards.mean(dim=1, keepdim=True)
        return {"advantages": rewards.reshape(-1)}

    def prepare_update(self, minibatch, current_logprobs, policy_is_rollout_policy, totals=None):
        """Each row's weight −A_i/N, normalised by the whole mini-batch's N (over every process),
        and the metrics: "loss" is required (the progress bar shows it)."""
        totals = totals or MiniBatchTotals.of(minibatch["response_mask"])
        weights = -minibatch["advantages"] / totals.num_rows
        logprobs = minibatch["old_logprobs"] if policy_is_rollout_policy else current_logprobs()
        loss = (weights * mean_logprob(logprobs, minibatch["response_mask"])).sum()
        return {"weight": weights}, {"loss": float(loss), "reinforce/advantage_abs": float(minibatch["advantages"].abs().mean())}

    def micro_batch_loss(self, logprobs, micro, row_terms):
        """Σ_{i ∈ micro} w_i · mean_t log π_θ(y_it): the micro-batches' gradients sum to ∇L."""
        return (row_terms["weight"] * mean_logprob(logprobs, micro["response_mask"])).sum()


def mean_logprob(logprobs: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) each response's mean token log-prob, from (B, R) log-probs and mask."""
    return (logprobs * response_mask).sum(dim=-1) / response_mask.sum(dim=-1).clamp(min=1)


class ReinforceConfig(BaseAlgorithmConfig):
    """The algorithm's options: `algorithm.name: my_algorithm:ReinforceConfig` picks this class,
    whose fields (beside those every algorithm shares) are `Reinforce`'s keywords."""

    builds = Reinforce

    baseline: Literal["group_mean", "none"] = "group_mean"
    """What each reward is compared with: its group's mean reward, or nothing (plain REINFORCE)."""
