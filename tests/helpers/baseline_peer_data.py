"""The rollouts on which tests/helpers/baselines_trl_checks.py and tests/helpers/baselines_verl_checks.py compare
pacs's 2025 baselines with TRL's and verl's code (each in its own venv; torch and numpy only)."""

from __future__ import annotations

import numpy as np
import torch

GROUPS, N, T, HORIZON = 3, 4, 6, 8
"""Prompts, responses per prompt, response positions, and the maximum response length."""
REWARDS = [1, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0, 1]
SHIFTS = {"dr_grpo": 0.3, "dapo": 0.3, "gspo": 1e-3, "cispo": 1.5}
"""How far the current policy is from the rollout policy per token: around each method's clip range."""


def rollout(shift: float, seed: int = 0) -> dict:
    """GROUPS prompts x N responses of ragged lengths: float64 log-probs (current = old +
    shift·noise, 0 at padding), masks, rewards, the same rewards on each response's last token
    (verl's token_level_rewards) and each row's prompt id (verl's uid)."""
    generator = torch.Generator().manual_seed(seed)
    rows = GROUPS * N
    lengths = torch.randint(1, T + 1, (rows,), generator=generator)
    mask = (torch.arange(T) < lengths.unsqueeze(1)).to(torch.float64)
    old = -3 * torch.rand(rows, T, generator=generator, dtype=torch.float64) * mask
    current = (old + shift * torch.randn(rows, T, generator=generator, dtype=torch.float64)) * mask
    rewards = torch.tensor(REWARDS, dtype=torch.float64)
    token_rewards = torch.zeros(rows, T, dtype=torch.float64)
    token_rewards[torch.arange(rows), lengths - 1] = rewards
    uid = np.array([f"prompt-{row // N}" for row in range(rows)], dtype=object)
    return {"old": old, "current": current, "mask": mask, "rewards": rewards, "token_rewards": token_rewards, "uid": uid}


def pacs_plugin_loss(algorithm, batch: dict, logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """pacs's plug-in on the whole batch, as the trainer calls it: advantages (B,), the loss at
    `logprobs`, and the update's metrics."""
    rows = {"old_logprobs": batch["old"], "response_mask": batch["mask"], "rewards": batch["rewards"]}
    rows.update(algorithm.prepare_step(rows))
    row_terms, metrics = algorithm.prepare_update(rows, lambda: logprobs.detach(), False)
    return rows["advantages"], algorithm.micro_batch_loss(logprobs, rows, row_terms), metrics
