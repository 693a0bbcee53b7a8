"""The model FLOPs utilisation of a step, `perf/mfu` (`step_mfu` of a step's `StepWork`), with `train.peak_flops`.

MFU counts the model's multiply-adds as the 6ND rule does (Kaplan et al. 2020; PaLM's MFU): a
pass over T tokens of a model of N parameters costs 2·N·T FLOPs forward and 6·N·T forward and
backward. Attention's own FLOPs (quadratic in the length) and recomputation (activation
checkpointing, the no-grad passes an update makes for its metrics) are not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from pacs.distributed.collectives import sum_over_ranks
from pacs.distributed.world import World
from pacs.train.batch import PolicyBatch


def flop_parameters(model: torch.nn.Module) -> float:
    """N of the 6ND rule: the parameters that multiply, i.e. every parameter (tied weights once)
    but an input embedding that is not also the output layer (a lookup, no multiply-adds)."""
    parameters = {id(p): p.numel() for p in model.parameters()}
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if embeddings is not None and (output is None or output.weight is not embeddings.weight):
        parameters.pop(id(embeddings.weight), None)
    return float(sum(parameters.values()))


def model_flops(parameters: float, tokens: torch.Tensor, *, forward_passes, training_passes) -> torch.Tensor:
    """FLOPs = 2·N·T·forward_passes + 6·N·T·training_passes, elementwise.

    parameters: N (`flop_parameters`); tokens: (B,) T of each row (prompt and response);
    forward_passes, training_passes: numbers or (B,) tensors of passes over each row."""
    return parameters * tokens * (2 * forward_passes + 6 * training_passes)


def flops_utilisation(flops: float, seconds: float, peak_flops: float, processes: int) -> float:
    """`perf/mfu` = FLOPs / (seconds · peak FLOP/s of one device · processes); nan for no time."""
    return flops / (seconds * peak_flops * processes) if seconds > 0 else math.nan


@dataclass(frozen=True)
class StepWork:
    """What one step did that `step_mfu` counts: its time and the passes it made over its batch."""

    seconds: float
    """The step's wall time (`time/step_s`, the slowest rank's)."""
    policy_parameters: float
    """N_π: the policy's `flop_parameters`."""
    critic_parameters: float | None
    """N_V: the critic's `flop_parameters`; None without a critic (no values' pass, no critic update)."""
    reference_pass: bool
    """Whether the reference model's log-probs were computed (one forward pass per row)."""
    first_update_rows: int
    """The first rows of the batch whose old log-probs the first update gave (no pass of their own)."""
    epochs: int
    """E: the updates over each row (`train.epochs`)."""
    updates_policy: bool
    """Whether the policy was updated (False in a critic's warm-up)."""


def step_mfu(world: World, batch: PolicyBatch, work: StepWork, peak_flops: float | None) -> dict[str, float]:
    """{"perf/mfu": ...} of one step over every rank; {} when `peak_flops` is None.

        T_i   = prompt tokens + response tokens of row i of this rank's batch
        F_i   = 1 (generation) + 1 (the old log-probs' pass; 0 for the first `first_update_rows`
                rows, whose first update gives them) + 1 (the reference's, with `reference_pass`)
        FLOPs = Σ_ranks Σ_i T_i · [N_π·(2·F_i + 6·E_π) + N_V·(2 + 6·E)]
        mfu   = FLOPs / (seconds · peak_flops · world.world_size)

    N_π, N_V (0 without a critic), E and the rest are `work`'s (`StepWork`); E_π = E when the step
    `updates_policy` (0 in a critic's warm-up). batch.prompt_mask: (B, P); batch.response_mask: (B, R)."""
    if peak_flops is None:
        return {}
    tokens = (batch.prompt_mask.sum(dim=1) + batch.response_mask.sum(dim=1)).double()
    forward = torch.full_like(tokens, 2.0 + work.reference_pass)
    forward[: work.first_update_rows] -= 1
    policy_training = work.epochs if work.updates_policy else 0
    flops = model_flops(work.policy_parameters, tokens, forward_passes=forward, training_passes=policy_training)
    if work.critic_parameters is not None:
        flops = flops + model_flops(work.critic_parameters, tokens, forward_passes=1, training_passes=work.epochs)
    total = float(sum_over_ranks(world, flops.sum()))
    return {"perf/mfu": flops_utilisation(total, work.seconds, peak_flops, world.world_size)}
