"""A step's rollouts as training tensors, and the policy's per-token log-probabilities on them.

Sequences are stored as [left-padded prompt | right-padded response]. Position ids count real
tokens only, as `generate` does with left padding, so the log-probabilities recomputed here are
those of the policy that sampled the responses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch
from transformers import PreTrainedModel

from pacs.rollout.base import Rollouts


@dataclass
class PolicyBatch:
    """Row i of every tensor describes response i; rows [g*n, (g+1)*n) share prompt g.

    prompt_ids:    (B, P) left-padded prompt tokens
    prompt_mask:   (B, P) 1 on prompt tokens
    response_ids:  (B, R) right-padded response tokens
    response_mask: (B, R) 1.0 on response tokens (float, in the model's compute dtype)
    rewards:       (B,)   verifier outcome in [0, 1]
    old_logprobs:  (B, R) log-probabilities under the rollout policy (zeros until computed)
    row_terms:     per-row (B,) or per-token (B, R) tensors that an algorithm adds (advantages,
                   reference log-probs, values, ...)
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rewards: torch.Tensor
    old_logprobs: torch.Tensor
    row_terms: dict[str, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def from_rollouts(cls, rollouts: Rollouts, rewards: torch.Tensor, dtype: torch.dtype) -> PolicyBatch:
        mask = rollouts.response_mask.to(dtype)
        return cls(
            prompt_ids=rollouts.prompt_ids,
            prompt_mask=rollouts.prompt_mask,
            response_ids=rollouts.response_ids,
            response_mask=mask,
            rewards=rewards.to(dtype),
            old_logprobs=torch.zeros_like(mask),
        )

    def __len__(self) -> int:
        return self.response_ids.shape[0]

    def rows(self, index: torch.Tensor | slice) -> PolicyBatch:
        """The selected rows, with columns that are padding in every selected row trimmed."""
        selected = {
            f.name: getattr(self, f.name)[index] for f in fields(self) if f.name != "row_terms"
        }
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
            row_terms={
                name: value[index][:, :response_width] if value.dim() == 2 else value[index]
                for name, value in self.row_terms.items()
            },
        )

    def tensors(self) -> dict[str, torch.Tensor]:
        """What an algorithm sees (`pacs.algos.base`): old_logprobs, response_mask, rewards and
        every row term."""
        return {
            "old_logprobs": self.old_logprobs,
            "response_mask": self.response_mask,
            "rewards": self.rewards,
            **self.row_terms,
        }

    def to(self, device: torch.device) -> PolicyBatch:
        moved = {f.name: getattr(self, f.name).to(device) for f in fields(self) if f.name != "row_terms"}
        return replace(self, **moved, row_terms={k: v.to(device) for k, v in self.row_terms.items()})


def _sequence_inputs(batch: PolicyBatch) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask and position_ids (B, P + R) of [prompt | response]."""
    input_ids = torch.cat([batch.prompt_ids, batch.response_ids], dim=1)
    attention_mask = torch.cat([batch.prompt_mask, batch.response_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


def response_values(critic: PreTrainedModel, batch: PolicyBatch) -> torch.Tensor:
    """The critic's value of the state before each response token: (B, R), in float32 or wider.

    `critic` is a token-classification model with one output (a value head); position t of the
    response is valued from the hidden state that predicts token t, as log-probs are.
    """
    response_width = batch.response_ids.shape[1]
    scores = critic(**_sequence_inputs(batch)).logits[:, -response_width - 1 : -1, 0]
    return scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores


@torch.no_grad()
def per_token_no_grad(
    compute: Callable[[PolicyBatch], torch.Tensor | tuple[torch.Tensor, ...]], batch: PolicyBatch, *, micro_batch_size: int
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """`compute(micro)` -> (b, R) tensor(s), over the whole batch in micro-batches, without
    gradient: (B, R), or a tuple of them when `compute` returns a tuple."""
    outputs: list[torch.Tensor] = []
    for start in range(0, len(batch), micro_batch_size):
        micro = batch.rows(slice(start, start + micro_batch_size))
        results = compute(micro)
        results = results if isinstance(results, tuple) else (results,)
        if not outputs:
            outputs = [torch.zeros_like(batch.response_mask) for _ in results]
        for out, result in zip(outputs, results):
            out[start : start + micro_batch_size, : micro.response_ids.shape[1]] = result.to(out.dtype)
    return tuple(outputs) if len(outputs) > 1 else outputs[0]


def response_values_no_grad(critic: PreTrainedModel, batch: PolicyBatch, *, micro_batch_size: int) -> torch.Tensor:
    """`response_values` over the whole batch, without gradient: (B, R)."""
    return per_token_no_grad(lambda micro: response_values(critic, micro), batch, micro_batch_size=micro_batch_size)


def response_logprobs(
    model: PreTrainedModel, batch: PolicyBatch, *, temperature: float = 1.0, with_entropy: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log pi(response_t | prompt, response_<t) for every response position: (B, R); with
    `with_entropy`, also the policy's entropy at each position, (B, R).

    Logits are divided by the sampling temperature (the behaviour policy at temperature T is
    softmax(logits / T)). Padding positions hold finite garbage; callers mask them. Only the last
    R + 1 positions' logits are computed (`logits_to_keep`), never the prompt's.
    """
    response_width = batch.response_ids.shape[1]
    logits = model(**_sequence_inputs(batch), logits_to_keep=response_width + 1).logits[:, :-1]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logits = logits / temperature
    normaliser = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1) - normaliser
    if not with_entropy:
        return logprobs
    log_distribution = logits - normaliser.unsqueeze(-1)
    entropy = -(log_distribution.exp() * log_distribution).sum(dim=-1)
    return logprobs, entropy


def response_logprobs_no_grad(
    model: PreTrainedModel,
    batch: PolicyBatch,
    *,
    micro_batch_size: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`response_logprobs` over the whole batch, without gradient: (B, R) (and the entropy)."""
    return per_token_no_grad(
        lambda micro: response_logprobs(model, micro, temperature=temperature, with_entropy=with_entropy),
        batch,
        micro_batch_size=micro_batch_size,
    )
