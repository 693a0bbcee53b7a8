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


GROUP_SIZE = 4
"""Responses per prompt in `ragged_batch`."""
RAGGED_PROMPTS = 4
"""Prompts in `ragged_batch`."""
ALGORITHMS = {
    "pacs": {"name": "pacs", "beta": 2.0},
    "pacs mean_logprob, kl, entropy": {"name": "pacs", "proxy": "mean_logprob", "kl_coef": 0.1, "entropy_coef": 0.01},
    "grpo with kl": {"name": "grpo", "kl_coef": 0.1, "kl_estimator": "k2"},
    "dr_grpo": {"name": "dr_grpo"},
    "rloo": {"name": "rloo", "loss_agg": "seq-mean-token-sum"},
    "dapo": {"name": "dapo", "loss_agg": "token-mean"},
    "gspo": {"name": "gspo"},
    "cispo": {"name": "cispo", "entropy_coef": 0.01},
    "ppo": {"name": "ppo", "entropy_coef": 0.01},
}
"""Every built-in algorithm, some with KL and entropy terms, as the exactness tests on
`ragged_batch` build them (`ALGORITHM_CONFIGS[options["name"]](**options)`)."""


def ragged_batch(vocab_size: int, *, empty_response: bool = False) -> PolicyBatch:
    """4 prompts of 3-8 tokens x 4 responses of 1-6 tokens (one of 0 with `empty_response`),
    mixed rewards, random reference log-probs and values."""
    generator = torch.Generator().manual_seed(0)
    prompts, responses = [], []
    for _ in range(RAGGED_PROMPTS):
        prompt = torch.randint(1, vocab_size, (int(torch.randint(3, 9, (1,), generator=generator)),), generator=generator)
        for _ in range(GROUP_SIZE):
            prompts.append(prompt)
            length = int(torch.randint(1, 7, (1,), generator=generator))
            responses.append(torch.randint(1, vocab_size, (length,), generator=generator))
    if empty_response:
        responses[5] = responses[5][:0]
    batch = policy_batch(prompts, responses, [1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 0, 0])
    shape = batch.response_mask.shape
    batch.row_terms["ref_logprobs"] = -torch.rand(shape, generator=generator, dtype=torch.float64) * 3
    batch.row_terms["values"] = torch.rand(shape, generator=generator, dtype=torch.float64)
    return batch
