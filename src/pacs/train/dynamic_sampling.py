"""DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, section 3.2), for every algorithm
(`rollout.dynamic_sampling`).

A group whose responses all got the same reward carries no group-relative signal: GRPO-style
advantages are all 0, and so is PACS's first-update gradient (every residual R − σ(0) equal). As a
policy learns, more groups are all right or all wrong, and a fixed batch carries fewer useful
prompts. Dynamic sampling draws further prompts until the step holds as many groups of mixed
rewards as it trains on:

    round 1, 2, ...: draw train.batch_size prompts, sample rollout.n responses each, score them;
                     set every group aside as mixed (rewards not all equal) or not
    stop when every rank holds its share of train.batch_size mixed groups, or after
                     rollout.max_sampling_rounds rounds
    the step:        the first mixed groups in the order drawn, topped up at the cap with
                     unmixed ones (a full batch keeps every shape and mini-batch as configured)

verl (its DAPO recipe's `filter_groups`) draws until the batch is full and fails at its cap; here
the cap tops the batch up and the shortfall is logged (`sampling/unmixed_groups`). Each rank keeps
its own share (groups never move between ranks); the rounds stop together (a sum over ranks of
the groups still missing), so every rank generates the same number of times, as FSDP and vLLM's
colocated engines need. The extra prompts come from the prompt sampler, which moves on past them,
as verl's generation batches do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pacs.algos.groups import mixed_groups
from pacs.distributed.collectives import sum_over_ranks
from pacs.distributed.world import World
from pacs.rewards.pool import BatchScores
from pacs.rollout.base import Rollouts


@dataclass
class Draw:
    """One round of a step on this rank: its prompts' rows (one per response, groups of n
    consecutive rows), their rollouts and scores."""

    rows: list[dict]
    rollouts: Rollouts
    scored: BatchScores


def sample_mixed_groups(
    draw: Callable[[], Draw], world: World, *, group_size: int, groups: int, max_rounds: int
) -> tuple[Draw, dict[str, float]]:
    """`draw()` repeated until this rank, and every other, holds `groups` groups of mixed rewards,
    or `max_rounds` times; the step's `groups` groups (mixed first, in the order drawn, then
    unmixed at the cap) and the metrics "sampling/rounds" and "sampling/unmixed_groups" (in the
    step, over every rank)."""
    draws: list[Draw] = []
    mixed: list[tuple[int, int]] = []
    unmixed: list[tuple[int, int]] = []
    while True:
        draws.append(draw())
        rewards = torch.tensor(draws[-1].scored.scores, dtype=torch.float64)
        for group, is_mixed in enumerate(mixed_groups(rewards, group_size).tolist()):
            (mixed if is_mixed else unmixed).append((len(draws) - 1, group))
        missing = sum_over_ranks(world, torch.tensor([float(max(groups - len(mixed), 0))], dtype=torch.float64))
        if missing.item() == 0 or len(draws) == max_rounds:
            break
    chosen = (mixed + unmixed)[:groups]
    metrics = {"sampling/rounds": float(len(draws)), "sampling/unmixed_groups": missing.item()}
    return _groups_of(draws, chosen, group_size), metrics


def _groups_of(draws: Sequence[Draw], chosen: Sequence[tuple[int, int]], group_size: int) -> Draw:
    """One `Draw` of the `chosen` (draw, group) pairs, in order; scoring failures counted over
    every draw (they were all scored)."""
    rows = [draws[d].rows[g * group_size + k] for d, g in chosen for k in range(group_size)]
    parts = [_group_rollouts(draws[d].rollouts, g, group_size) for d, g in chosen]
    scores = [draws[d].scored.scores[g * group_size + k] for d, g in chosen for k in range(group_size)]
    scored = BatchScores(
        scores,
        timed_out=sum(d.scored.timed_out for d in draws),
        crashed=sum(d.scored.crashed for d in draws),
        server_restarts=sum(d.scored.server_restarts for d in draws),
    )
    return Draw(rows, _concatenated(parts), scored)


def _group_rollouts(rollouts: Rollouts, group: int, group_size: int) -> Rollouts:
    """The rows of one group of `rollouts`."""
    rows = slice(group * group_size, (group + 1) * group_size)
    return Rollouts(
        prompt_ids=rollouts.prompt_ids[rows],
        prompt_mask=rollouts.prompt_mask[rows],
        response_ids=rollouts.response_ids[rows],
        response_mask=rollouts.response_mask[rows],
        response_texts=rollouts.response_texts[rows],
        group_size=group_size,
        response_logprobs=None if rollouts.response_logprobs is None else rollouts.response_logprobs[rows],
        model_token_mask=None if rollouts.model_token_mask is None else rollouts.model_token_mask[rows],
        answer_texts=None if rollouts.answer_texts is None else rollouts.answer_texts[rows],
    )


def _concatenated(parts: Sequence[Rollouts]) -> Rollouts:
    """`parts` stacked, prompts left-padded and responses right-padded to the widest (padding is
    masked everywhere; its ids are 0)."""
    prompt_width = max(part.prompt_ids.shape[1] for part in parts)
    response_width = max(part.response_ids.shape[1] for part in parts)

    def stacked(name: str, width: int, *, left: bool) -> torch.Tensor:
        tensors = [getattr(part, name) for part in parts]
        return torch.cat([F.pad(t, (width - t.shape[1], 0) if left else (0, width - t.shape[1])) for t in tensors])

    return Rollouts(
        prompt_ids=stacked("prompt_ids", prompt_width, left=True),
        prompt_mask=stacked("prompt_mask", prompt_width, left=True),
        response_ids=stacked("response_ids", response_width, left=False),
        response_mask=stacked("response_mask", response_width, left=False),
        response_texts=[text for part in parts for text in part.response_texts],
        group_size=parts[0].group_size,
        response_logprobs=None
        if parts[0].response_logprobs is None
        else stacked("response_logprobs", response_width, left=False),
        model_token_mask=None if parts[0].model_token_mask is None else stacked("model_token_mask", response_width, left=False),
        answer_texts=None if parts[0].answer_texts is None else [text for part in parts for text in part.scored_texts],
    )
