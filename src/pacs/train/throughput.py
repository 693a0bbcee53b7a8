"""The model FLOPs utilisation of a step, `perf/mfu` (`step_mfu`), with `train.peak_flops`.

MFU counts the model's multiply-adds as the 6ND rule does (Kaplan et al. 2020; PaLM's MFU): a
pass over T tokens of a model of N parameters costs 2·N·T FLOPs forward and 6·N·T forward and
backward. Attention's own FLOPs (quadratic in the length) and recomputation (activation
checkpointing, the no-grad passes an update makes for its metrics) are not counted.
"""

from __future__ import annotations

import math

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


def step_mfu(
    world: World,
    batch: PolicyBatch,
    *,
    peak_flops: float | None,
    step_s: float,
    policy_parameters: float,
    critic_parameters: float | None,
    reference_pass: bool,
    first_update_rows: int,
    epochs: int,
    updates_policy: bool,
) -> dict[str, float]:
    """{"perf/mfu": ...} of one step over every rank; {} when `peak_flops` is None.

        T_i   = prompt tokens + response tokens of row i of this rank's batch
        F_i   = 1 (generation) + 1 (the old log-probs' pass; 0 for the first `first_update_rows`
                rows, whose first update gives them) + 1 (the reference's, with `reference_pass`)
        FLOPs = Σ_ranks Σ_i T_i · [N_π·(2·F_i + 6·E_π) + N_V·(2 + 6·E)]
        mfu   = FLOPs / (step_s · peak_flops · world.world_size)

    N_π = `policy_parameters`, N_V = `critic_parameters` (0 without a critic: its values' pass and
    updates), E = `epochs`, E_π = E when the step `updates_policy` (0 in a critic's warm-up).
    batch.prompt_mask: (B, P); batch.response_mask: (B, R)."""
    if peak_flops is None:
        return {}
    tokens = (batch.prompt_mask.sum(dim=1) + batch.response_mask.sum(dim=1)).double()
    forward = torch.full_like(tokens, 2.0 + reference_pass)
    forward[:first_update_rows] -= 1
    flops = model_flops(policy_parameters, tokens, forward_passes=forward, training_passes=epochs if updates_policy else 0)
    if critic_parameters is not None:
        flops = flops + model_flops(critic_parameters, tokens, forward_passes=1, training_passes=epochs)
    total = float(sum_over_ranks(world, flops.sum()))
    return {"perf/mfu": flops_utilisation(total, step_s, peak_flops, world.world_size)}
