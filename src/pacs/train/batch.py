"""A step's rollouts as training tensors (`PolicyBatch`): rows of [left-padded prompt |
right-padded response], with the per-row terms the step fills in (old log-probs, the algorithm's
step terms).

A response may hold a tool's output (multi-turn rollouts, `pacs.rollout.multiturn`): those tokens
are in the sequence the policy attends to (`response_mask`), but the model did not sample them, so
no algorithm scores them. Every algorithm sees one mask, `loss_mask = response_mask ·
model_token_mask`, under the name "response_mask" (`tensors`): its log-probs, losses, KL, entropy,
token counts and PACS's r̂ all sum over the model's own tokens only. Single-turn batches have no
tool tokens and `loss_mask` is `response_mask` itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch

from pacs.algos.shaping import RESPONSE_LENGTHS
from pacs.distributed.collectives import gather_rows
from pacs.distributed.world import World
from pacs.rollout.base import Rollouts


@dataclass
class PolicyBatch:
    """Row i of every tensor describes response i; rows [g*n, (g+1)*n) share prompt g.

    prompt_ids:    (B, P) left-padded prompt tokens
    prompt_mask:   (B, P) 1 on prompt tokens
    response_ids:  (B, R) right-padded response tokens
    response_mask: (B, R) 1.0 on response tokens (float, in the model's compute dtype)
    rewards:       (B,)   verifier outcome in [0, 1]
    old_logprobs:  (B, R) log-probabilities under the rollout policy (`not_computed` until they are)
    entropy:       (B, R) the rollout policy's entropy at each response position, for metrics
                   (`not_computed` until computed, with old_logprobs)
    row_terms:     per-row (B,) or per-token (B, R) tensors that an algorithm adds (advantages,
                   reference log-probs, values, ...); "sampler_logprobs" (B, R) from the start when
                   the engine returned its own log-probs (`Rollouts.response_logprobs`)
    model_token_mask: (B, R) 1.0 on the response tokens the model sampled, 0.0 on a tool's output
                   (`Rollouts.model_token_mask`); None: every response token is the model's
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rewards: torch.Tensor
    old_logprobs: torch.Tensor
    entropy: torch.Tensor
    row_terms: dict[str, torch.Tensor] = field(default_factory=dict)
    model_token_mask: torch.Tensor | None = None

    @classmethod
    def from_rollouts(cls, rollouts: Rollouts, rewards: torch.Tensor, dtype: torch.dtype) -> PolicyBatch:
        mask = rollouts.response_mask.to(dtype)
        return cls(
            prompt_ids=rollouts.prompt_ids,
            prompt_mask=rollouts.prompt_mask,
            response_ids=rollouts.response_ids,
            response_mask=mask,
            rewards=rewards.to(dtype),
            old_logprobs=not_computed(mask),
            entropy=not_computed(mask),
            row_terms={} if rollouts.response_logprobs is None else {"sampler_logprobs": rollouts.response_logprobs.to(dtype)},
            model_token_mask=None if rollouts.model_token_mask is None else rollouts.model_token_mask.to(dtype),
        )

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    @property
    def loss_mask(self) -> torch.Tensor:
        """(B, R) response_mask · model_token_mask: 1.0 on the tokens the model sampled, the only
        ones any algorithm scores (`response_mask` itself when there are no tool tokens)."""
        return self.response_mask if self.model_token_mask is None else self.response_mask * self.model_token_mask

    def rows(self, index: torch.Tensor | slice) -> PolicyBatch:
        """The selected rows, with columns that are padding in every selected row trimmed."""
        selected = {f.name: getattr(self, f.name)[index] for f in fields(self) if f.name not in _OPTIONAL_FIELDS}
        prompt_start = int(selected["prompt_mask"].any(dim=0).long().argmax())
        response_width = int(selected["response_mask"].any(dim=0).sum())
        return replace(
            self,
            prompt_ids=selected["prompt_ids"][:, prompt_start:],
            prompt_mask=selected["prompt_mask"][:, prompt_start:],
            response_ids=selected["response_ids"][:, :response_width],
            response_mask=selected["response_mask"][:, :response_width],
            rewards=selected["rewards"],
            old_logprobs=selected["old_logprobs"][:, :response_width],
            entropy=selected["entropy"][:, :response_width],
            row_terms={
                name: value[index][:, :response_width] if value.dim() == 2 else value[index]
                for name, value in self.row_terms.items()
            },
            model_token_mask=None if self.model_token_mask is None else self.model_token_mask[index][:, :response_width],
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """What an algorithm sees (`pacs.algos.base`): old_logprobs, the `loss_mask` as
        "response_mask", rewards and every row term; with tool tokens, also each response's
        length as the length limit counts it (model and tool tokens, `RESPONSE_LENGTHS`), which
        the loss mask does not give (DAPO's overlong shaping)."""
        tensors = {
            "old_logprobs": self.old_logprobs,
            "response_mask": self.loss_mask,
            "rewards": self.rewards,
            **self.row_terms,
        }
        if self.model_token_mask is not None:
            tensors[RESPONSE_LENGTHS] = self.response_mask.sum(dim=1)
        return tensors

    def to(self, device: torch.device) -> PolicyBatch:
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self) if f.name not in _OPTIONAL_FIELDS}
        return replace(
            self,
            **moved,
            row_terms={k: v.to(device) for k, v in self.row_terms.items()},
            model_token_mask=None if self.model_token_mask is None else self.model_token_mask.to(device),
        )


_OPTIONAL_FIELDS = ("row_terms", "model_token_mask")
"""The fields of `PolicyBatch` that are not one tensor of B rows each."""


def not_computed(response_mask: torch.Tensor) -> torch.Tensor:
    """(B, R) stand-in for per-token values not computed yet: NaN at response tokens, so that one
    read before it is computed turns every result it enters into NaN instead of passing for a
    log-prob of 0; 0 at padding, as computed values are there."""
    return torch.full_like(response_mask, float("nan")).masked_fill(response_mask == 0, 0.0)


def row_tokens(batch: PolicyBatch) -> torch.Tensor:
    """(B,) real tokens of each row: its prompt's plus its response's (a tool's output included),
    without padding."""
    return batch.prompt_mask.sum(dim=1).long() + batch.response_mask.sum(dim=1).long()


def micro_batch_slices(
    batch: PolicyBatch, *, max_rows: int, max_tokens: int | None = None, world: World | None = None
) -> list[slice]:
    """Consecutive micro-batches of whole rows that cover `batch` in order, each of at most
    `max_rows` rows (`train.micro_batch_size`) and, with `max_tokens` (`train.micro_batch_tokens`),
    at most `max_tokens` real tokens (`row_tokens`: prompt + response, never padding, whether
    the passes pad or pack); a row longer than `max_tokens` is a micro-batch of its own.

    Each micro-batch is as long as both limits allow, taken greedily from the first row. With
    several processes (`world`) the slices are the same on every rank (one collective gathers
    every rank's `row_tokens`): a micro-batch ends where any rank's share would pass the budget.
    Every rank then runs as many passes of as many rows as the others, which DDP and FSDP need
    (each forward is a collective there, and the padded passes' forwards depend on the rows,
    `pacs.train.logprobs.length_buckets`). Every rank's `batch` must have the same number of rows.
    """
    if max_tokens is None:
        return [slice(start, min(start + max_rows, len(batch))) for start in range(0, len(batch), max_rows)]
    tokens = row_tokens(batch).unsqueeze(0)
    if world is not None:
        tokens = gather_rows(world, tokens)
    per_rank = tokens.tolist()
    slices: list[slice] = []
    start = 0
    while start < len(batch):
        held = [rank[start] for rank in per_rank]
        stop = start + 1
        while (
            stop < len(batch) and stop - start < max_rows and all(h + rank[stop] <= max_tokens for h, rank in zip(held, per_rank))
        ):
            held = [h + rank[stop] for h, rank in zip(held, per_rank)]
            stop += 1
        slices.append(slice(start, stop))
        start = stop
    return slices
