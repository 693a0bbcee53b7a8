"""A step's rollouts as training tensors, and the policy's per-token log-probabilities on them.

Sequences are stored as [left-padded prompt | right-padded response]. Position ids count real
tokens only, as `generate` does with left padding, so the log-probabilities recomputed here are
those of the policy that sampled the responses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from pacs.models.loading import eval_mode
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
    entropy:       (B, R) the rollout policy's entropy at each response position, for metrics
                   (zeros until computed, with old_logprobs)
    row_terms:     per-row (B,) or per-token (B, R) tensors that an algorithm adds (advantages,
                   reference log-probs, values, ...)
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    rewards: torch.Tensor
    old_logprobs: torch.Tensor
    entropy: torch.Tensor
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
            entropy=torch.zeros_like(mask),
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
            entropy=selected["entropy"][:, :response_width],
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
    model: PreTrainedModel,
    compute: Callable[[PolicyBatch], torch.Tensor | tuple[torch.Tensor, ...]],
    batch: PolicyBatch,
    *,
    micro_batch_size: int,
) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """`compute(micro)` -> (b, R) tensor(s) of `model`, over the whole batch in micro-batches,
    without gradient and in eval mode: (B, R), or a tuple of them when `compute` returns a tuple."""
    outputs: list[torch.Tensor] = []
    with eval_mode(model):
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
    return per_token_no_grad(critic, lambda micro: response_values(critic, micro), batch, micro_batch_size=micro_batch_size)


LOGITS_CHUNK_BYTES = 64 * 2**20
"""Size of one chunk's fp32 logits: 64 MiB, i.e. 110 response tokens of Qwen2.5's 151,936-token
vocabulary (`tokens_per_chunk`; 128 MiB for a float64 model, whose logits stay float64). A
log-prob pass holds a few arrays of this size at a time (the chunk's logits, its softmax and, in
backward, their gradients), whatever the response length."""


def tokens_per_chunk(vocab_size: int) -> int:
    """Response tokens per chunk: as many as have `LOGITS_CHUNK_BYTES` of fp32 logits, at least 1."""
    return max(1, LOGITS_CHUNK_BYTES // (4 * vocab_size))


def unwrap_model(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside data-parallel wrappers (DDP and the like hold it as `.module`)."""
    while isinstance(getattr(model, "module", None), torch.nn.Module):
        model = model.module
    return model


class _ChunkedResponseTerms(torch.nn.Module):
    """Stands in for a causal LM's output embedding (`lm_head`) during one `response_logprobs`
    call, so the projection runs inside the model's own forward (where FSDP has gathered the
    root's parameters and DDP sees them used) but never builds the (B, R, V) logits.

    forward(hidden_states): hidden_states (B, S, H), the final hidden states of the last S >= R + 1
    positions -> (B, R, 1) log pi(response_t | ...) at each response position, or (B, R, 2) with
    the entropy as the second channel; exactly 0.0 where `response_mask` is 0.

    The hidden states that predict real response tokens are gathered into (N, H) and projected
    `tokens_per_chunk(vocab_size)` tokens at a time; with gradient enabled each chunk is
    checkpointed, so backward recomputes its logits instead of keeping them. `output_embeddings`
    is the model's own module (same parameters: tied embeddings stay tied).
    """

    def __init__(
        self,
        output_embeddings: torch.nn.Module,
        response_ids: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        vocab_size: int,
        temperature: float,
        with_entropy: bool,
    ):
        super().__init__()
        self.output_embeddings = output_embeddings
        self.response_ids = response_ids
        self.at_response = response_mask > 0
        self.chunk_tokens = tokens_per_chunk(vocab_size)
        self.temperature = temperature
        self.with_entropy = with_entropy
        self.result: torch.Tensor | None = None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        response_width = self.response_ids.shape[1]
        hidden = hidden_states[:, -response_width - 1 : -1][self.at_response]
        targets = self.response_ids[self.at_response]
        pieces = []
        for start in range(0, max(len(targets), 1), self.chunk_tokens):  # N = 0: one empty chunk
            chunk = (hidden[start : start + self.chunk_tokens], targets[start : start + self.chunk_tokens])
            if torch.is_grad_enabled():
                pieces.append(checkpoint(self.chunk_terms, *chunk, use_reentrant=False))
            else:
                pieces.append(self.chunk_terms(*chunk))
        terms = torch.cat(pieces)
        self.result = terms.new_zeros(*self.at_response.shape, terms.shape[-1])
        self.result[self.at_response] = terms
        return self.result

    def chunk_terms(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """hidden (n, H), targets (n,) -> (n, 1) log-probs, or (n, 2) log-probs and entropies.

        z = logits / T in float32 (float64 for a float64 model):
            log pi(target) = z_target - logsumexp(z)
            entropy        = logsumexp(z) - sum_v softmax(z)_v z_v
        """
        logits = self.output_embeddings(hidden)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / self.temperature
        normaliser = torch.logsumexp(logits, dim=-1)
        logprobs = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - normaliser
        if not self.with_entropy:
            return logprobs.unsqueeze(-1)
        entropy = normaliser - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)
        return torch.stack([logprobs, entropy], dim=-1)


def response_logprobs(
    model: PreTrainedModel, batch: PolicyBatch, *, temperature: float = 1.0, with_entropy: bool = False
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log pi(response_t | prompt, response_<t) for every response position: (B, R); with
    `with_entropy`, also the policy's entropy at each position, (B, R). Padding positions hold
    exactly 0.0 (callers mask them anyway).

    Logits are divided by the sampling temperature (the behaviour policy at temperature T is
    softmax(logits / T)) and taken in float32 or wider. They are computed only at response
    tokens and a chunk at a time (`_ChunkedResponseTerms`, which stands in for the model's
    output embedding during the call), so memory grows with the chunk, not with B x R x vocab.
    `model` may be wrapped (DDP's `.module`); its output embedding is restored afterwards, also
    on error. Raises ValueError for a model without an output embedding or one whose forward
    changes the projection's result before returning it as logits (logit softcapping or
    scaling, as Gemma 2 and Cohere do): log-probs here support Qwen2- and Llama-style models.
    """
    response_width = batch.response_ids.shape[1]
    inner = unwrap_model(model)
    output_embeddings = inner.get_output_embeddings()
    if output_embeddings is None:
        raise ValueError(f"{type(inner).__name__} has no output embedding (lm_head); a causal LM is needed")
    head = _ChunkedResponseTerms(
        output_embeddings,
        batch.response_ids,
        batch.response_mask,
        vocab_size=inner.config.vocab_size,
        temperature=temperature,
        with_entropy=with_entropy,
    )
    inner.set_output_embeddings(head)
    try:
        terms = model(**_sequence_inputs(batch), logits_to_keep=response_width + 1).logits
    finally:
        inner.set_output_embeddings(output_embeddings)
    if head.result is None or terms is not head.result:
        raise ValueError(
            f"{type(inner).__name__}.forward does not return its output embedding's result unchanged as "
            "logits (it softcaps, scales or slices them), so chunked log-probs would be wrong for it; "
            "supported: models whose logits are lm_head(hidden_states), such as Qwen2 and Llama"
        )
    return (terms[..., 0], terms[..., 1]) if with_entropy else terms[..., 0]


def fill_rollout_logprobs(
    model: PreTrainedModel, batch: PolicyBatch, rows: slice, *, micro_batch_size: int, temperature: float
) -> None:
    """Write the policy's log-probs and entropy at `batch.rows(rows)` (no gradient) into
    `batch.old_logprobs` and `batch.entropy`; nothing when `rows` selects no row."""
    selected = batch.rows(rows)
    if len(selected) == 0:
        return
    logprobs, entropy = response_logprobs_no_grad(
        model, selected, micro_batch_size=micro_batch_size, temperature=temperature, with_entropy=True
    )
    width = selected.response_ids.shape[1]
    batch.old_logprobs[rows, :width] = logprobs
    batch.entropy[rows, :width] = entropy


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
        model,
        lambda micro: response_logprobs(model, micro, temperature=temperature, with_entropy=with_entropy),
        batch,
        micro_batch_size=micro_batch_size,
    )
