"""Building a `PolicyBatch` from token lists, for tests that need rollouts without generating."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from pacs.rollout.base import pad_rows
from pacs.train.batch import PolicyBatch


def policy_batch(
    prompts: Sequence[torch.Tensor], responses: Sequence[torch.Tensor], rewards: Sequence[float], dtype=torch.float64
) -> PolicyBatch:
    """Row i = prompts[i] (left-padded) followed by responses[i] (right-padded), with rewards[i];
    masks and rewards in `dtype`, old log-probs zero."""
    response_mask = pad_rows([torch.ones(len(response), dtype=dtype) for response in responses], 0, left=False)
    return PolicyBatch(
        prompt_ids=pad_rows(list(prompts), 0, left=True),
        prompt_mask=pad_rows([torch.ones_like(prompt) for prompt in prompts], 0, left=True),
        response_ids=pad_rows(list(responses), 0, left=False),
        response_mask=response_mask,
        rewards=torch.tensor(list(rewards), dtype=dtype),
        old_logprobs=torch.zeros_like(response_mask),
        entropy=torch.zeros_like(response_mask),
    )
