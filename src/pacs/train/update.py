"""One step's updates: epochs x mini-batches (optimizer updates) x micro-batches (passes).

The mini-batch loss of any algorithm is applied exactly at any micro-batch size: the algorithm
sees the whole mini-batch once without gradient (`prepare_update`), then each micro-batch
back-propagates its own rows (see `pacs.algos.base`). When a mini-batch is a single micro-batch,
the forward that gives `prepare_update` the current log-probs keeps its graph and is the one
that back-propagates: one forward per update instead of two. A mini-batch whose loss or
gradient norm is not finite is skipped (no optimizer step) and counted. The same loop updates
PPO's critic. Micro-batches are consecutive rows, `train.micro_batch_size` of them or, with
`train.micro_batch_tokens`, as many as that many tokens hold (`micro_batch_slices`).

With several processes each rank holds its share of every mini-batch (`pacs.distributed`):
the algorithm normalises by the global mini-batch (`MiniBatchTotals`), each local loss is scaled
by `World.loss_scale` so that the synchronised gradient is the sum over ranks, and only the last
micro-batch of an update synchronises gradients.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

from pacs.algos.base import Algorithm, CriticObjective, MiniBatchTotals
from pacs.distributed.collectives import mean_over_ranks, sum_over_ranks
from pacs.distributed.world import World
from pacs.distributed.wrapping import gradient_sync
from pacs.train.batch import PolicyBatch, micro_batch_slices
from pacs.train.logprobs import (
    response_logprobs,
    response_logprobs_no_grad,
    response_values,
)


@dataclass(frozen=True)
class UpdateSettings:
    """prompts per optimizer update, sequences per forward/backward, passes over the rollouts."""

    mini_batch_size: int
    micro_batch_size: int
    epochs: int
    grad_clip: float
    temperature: float = 1.0
    autocast: Callable[[], contextlib.AbstractContextManager] = nullcontext
    """The context every forward pass runs in (bf16 autocast under mixed precision)."""
    padding_free: bool = False
    """The policy's and the critic's passes pack each micro-batch's rows without padding
    (`train.padding_free`, `pacs.train.logprobs.response_logprobs`, `response_values`)."""
    micro_batch_tokens: int | None = None
    """With it, a micro-batch also holds at most this many real tokens, a longer row alone
    (`train.micro_batch_tokens`, `pacs.train.batch.micro_batch_slices`); None: rows alone count."""


def scheduled_learning_rate(lr: float, schedule: str, step: int, steps: int) -> float:
    """The learning rate of step `step` (1..steps) under `train.lr_schedule`:
    constant: lr; linear: lr·(1 − (step − 1)/steps); cosine: lr·½(1 + cos(π(step − 1)/steps))."""
    progress = (step - 1) / steps
    if schedule == "linear":
        return lr * (1 - progress)
    if schedule == "cosine":
        return lr * 0.5 * (1 + math.cos(math.pi * progress))
    return lr


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> float:
    """Give every parameter group of `optimizer` the learning rate `lr`; return it."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


PrepareUpdate = Callable[
    [PolicyBatch, slice, bool, MiniBatchTotals, list[slice]],
    tuple[dict[str, torch.Tensor], dict[str, float], dict[str, float]],
]
MicroBatchLoss = Callable[[PolicyBatch, slice], torch.Tensor]


def run_updates(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    world: World,
    batch: PolicyBatch,
    rows_per_update: int,
    settings: UpdateSettings,
    prepare_update: PrepareUpdate,
    micro_batch_loss: MicroBatchLoss,
) -> dict[str, float]:
    """The loop: for each epoch and local mini-batch of `rows_per_update` rows,
    `prepare_update(minibatch, rows, model_changed, totals, micro_batches)` gives per-row terms,
    metrics of this rank's share and their weights (`Algorithm.metric_weights`), each micro-batch
    back-propagates `micro_batch_loss(micro, rows)`, then one clipped optimizer step (`rows`:
    where the mini- or micro-batch lies in `batch`; `micro_batches`: the mini-batch's
    `micro_batch_slices`, within it, the same on every rank).
    Returns the global mini-batches' metrics (the same on every rank) averaged over the updates
    that report them, `grad_norm`, and `updates/skipped`."""
    model_changed = False
    per_update: list[dict[str, float]] = []
    skipped = 0
    model.train()
    for _ in range(settings.epochs):
        for start in range(0, len(batch), rows_per_update):
            minibatch_rows = slice(start, min(start + rows_per_update, len(batch)))
            minibatch = batch.rows(minibatch_rows)
            micro_batches = micro_batch_slices(
                minibatch, max_rows=settings.micro_batch_size, max_tokens=settings.micro_batch_tokens, world=world
            )
            row_terms, metrics, weights = prepare_update(
                minibatch, minibatch_rows, model_changed, global_totals(minibatch, world), micro_batches
            )
            minibatch.row_terms = {**minibatch.row_terms, **row_terms}
            for micro_rows in micro_batches:
                micro = minibatch.rows(micro_rows)
                with gradient_sync(world, model, sync=micro_rows == micro_batches[-1]):
                    with settings.autocast():
                        loss = micro_batch_loss(micro, slice(start + micro_rows.start, start + micro_rows.stop))
                    (loss * world.loss_scale).backward()
            grad_norm = _clip_grad_norm(model, settings.grad_clip)
            global_metrics, loss_is_finite = _over_ranks(world, metrics, weights)
            if math.isfinite(grad_norm) and loss_is_finite:
                optimizer.step()
                model_changed = True
            else:
                skipped += 1
            optimizer.zero_grad(set_to_none=True)
            per_update.append({**global_metrics, "grad_norm": grad_norm})
    averaged = {}
    for key in dict.fromkeys(key for update in per_update for key in update):
        values = [update[key] for update in per_update if key in update]
        averaged[key] = sum(values) / len(values)
    averaged["updates/skipped"] = float(skipped)
    return averaged


_LOSS_NOT_FINITE = "loss is not finite"


def _over_ranks(world: World, metrics: dict[str, float], weights: dict[str, float]) -> tuple[dict[str, float], bool]:
    """An update's metrics over every rank (`mean_over_ranks`) and whether every rank's
    loss is finite, in one collective: each rank adds a flag, 1.0 when its loss is not finite,
    whose unweighted mean over the ranks is 0 only when no rank's is."""
    flag = 0.0 if math.isfinite(metrics.get("loss", 0.0)) else 1.0
    reduced = mean_over_ranks(world, {**metrics, _LOSS_NOT_FINITE: flag}, weights)
    return reduced, reduced.pop(_LOSS_NOT_FINITE) == 0.0


def global_totals(minibatch: PolicyBatch, world: World) -> MiniBatchTotals:
    """Rows and scored response tokens (`PolicyBatch.loss_mask`: no tool output) of the global
    mini-batch whose share `minibatch` is."""
    counts = sum_over_ranks(world, torch.tensor([len(minibatch), float(minibatch.loss_mask.sum())], dtype=torch.float64))
    return MiniBatchTotals(num_rows=int(counts[0]), num_tokens=max(float(counts[1]), 1.0))


def _clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the (synchronised) gradients to `max_norm` in global L2 norm; the norm before clipping.
    Under FSDP2 the gradients are sharded DTensors and the norm is reduced over every shard."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


class FirstUpdateOldLogprobs:
    """The first update's shortcut to the rollout policy's log-probs (π_old), owned by
    `update_policy` for one step.

    The step's first `rows` rows (at most one update's) come without old log-probs: the trainer's
    rollout-policy pass left them out (`Trainer.rows_from_first_update`), because the first update's
    own forward pass gives them: the policy has not changed since the rollout, so its log-probs
    there, detached, are π_old, and its entropy is the rollout policy's. That saves a no-grad pass
    over those rows. Until they are given, the algorithm sees no "old_logprobs" for their
    mini-batch (`prepare_update` calls `current_logprobs()` for values it needs before, see
    `pacs.algos.base`). `rows=0` is the plain path: every row's old log-probs came first.
    """

    def __init__(self, batch: PolicyBatch, rows: int, rows_per_update: int):
        if rows > rows_per_update:
            raise ValueError(f"rows_without_old_logprobs={rows} exceeds one update's {rows_per_update} rows")
        self.batch = batch
        self.missing = torch.zeros(len(batch), dtype=torch.bool)
        """Which rows of `batch` have no old log-probs yet."""
        self.missing[:rows] = True

    def lacks(self, rows: slice) -> bool:
        """Whether some of `rows` (of the step's batch) have no old log-probs yet."""
        return bool(self.missing[rows].any())

    def algorithm_inputs(self, minibatch: PolicyBatch, rows: slice) -> dict[str, torch.Tensor]:
        """What the algorithm sees of the mini-batch at `rows`: its tensors, without
        "old_logprobs" while some of its rows have none."""
        tensors = minibatch.tensors()
        if self.lacks(rows):
            del tensors["old_logprobs"]
        return tensors

    def give(self, micro: PolicyBatch, rows: slice, logprobs: torch.Tensor, entropy: torch.Tensor) -> None:
        """The old log-probs and entropy of the micro-batch at `rows`, (b, R) from its forward pass
        with gradient, into `micro` and into the step's batch."""
        micro.old_logprobs = logprobs.detach()
        width = micro.response_ids.shape[1]
        self.batch.old_logprobs[rows, :width] = micro.old_logprobs.to(self.batch.old_logprobs.dtype)
        self.batch.entropy[rows, :width] = entropy.detach().to(self.batch.entropy.dtype)
        self.missing[rows] = False


class PolicyPasses:
    """The policy's forward passes during one step's updates, for `run_updates`: `prepare` gives
    the algorithm a mini-batch (and its current log-probs, when it asks), `micro_batch_loss` a
    micro-batch's loss. A mini-batch that is a single micro-batch is forwarded once: the pass that
    gives `prepare_update` its current log-probs keeps its graph and is the one that
    back-propagates. The first update's forward passes give the old log-probs `first_update` lacks."""

    def __init__(
        self,
        model: torch.nn.Module,
        algorithm: Algorithm,
        settings: UpdateSettings,
        first_update: FirstUpdateOldLogprobs,
        world: World,
    ):
        self.model, self.algorithm, self.settings, self.first_update = model, algorithm, settings, first_update
        self.world = world
        self.kept: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        """A single-micro-batch mini-batch's forward from `current_logprobs`, by (start, stop) rows,
        until its `micro_batch_loss` back-propagates it."""

    def forward(self, micro: PolicyBatch, rows: slice) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(b, R) log-probs with gradient, and the (b, R) entropy when this pass gives the old
        log-probs or the algorithm uses it (else None)."""
        options = {"temperature": self.settings.temperature, "padding_free": self.settings.padding_free}
        if self.first_update.lacks(rows) or "entropy" in self.algorithm.needs:
            return response_logprobs(self.model, micro, with_entropy=True, **options)
        return response_logprobs(self.model, micro, **options), None

    def current_logprobs(self, minibatch: PolicyBatch, rows: slice, micro_batches: list[slice]) -> torch.Tensor:
        """(B, R) log-probs of the current policy over the mini-batch at `rows`, without gradient,
        in its `micro_batches`."""
        settings = self.settings
        with settings.autocast():
            if len(micro_batches) > 1:
                return response_logprobs_no_grad(
                    self.model,
                    minibatch,
                    micro_batch_size=settings.micro_batch_size,
                    micro_batch_tokens=settings.micro_batch_tokens,
                    world=self.world,
                    temperature=settings.temperature,
                    padding_free=settings.padding_free,
                )
            self.kept[rows.start, rows.stop] = self.forward(minibatch, rows)
            return self.kept[rows.start, rows.stop][0].detach()

    def prepare(
        self, minibatch: PolicyBatch, rows: slice, policy_changed: bool, totals: MiniBatchTotals, micro_batches: list[slice]
    ):
        tensors = self.first_update.algorithm_inputs(minibatch, rows)
        row_terms, metrics = self.algorithm.prepare_update(
            tensors,
            lambda: self.current_logprobs(minibatch, rows, micro_batches),
            policy_is_rollout_policy=not policy_changed,
            totals=totals,
        )
        return row_terms, metrics, self.algorithm.metric_weights(tensors)

    def micro_batch_loss(self, micro: PolicyBatch, rows: slice) -> torch.Tensor:
        logprobs, entropy = self.kept.pop((rows.start, rows.stop), None) or self.forward(micro, rows)
        if self.first_update.lacks(rows):
            self.first_update.give(micro, rows, logprobs, entropy)
        inputs = micro.tensors()
        if "entropy" in self.algorithm.needs:
            inputs["entropy"] = entropy
        return self.algorithm.micro_batch_loss(logprobs, inputs, micro.row_terms)


def update_policy(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    world: World,
    batch: PolicyBatch,
    algorithm: Algorithm,
    settings: UpdateSettings,
    *,
    rows_without_old_logprobs: int = 0,
) -> dict[str, float]:
    """Every policy update of one step; `loss`, `grad_norm`, the algorithm's metrics and
    `updates/skipped`, averaged over the updates.

    batch: B = prompts * group_size rows with the algorithm's step terms filled in; rows of one
    prompt are contiguous. `old_logprobs` and `entropy` are filled in for every row but the first
    `rows_without_old_logprobs` (at most one mini-batch), which the first update's own forward
    pass gives (`FirstUpdateOldLogprobs`; 0: the plain path).
    """
    rows_per_update = settings.mini_batch_size * algorithm.group_size
    first_update = FirstUpdateOldLogprobs(batch, rows_without_old_logprobs, rows_per_update)
    passes = PolicyPasses(model, algorithm, settings, first_update, world)
    return run_updates(model, optimizer, world, batch, rows_per_update, settings, passes.prepare, passes.micro_batch_loss)


def update_critic(
    critic: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    world: World,
    batch: PolicyBatch,
    algorithm: CriticObjective,
    settings: UpdateSettings,
) -> dict[str, float]:
    """Every critic update of one step (an algorithm that needs "values", PPO's clipped value loss
    on the step's returns): the algorithm's `CriticObjective`.

    batch: as for `update_policy`, with the rollout-time "values" and the "returns" row terms.
    """

    def prepare(minibatch: PolicyBatch, rows: slice, critic_changed: bool, totals: MiniBatchTotals, micro_batches: list[slice]):
        tensors = minibatch.tensors()
        metrics = algorithm.critic_metrics(tensors["values"], tensors)
        return algorithm.critic_row_terms(tensors, totals=totals), metrics, algorithm.critic_metric_weights(tensors)

    def micro_loss(micro: PolicyBatch, rows: slice) -> torch.Tensor:
        values = response_values(critic, micro, padding_free=settings.padding_free)
        return algorithm.critic_micro_batch_loss(values, micro.tensors(), micro.row_terms)

    rows_per_update = settings.mini_batch_size * algorithm.group_size
    metrics = run_updates(critic, optimizer, world, batch, rows_per_update, settings, prepare, micro_loss)
    return {key if key.startswith("critic/") else f"critic/{key}": value for key, value in metrics.items()}
