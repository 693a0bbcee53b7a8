"""One step's policy update: epochs x mini-batches (optimizer updates) x micro-batches (passes).

The mini-batch loss of any algorithm is applied exactly at any micro-batch size: the algorithm
sees the whole mini-batch once without gradient (`prepare_update`), then each micro-batch
back-propagates its own rows (see `pacs.algos.base`). A mini-batch whose loss or gradient norm is
not finite is skipped (no optimizer step) and counted.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from accelerate import Accelerator
from transformers import PreTrainedModel

from pacs.algos.base import Algorithm
from pacs.train.batch import PolicyBatch, response_logprobs, response_logprobs_no_grad


@dataclass(frozen=True)
class UpdateSettings:
    """prompts per optimizer update, sequences per forward/backward, passes over the rollouts."""

    mini_batch_size: int
    micro_batch_size: int
    epochs: int
    grad_clip: float
    temperature: float = 1.0


def update_policy(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    accelerator: Accelerator,
    batch: PolicyBatch,
    algorithm: Algorithm,
    settings: UpdateSettings,
) -> dict[str, float]:
    """Run every optimizer update of one step; return metrics averaged over the updates.

    batch: B = prompts * group_size rows with `old_logprobs` filled in; rows of one prompt are
    contiguous. Returns `loss`, `grad_norm`, the algorithm's metrics (each averaged over the updates
    that report it), and `updates/skipped`.
    """
    rows_per_update = settings.mini_batch_size * algorithm.group_size
    policy_changed = False
    per_update: list[dict[str, float]] = []
    skipped = 0
    model.train()
    for _ in range(settings.epochs):
        for start in range(0, len(batch), rows_per_update):
            minibatch = batch.rows(slice(start, start + rows_per_update))
            row_terms, metrics = algorithm.prepare_update(
                minibatch.tensors(),
                lambda: response_logprobs_no_grad(
                    model, minibatch, micro_batch_size=settings.micro_batch_size, temperature=settings.temperature
                ),
                policy_is_rollout_policy=not policy_changed,
            )
            minibatch.row_terms = {**minibatch.row_terms, **row_terms}
            micro_starts = range(0, len(minibatch), settings.micro_batch_size)
            for micro_start in micro_starts:
                micro = minibatch.rows(slice(micro_start, micro_start + settings.micro_batch_size))
                is_last = micro_start == micro_starts[-1]
                with accelerator.no_sync(model) if not is_last else nullcontext():
                    inputs = micro.tensors()
                    if "entropy" in algorithm.needs:
                        logprobs, inputs["entropy"] = response_logprobs(
                            model, micro, temperature=settings.temperature, with_entropy=True
                        )
                    else:
                        logprobs = response_logprobs(model, micro, temperature=settings.temperature)
                    loss = algorithm.micro_batch_loss(logprobs, inputs, micro.row_terms)
                    accelerator.backward(loss)
            grad_norm = float(accelerator.clip_grad_norm_(model.parameters(), settings.grad_clip))
            if math.isfinite(grad_norm) and math.isfinite(metrics["loss"]):
                optimizer.step()
                policy_changed = True
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
