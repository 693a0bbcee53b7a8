"""The rollout-engine seam: prompts + sampling parameters + n -> grouped responses.

An engine is anything with `generate(prompt_token_ids, params) -> Rollouts`. The trainer and the
evaluator only talk to this interface: `pacs.rollout.hf` (transformers' generate, on the trained
module itself) and `pacs.rollout.vllm` (vLLM, with its own copy of the weights) implement it. The
trainer recomputes log-probabilities with the policy it updates; an engine's own log-probs
(`return_logprobs`) only measure how far the sampler is from the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: `n` responses per prompt at `temperature` / `top_p` (temperature 0: greedy
    decoding, the most likely token at each position), at most
    `max_new_tokens` each, stopping at any end-of-sequence token the model declares. With
    `return_logprobs`, the engine also reports the log-probability of each sampled token under
    the distribution it sampled from.

    `stop`, when set, is a per-row check on the tokens a row has generated so far (the prompt's
    excluded): True ends that row after its newest token, as an end-of-sequence token would, but
    the token it stops at is kept and no end-of-sequence token is added. It is decided from the
    row's own samples only, so the tokens kept are those the same draws give without it, cut
    there. It saves the tokens a caller would drop anyway (`pacs.rollout.multiturn`: the tokens
    after a tool call); an engine that cannot apply it may ignore it, and its rows then go on to
    `max_new_tokens` and an end-of-sequence token as without it (`pacs.rollout.hf` applies it
    without continuous batching; continuous batching and vLLM ignore it)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 32
    return_logprobs: bool = False
    stop: Callable[[Sequence[int]], bool] | None = None


def rank_seed(seed: int, rank: int) -> int:
    """The seed of process `rank`'s own random draws (its samples) in a run or an evaluation seeded
    with `seed`: apart from every other rank's, and from those of any other seed while there are
    fewer than 1,000,003 ranks."""
    return seed * 1_000_003 + rank


@dataclass
class Rollouts:
    """Responses grouped by prompt: rows [g*n, (g+1)*n) all answer prompt g (n = group_size).

    prompt_ids:     (B, P) left-padded prompt tokens, repeated n times per prompt
    prompt_mask:    (B, P) 1 on prompt tokens, 0 on padding
    response_ids:   (B, R) right-padded response tokens (the end-of-sequence token included)
    response_mask:  (B, R) 1 on generated tokens, 0 on padding after the end
    response_texts: B decoded responses, special tokens removed
    response_logprobs: (B, R) log-probability of each response token under the sampling
                       distribution (0.0 at padding), when `SamplingParams.return_logprobs`; else None
    model_token_mask: (B, R) 1 on the response tokens the model sampled, 0 on a tool's output
                      inserted into the response (`pacs.rollout.multiturn`) and on padding; None:
                      every response token is the model's (single-turn rollouts)
    answer_texts:   B texts the reward scores where they are not the responses' (with a tool: the
                    model's last turn, never a tool's output, `pacs.rollout.multiturn`); None:
                    `response_texts` (`scored_texts`)
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    response_texts: list[str]
    group_size: int
    response_logprobs: torch.Tensor | None = None
    model_token_mask: torch.Tensor | None = None
    answer_texts: list[str] | None = None

    @property
    def scored_texts(self) -> list[str]:
        """The B texts a reward function scores: `answer_texts`, else `response_texts`."""
        return self.response_texts if self.answer_texts is None else self.answer_texts

    def rows(self, start: int, stop: int) -> Rollouts:
        """Rows [start, stop) (whole groups), their padding trimmed to their own longest prompt and response."""
        prompt_mask, response_mask = self.prompt_mask[start:stop], self.response_mask[start:stop]
        prompt_from = self.prompt_ids.shape[1] - int(prompt_mask.sum(dim=1).max())
        response_to = int(response_mask.sum(dim=1).max())
        logprobs, model_tokens = self.response_logprobs, self.model_token_mask
        return Rollouts(
            prompt_ids=self.prompt_ids[start:stop, prompt_from:],
            prompt_mask=prompt_mask[:, prompt_from:],
            response_ids=self.response_ids[start:stop, :response_to],
            response_mask=response_mask[:, :response_to],
            response_texts=self.response_texts[start:stop],
            group_size=self.group_size,
            response_logprobs=None if logprobs is None else logprobs[start:stop, :response_to],
            model_token_mask=None if model_tokens is None else model_tokens[start:stop, :response_to],
            answer_texts=None if self.answer_texts is None else self.answer_texts[start:stop],
        )


def rollouts_from_rows(
    prompt_rows: Sequence[torch.Tensor],
    response_rows: Sequence[torch.Tensor],
    logprob_rows: Sequence[torch.Tensor] | None,
    tokenizer,
    group_size: int,
) -> Rollouts:
    """`Rollouts` from one unpadded 1-D tensor per row: its prompt, its response (through the
    end-of-sequence token) and, when given, its response tokens' log-probs; `tokenizer` pads and
    decodes."""
    pad_id = tokenizer.pad_token_id
    response_ids = pad_rows(response_rows, pad_id, left=False)
    return Rollouts(
        prompt_ids=pad_rows(prompt_rows, pad_id, left=True),
        prompt_mask=pad_rows([torch.ones_like(ids) for ids in prompt_rows], 0, left=True),
        response_ids=response_ids,
        response_mask=pad_rows([torch.ones_like(ids) for ids in response_rows], 0, left=False),
        response_texts=tokenizer.batch_decode(response_ids, skip_special_tokens=True),
        group_size=group_size,
        response_logprobs=pad_rows(logprob_rows, 0, left=False) if logprob_rows is not None else None,
    )


class RolloutEngine(Protocol):
    holds_own_weights: bool
    """True when the engine samples from a copy of the weights (vLLM), which the trainer must push
    with `load_weights` after each update and whose log-probs it checks against its own; False when
    it generates with the trained module itself (transformers), always the policy's weights."""

    @property
    def has_weights(self) -> bool:
        """False while an engine that holds its own copy has none to generate with (started without
        reading the checkpoint, or dropped it asleep): `load_weights` must come before `generate`."""
        ...

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        """Sample `params.n` responses for each prompt (a list of token ids, no padding)."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Make the engine sample from `weights` from its next `generate` on: every parameter of the
        model, as (name, whole tensor) pairs named as in the Hugging Face model (`lm_head.weight`
        included when tied to the embeddings), each consumed before the next is asked for, so the
        caller may build one at a time (an FSDP gather, a LoRA merge) and free it. Nothing computed
        with the old weights (a prefix cache) survives. Only for `holds_own_weights` engines; the
        others refuse it (TypeError): they have no copy to load."""
        ...

    def sleep(self) -> None:
        """Free the device memory the engine holds of its own until it next generates or loads
        weights (vLLM with sleep mode: its KV cache and weights), for the trainer's passes that
        follow a rollout; a no-op where there is nothing to free."""
        ...

    def close(self) -> None:
        """Release what the engine holds of its own (vLLM: its KV cache, weights and process groups)."""
        ...


@dataclass(frozen=True)
class GenerationGroup:
    """The ranks that generate together: `size` consecutive ranks running one engine over `size`
    devices (vLLM's tensor parallelism; 1: each rank its own engine). Every rank of a group must
    ask its engine for the same prompts with the same seed, and gets the same responses. This
    rank is `member` of group `index` of `count`.

    Training: each rank generates for the group's prompts (every rank's share of the step, in
    rank order) and keeps its own rows (`own_rows`). Evaluation: the groups split the problems,
    every rank of a group evaluates its group's share, and one rank (`is_leader`) reports it."""

    index: int = 0
    count: int = 1
    member: int = 0
    size: int = 1

    @classmethod
    def of(cls, rank: int, world_size: int, size: int, *, processes_per_node: int) -> GenerationGroup:
        """Rank `rank`'s group of `size` consecutive ranks; ValueError (naming what works) unless
        `size` divides the processes of a node, `processes_per_node` (so that a group never spans
        two nodes) and so the world."""
        if size > 1 and (world_size == 1 or processes_per_node % size or world_size % size):
            raise ValueError(
                f"rollout.vllm.tensor_parallel_size={size} with {world_size} process(es), {processes_per_node} per node: "
                f"an engine over {size} GPUs is run by {size} torchrun processes of one node together, so the "
                f"processes per node must be a multiple of {size} (e.g. torchrun --nproc_per_node {size}); "
                "or set rollout.vllm.tensor_parallel_size=1 (one engine per process)"
            )
        return cls(index=rank // size, count=world_size // size, member=rank % size, size=size)

    @property
    def is_leader(self) -> bool:
        return self.member == 0

    @property
    def ranks(self) -> range:
        """Every rank of this group, in order."""
        return range(self.index * self.size, (self.index + 1) * self.size)

    def own_rows(self, rollouts: Rollouts, rows_per_member: int) -> Rollouts:
        """This rank's rows of the group's `rollouts` (each member's `rows_per_member` rows after
        the previous member's)."""
        if self.size == 1:
            return rollouts
        return rollouts.rows(self.member * rows_per_member, (self.member + 1) * rows_per_member)


def pad_rows(rows: Sequence[torch.Tensor], pad_value: int, *, left: bool) -> torch.Tensor:
    """Stack 1-D tensors of different lengths into (len(rows), max_len), padding on one side."""
    width = max(len(row) for row in rows)
    out = torch.full((len(rows), width), pad_value, dtype=rows[0].dtype)
    for i, row in enumerate(rows):
        if left:
            out[i, width - len(row) :] = row
        else:
            out[i, : len(row)] = row
    return out
