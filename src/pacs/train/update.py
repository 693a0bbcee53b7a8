"""One step's updates: epochs x mini-batches (optimizer updates) x micro-batches (passes).

The mini-batch loss of any algorithm is applied exactly at any micro-batch size: the algorithm
sees the whole mini-batch once without gradient (`prepare_update`), then each micro-batch
back-propagates its own rows (see `pacs.algos.base`). A mini-batch whose loss or gradient norm is
not finite is skipped (no optimizer step) and counted. The same loop updates PPO's critic.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable

import torch
from accelerate import Accelerator
from transformers import PreTrainedModel

from pacs.algos.base import Algorithm
from pacs.algos.ppo import PPO
from pacs.train.batch import PolicyBatch, response_logprobs, response_logprobs_no_grad, response_values


@dataclass(frozen=True)
class UpdateSettings:
    """prompts per optimizer update, sequences per forward/backward, passes over the rollouts."""

    mini_batch_size: int
    micro_batch_size: int
    epochs: int
    grad_clip: float
    temperature: float = 1.0


PrepareUpdate = Callable[[PolicyBatch, bool], tuple[dict[str, torch.Tensor], dict[str, float]]]
MicroBatchLoss = Callable[[PolicyBatch], torch.Tensor]


def run_updates(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    accelerator: Accelerator,
    batch: PolicyBatch,
    rows_per_update: int,
    settings: UpdateSettings,
    prepare_update: PrepareUpdate,
    micro_batch_loss: MicroBatchLoss,
) -> dict[str, float]:
    """The loop: for each epoch and mini-batch of `rows_per_update` rows, `prepare_update(minibatch,
    model_changed)` gives per-row terms and metrics, each micro-batch back-propagates
    `micro_batch_loss(micro)`, then one clipped optimizer step. Returns the metrics averaged over
    the updates that report them, `grad_norm`, and `updates/skipped`."""
    model_changed = False
    per_update: list[dict[str, float]] = []
    skipped = 0
    model.train()
    for _ in range(settings.epochs):
        for start in range(0, len(batch), rows_per_update):
            minibatch = batch.rows(slice(start, start + rows_per_update))
            row_terms, metrics = prepare_update(minibatch, model_changed)
            minibatch.row_terms = {**minibatch.row_terms, **row_terms}
            micro_starts = range(0, len(minibatch), settings.micro_batch_size)
            for micro_start in micro_starts:
                micro = minibatch.rows(slice(micro_start, micro_start + settings.micro_batch_size))
                with accelerator.no_sync(model) if micro_start != micro_starts[-1] else nullcontext():
                    accelerator.backward(micro_batch_loss(micro))
            grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), settings.grad_clip))
            if math.isfinite(grad_norm) and math.isfinite(metrics.get("loss", 0.0)):
                optimizer.step()
                model_changed = True
            else:
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
            per_update.append({**metrics, "grad_norm": grad_norm})
    averaged = {}
    for key in dict.fromkeys(key for update in per_update for key in update):
        values = [update[key] for update in per_update if key in update]
        averaged[key] = sum(values) / len(values)
    averaged["updates/skipped"] = float(skipped)
    return averaged


def update_policy(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    accelerator: Accelerator,
    batch: PolicyBatch,
    algorithm: Algorithm,
    settings: UpdateSettings,
) -> dict[str, float]:
    """Every policy update of one step; `loss`, `grad_norm`, the algorithm's metrics and
    `updates/skipped`, averaged over the updates.

    batch: B = prompts * group_size rows with `old_logprobs` (and the algorithm's step terms)
    filled in; rows of one prompt are contiguous.
    """

    def prepare(minibatch: PolicyBatch, policy_changed: bool):
        return algorithm.prepare_update(
            minibatch.tensors(),
            lambda: response_logprobs_no_grad(
                model, minibatch, micro_batch_size=settings.micro_batch_size, temperature=settings.temperature
            ),
            policy_is_rollout_policy=not policy_changed,
        )

    def micro_loss(micro: PolicyBatch) -> torch.Tensor:
        inputs = micro.tensors()
        if "entropy" in algorithm.needs:
            logprobs, inputs["entropy"] = response_logprobs(
                model, micro, temperature=settings.temperature, with_entropy=True
            )
        else:
            logprobs = response_logprobs(model, micro, temperature=settings.temperature)
        return algorithm.micro_batch_loss(logprobs, inputs, micro.row_terms)

    rows_per_update = settings.mini_batch_size * algorithm.group_size
    return run_updates(model, optimizer, accelerator, batch, rows_per_update, settings, prepare, micro_loss)


def update_critic(
    critic: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    accelerator: Accelerator,
    batch: PolicyBatch,
    algorithm: PPO,
    settings: UpdateSettings,
) -> dict[str, float]:
    """Every critic update of one step (PPO): the clipped value loss on the step's returns.

    batch: as for `update_policy`, with the rollout-time "values" and the "returns" row terms.
    """

    def prepare(minibatch: PolicyBatch, critic_changed: bool):
        tensors = minibatch.tensors()
        return algorithm.critic_row_terms(tensors), algorithm.critic_metrics(tensors["values"], tensors)

    def micro_loss(micro: PolicyBatch) -> torch.Tensor:
        return algorithm.critic_micro_batch_loss(response_values(critic, micro), micro.tensors(), micro.row_terms)

    rows_per_update = settings.mini_batch_size * algorithm.group_size
    metrics = run_updates(critic, optimizer, accelerator, batch, rows_per_update, settings, prepare, micro_loss)
    return {
        key if key.startswith("critic/") else f"critic/{key}": value
        for key, value in metrics.items()
    }
