"""The algorithm seam: how an RL objective plugs into the trainer's one loop.

The trainer splits each step's rollouts into mini-batches of whole prompt groups (one optimizer
update each) and each mini-batch into micro-batches of any size (one forward/backward each). An
algorithm sees the whole step once (`prepare_step`, e.g. advantages), each mini-batch once
before any gradient (`prepare_update`), and then one micro-batch at a time:

    step_terms = algorithm.prepare_step(batch)                       # added to the batch's tensors
    row_terms, metrics = algorithm.prepare_update(minibatch, current_logprobs, policy_is_rollout_policy)
    for micro in micro-batches of the mini-batch (any rows, any size):
        loss = algorithm.micro_batch_loss(logprobs(micro), micro, row_terms[micro rows])
        loss.backward()
    optimizer.step()

Contract: the gradients of the micro-batch losses, summed, equal the gradient of the
algorithm's mini-batch loss, whatever the micro-batch size and however groups are split.
Tensors arrive as a `Mapping[str, Tensor]` with these keys (B rows, R response positions):

    old_logprobs   (B, R)  log-probs under the rollout policy
    response_mask  (B, R)  1.0 on response tokens
    rewards        (B,)    verifier outcome in [0, 1]
    ref_logprobs   (B, R)  log-probs under the frozen reference model  (if "ref_logprobs" in needs)
    values         (B, R)  the critic's values of the rollout states    (if "values" in needs)
    entropy        (b, R)  per-token entropy of the current policy, with gradient, in micro-batches
                           only                                          (if "entropy" in needs)
plus every tensor returned by `prepare_step`, per row (B,) or per token (B, R).
"""

from __future__ import annotations

from typing import Callable, Mapping, Protocol

import torch

Tensors = Mapping[str, torch.Tensor]


class Algorithm(Protocol):
    group_size: int
    needs: frozenset[str]
    """Extra tensors the trainer must provide: a subset of {"ref_logprobs", "values", "entropy"}."""

    def prepare_step(self, batch: Tensors) -> dict[str, torch.Tensor]:
        """Per-row (B,) or per-token (B, R) tensors computed once from the step's whole batch
        (B = every row of the step), e.g. advantages; {} when there are none."""
        ...

    def prepare_update(
        self,
        minibatch: Tensors,
        current_logprobs: Callable[[], torch.Tensor],
        policy_is_rollout_policy: bool,
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """Per-row tensors (B,) for `micro_batch_loss`, and the mini-batch's metrics.

        `current_logprobs()` runs a no-grad pass of the current policy over the mini-batch,
        returning (B, R); call it only when the update needs it. `policy_is_rollout_policy` is
        True on the first update after a rollout, when the current log-probs equal
        `old_logprobs` and that pass can be skipped.
        """
        ...

    def micro_batch_loss(self, logprobs: torch.Tensor, micro: Tensors, row_terms: Tensors) -> torch.Tensor:
        """A 0-dim loss for the micro-batch's rows; `logprobs` (b, R) carry the gradient.
        `micro` holds the micro-batch's rows of every batch tensor (and "entropy" if needed)."""
        ...
