"""Building a `PolicyBatch` from token lists, for tests that need rollouts without generating."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pacs.rollout.base import pad_rows
from pacs.train.batch import PolicyBatch


def policy_batch(
    prompts: Sequence[torch.Tensor],
    responses: Sequence[torch.Tensor],
    rewards: Sequence[float],
    dtype=torch.float64,
    model_tokens: Sequence[torch.Tensor] | None = None,
) -> PolicyBatch:
    """Row i = prompts[i] (left-padded) followed by responses[i] (right-padded), with rewards[i];
    masks and rewards in `dtype`, old log-probs zero. `model_tokens[i]`: 1 where responses[i]'s
    token is the model's, 0 where it is a tool's output (None: every token is the model's)."""
    response_mask = pad_rows([torch.ones(len(response), dtype=dtype) for response in responses], 0, left=False)
    model_token_mask = None if model_tokens is None else pad_rows([row.to(dtype) for row in model_tokens], 0, left=False)
    return PolicyBatch(
        prompt_ids=pad_rows(list(prompts), 0, left=True),
        prompt_mask=pad_rows([torch.ones_like(prompt) for prompt in prompts], 0, left=True),
        response_ids=pad_rows(list(responses), 0, left=False),
        response_mask=response_mask,
        rewards=torch.tensor(list(rewards), dtype=dtype),
        old_logprobs=torch.zeros_like(response_mask),
        entropy=torch.zeros_like(response_mask),
        model_token_mask=model_token_mask,
    )
