"""The algorithm seam: how an RL objective plugs into the trainer's one loop.

The trainer splits each step's rollouts into mini-batches of whole prompt groups (one optimizer
update each) and each mini-batch into micro-batches of any size (one forward/backward each). An
algorithm sees the whole step once (`prepare_step`, e.g. advantages), each mini-batch once
before any gradient (`prepare_update`), and then one micro-batch at a time:

    step_terms = algorithm.prepare_step(batch)         # added to the batch's tensors (no old_logprobs)
    row_terms, metrics = algorithm.prepare_update(minibatch, current_logprobs, policy_is_rollout_policy)
    for micro in micro-batches of the mini-batch (any rows, any size):
        loss = algorithm.micro_batch_loss(logprobs(micro), micro, row_terms[micro rows])
        loss.backward()
    optimizer.step()

Contract: the gradients of the micro-batch losses, summed, equal the gradient of the
algorithm's mini-batch loss, whatever the micro-batch size and however groups are split.
Tensors arrive as a `Mapping[str, Tensor]` with these keys (B rows, R response positions):

    old_logprobs   (B, R)  log-probs under the rollout policy
    response_mask  (B, R)  1.0 on response tokens the model sampled (0.0 on padding and on a tool's output)
    rewards        (B,)    verifier outcome in [0, 1]
    ref_logprobs   (B, R)  log-probs under the frozen reference model  (if "ref_logprobs" in needs)
    values         (B, R)  the critic's values of the rollout states    (if "values" in needs)
    entropy        (b, R)  per-token entropy of the current policy, with gradient, in micro-batches
                           only                                          (if "entropy" in needs)
    sampler_logprobs (B, R) log-probs of the response tokens under the rollout engine's sampling
                           distribution μ (vLLM's own)                   (if "sampler_logprobs" in needs)
plus every tensor returned by `prepare_step`, per row (B,) or per token (B, R). The trainer
may take the step's first mini-batch's "old_logprobs" from its first update's own forward pass
(`pacs.train.update.FirstUpdateOldLogprobs`) when the algorithm says it can wait for them
(`first_update_may_supply_old_logprobs`); until then they are absent from what the algorithm sees.

An algorithm writes `prepare_update` and `micro_batch_loss`; `AlgorithmBase` gives every other part
of the protocol a default (no extra tensors, no step terms, old log-probs computed before the step,
no sampler correction, metrics that are means over every row, no start-up note). One that learns a
critic (PPO) also implements `CriticObjective` and puts "values" in `needs`: the trainer then loads
a value model and updates it with the critic's loss before each step's policy updates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from pacs.algos.importance import ROLLOUT_IS_LEVELS

Tensors = Mapping[str, torch.Tensor]
SumOverRanks = Callable[[torch.Tensor], torch.Tensor]
"""Sums a tensor over every process of a data-parallel run (the identity with one process)."""


@dataclass(frozen=True)
class MiniBatchTotals:
    """Counts of the whole mini-batch (one optimizer update) of which an algorithm sees a share:
    with N processes each holds 1/N of its rows, and every loss is normalised by these global
    counts, so the shares' gradients sum to the mini-batch gradient.

    num_rows:   responses in the mini-batch, over every process
    num_tokens: response tokens in the mini-batch, over every process
    """

    num_rows: int
    num_tokens: float

    @classmethod
    def of(cls, response_mask: torch.Tensor) -> MiniBatchTotals:
        """The totals of a mini-batch held whole: (B, R) mask."""
        return cls(num_rows=response_mask.shape[0], num_tokens=max(float(response_mask.sum()), 1.0))


NEEDS = frozenset({"ref_logprobs", "values", "entropy", "sampler_logprobs"})
"""The extra tensors an algorithm may ask the trainer for (`Algorithm.needs`)."""


class Algorithm(Protocol):
    group_size: int
    needs: frozenset[str]
    """Extra tensors the trainer must provide: a subset of {"ref_logprobs", "values", "entropy",
    "sampler_logprobs"}."""
    first_update_may_supply_old_logprobs: bool
    """Whether the algorithm works when the step's first mini-batch gets its "old_logprobs" only
    from its first update's forward pass: `prepare_step` does not read them, and on that update
    `prepare_update` does without them (it calls `current_logprobs()` for values it needs). False
    for step terms built from every row's old log-probs together (a KL penalty in the reward):
    the trainer then computes them all before `prepare_step`. A term of each row's own old
    log-probs alone (the sampler correction's weights) is made per mini- or micro-batch instead
    (`rollout_is_terms`)."""
    rollout_is_levels: tuple[str, ...]
    """The levels of the sampler correction (`importance.rollout_is_weights`) the algorithm takes, a
    subset of `importance.ROLLOUT_IS_LEVELS`; its "rollout_is_weight" step term is (B, R) at the token
    level, (B,) at the sequence level."""
    startup_note: str | None
    """What the trainer prints once when a run starts (PACS: why its loss stays near ln 2); None: nothing."""

    def rollout_is_terms(self, batch: Tensors) -> dict[str, torch.Tensor]:
        """{"rollout_is_weight": the sampler correction's weights of `batch`'s rows, (B,) or (B, R)}
        from its "old_logprobs" and "sampler_logprobs"; {} without the correction or without
        "old_logprobs". The trainer reports the correction (`rollout_is/*`) from these when the
        first update gave some of the old log-probs, so the step terms had no weights."""
        ...

    def prepare_step(self, batch: Tensors, sum_over_ranks: SumOverRanks | None = None) -> dict[str, torch.Tensor]:
        """Per-row (B,) or per-token (B, R) tensors computed once from the step's batch (B = every
        row of the step on this process), e.g. advantages; {} when there are none. `batch` has
        "old_logprobs" for every row, unless the first update gives some of them (module
        docstring). Statistics over the whole step (PPO's whitening) reduce with `sum_over_ranks`
        (None: one process)."""
        ...

    def prepare_update(
        self,
        minibatch: Tensors,
        current_logprobs: Callable[[], torch.Tensor],
        policy_is_rollout_policy: bool,
        totals: MiniBatchTotals | None = None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Per-row tensors (B,) for `micro_batch_loss`, and the mini-batch's metrics.

        `current_logprobs()` runs a no-grad pass of the current policy over the mini-batch,
        returning (B, R); call it only when the update needs it. `policy_is_rollout_policy` is
        True on the first update after a rollout, when the current log-probs equal
        `old_logprobs` and that pass can be skipped. On the step's very first update
        `minibatch` may have no "old_logprobs" (with `first_update_may_supply_old_logprobs`):
        the trainer takes them from that update's own forward pass (π_old = π_θ, detached) and
        `micro_batch_loss` gets them; what needs their values before then calls
        `current_logprobs()`. `totals`: counts of the global
        mini-batch whose share `minibatch` is (None: `minibatch` is the whole mini-batch);
        losses are normalised by them. Metrics describe this share; "loss", the mini-batch's loss,
        is one of them (the progress bar shows it, and a loss that is not finite skips the update).
        """
        ...

    def metric_weights(self, minibatch: Tensors) -> dict[str, float]:
        """For each metric of `prepare_update` that is a mean over this share's response tokens
        or over some of its rows, how many it is a mean over (metrics absent here are means over
        all the share's rows, which every rank holds equally many of): the weights that make the
        ranks' metrics the global mini-batch's (`pacs.distributed.collectives.mean_over_ranks`)."""
        ...

    def micro_batch_loss(self, logprobs: torch.Tensor, micro: Tensors, row_terms: Tensors) -> torch.Tensor:
        """A 0-dim loss for the micro-batch's rows; `logprobs` (b, R) carry the gradient.
        `micro` holds the micro-batch's rows of every batch tensor (and "entropy" if needed)."""
        ...


class CriticObjective(Protocol):
    """The optional critic part of an algorithm whose `needs` holds "values" (PPO): the loss of the
    value model, under the same contract as the policy's (module docstring). Per mini-batch
    `critic_row_terms`, then per micro-batch `critic_micro_batch_loss`, whose gradients sum to that of
    the mini-batch value loss; `pacs.train.update.update_critic` runs it."""

    group_size: int

    def critic_row_terms(self, minibatch: Tensors, totals: MiniBatchTotals | None = None) -> dict[str, torch.Tensor]:
        """Per-row tensors (B,) for `critic_micro_batch_loss`, normalised by the global mini-batch's
        `totals` (None: `minibatch` is all of it)."""
        ...

    def critic_micro_batch_loss(self, values: torch.Tensor, micro: Tensors, row_terms: Tensors) -> torch.Tensor:
        """A 0-dim loss for the micro-batch's rows; `values` (b, R) are the critic's current values,
        with gradient; `micro` holds the rollout-time "values" and the step terms."""
        ...

    def critic_metrics(self, values: torch.Tensor, minibatch: Tensors) -> dict[str, float]:
        """The mini-batch's critic metrics ("critic/..." keys) for `values` (B, R)."""
        ...

    def critic_metric_weights(self, minibatch: Tensors) -> dict[str, float]:
        """As `Algorithm.metric_weights`, for `critic_metrics`."""
        ...


CRITIC_METHODS = ("critic_row_terms", "critic_micro_batch_loss", "critic_metrics", "critic_metric_weights")
"""The methods of `CriticObjective`, which an algorithm that needs "values" implements."""


class AlgorithmBase:
    """The protocol's optional parts, with defaults: a subclass writes `prepare_update` and
    `micro_batch_loss`, and overrides what else it needs (`needs`, `prepare_step`, ...).

    ``AlgorithmBase(group_size, *, max_response_length)``: responses per prompt n, and the longest response R
    (``pacs.algos.aggregation``'s seq-mean-token-sum-norm divides by it). The options every algorithm
    section holds (`pacs.config.BaseAlgorithmConfig`: kl_coef, entropy_coef, loss_agg, rollout_is_*,
    overlong_*) reach the constructor only when it takes them as keywords: one that does not takes
    only their defaults, and the configuration refuses any other value of them by name.
    """

    needs: frozenset[str] = frozenset()
    first_update_may_supply_old_logprobs: bool = False
    """False: the trainer computes every row's old log-probs before `prepare_step` (always valid)."""
    rollout_is_levels: tuple[str, ...] = ROLLOUT_IS_LEVELS
    """Levels of the sampler correction, for one whose constructor takes `rollout_is_cap`."""
    startup_note: str | None = None

    def __init__(self, group_size: int, *, max_response_length: int):
        self.group_size, self.max_response_length = group_size, max_response_length

    def prepare_step(self, batch: Tensors, sum_over_ranks: SumOverRanks | None = None) -> dict[str, torch.Tensor]:
        """No step terms."""
        return {}

    def metric_weights(self, minibatch: Tensors) -> dict[str, float]:
        """Every metric is a mean over all of the share's rows."""
        return {}
