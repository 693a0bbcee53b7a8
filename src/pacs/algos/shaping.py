"""Outcome rewards shaped before an algorithm sees them: DAPO's overlong penalty for responses
inside the last ``buffer`` tokens of the length limit, and outcome rewards placed on each
response's last token (PPO's GAE, and the KL penalty in the reward).
"""

from __future__ import annotations

import math

import torch


def check_overlong_shaping(buffer: int, penalty: float, max_response_length: int | None) -> None:
    """Raise ValueError unless DAPO's overlong shaping (``overlong_penalty``) can be computed:
    ``buffer`` an integer in [0, max_response_length] (0: off), ``penalty`` a finite number >= 0, and the
    maximum response length ``max_response_length`` known when ``buffer`` > 0."""
    if isinstance(buffer, bool) or not isinstance(buffer, int) or buffer < 0:
        raise ValueError(f"overlong_buffer must be an integer >= 0 (response tokens; 0: no shaping), got {buffer!r}")
    if not (math.isfinite(penalty) and penalty >= 0):
        raise ValueError(f"overlong_penalty must be a finite number >= 0, got {penalty!r}")
    if buffer and (max_response_length is None or buffer > max_response_length):
        raise ValueError(
            f"overlong_buffer={buffer} must not exceed the maximum response length (max_response_length={max_response_length!r}): "
            "the penalty grows over the last overlong_buffer tokens before it"
        )


RESPONSE_LENGTHS = "response_lengths"
"""The batch key of (B,) response lengths as the length limit counts them: with tool outputs in a
response, its model and tool tokens together, which "response_mask" (the model's tokens only)
does not count (`response_lengths`)."""


def response_lengths(batch) -> torch.Tensor:
    """(B,) each response's length as the length limit counts it: ``batch["response_lengths"]``
    where the trainer gives it (responses with tool outputs), else Σ_t ``response_mask``."""
    if RESPONSE_LENGTHS in batch:
        return batch[RESPONSE_LENGTHS]
    return batch["response_mask"].sum(dim=-1)


def overlong_penalty(lengths: torch.Tensor, max_length: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, Eq. 13), added to the
    outcome reward so that a response nearing the length limit earns less, whatever its outcome.

    Formula (|o_i| = ``lengths``, L_max = ``max_length``, L_cache = ``buffer``, p = ``penalty``):
        R_length(o_i) = 0                                   |o_i| ≤ L_max − L_cache
                      = ((L_max − L_cache) − |o_i|) / L_cache   L_max − L_cache < |o_i| ≤ L_max
                      = −1                                  |o_i| > L_max
        returned:  p · R_length(o_i)   (verl's ``overlong_buffer.penalty_factor``; DAPO: p = 1)

    Args:
        lengths: (B,) response lengths |o_i| as ``max_length`` counts them (`response_lengths`).
        max_length: L_max, the maximum response length (``data.max_response_length``).
        buffer: L_cache, 1 <= L_cache <= L_max.
        penalty: p >= 0.

    Returns:
        (B,) penalties in [−p, 0], float32 or wider, constants.
    """
    check_overlong_shaping(buffer, penalty, max_length)
    if buffer == 0:
        raise ValueError("overlong_penalty needs buffer >= 1 (buffer 0 switches the shaping off)")
    dtype = torch.promote_types(lengths.dtype, torch.float32) if lengths.is_floating_point() else torch.float32
    lengths = lengths.detach().to(dtype)
    excess = (lengths - (max_length - buffer)).clamp(min=0) / buffer
    return -penalty * excess.clamp(max=1)


def shaped_rewards(
    rewards: torch.Tensor, lengths: torch.Tensor, *, max_length: int | None, buffer: int, penalty: float
) -> torch.Tensor:
    """The outcome rewards with DAPO's overlong penalty added (``overlong_penalty``, ``buffer`` >= 1,
    ``lengths`` (B,) as the limit counts them): (B,) R_i + p · R_length(o_i), constants, at least
    float32. ValueError without ``max_length``
    (``check_overlong_shaping`` refuses that combination first)."""
    if max_length is None:
        raise ValueError("overlong shaping needs max_length, the longest response allowed")
    shaping = overlong_penalty(lengths, max_length, buffer, penalty)
    dtype = torch.promote_types(rewards.dtype, shaping.dtype)
    return rewards.detach().to(dtype) + shaping.to(dtype)


def outcome_token_rewards(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Per-token rewards with each outcome reward on its response's last token.

    Formula: r_it = R_i if t = max{t' : m_it' = 1} else 0; a row without response tokens gets no
    reward.

    Args:
        rewards: (B,) outcome rewards R.
        response_mask: (B, T) 1 at response tokens, 0 at padding (float, int or bool).

    Returns:
        (B, T) token rewards, at least float32.

    Raises:
        ValueError: ``response_mask`` not 2-D or ``rewards`` not (B,).
    """
    if response_mask.dim() != 2 or rewards.shape != response_mask.shape[:1]:
        raise ValueError(
            f"expected rewards (B,) and response_mask (B, T), got {tuple(rewards.shape)} and {tuple(response_mask.shape)}"
        )
    is_response = response_mask.bool()
    positions = torch.arange(response_mask.shape[1], device=response_mask.device).expand_as(is_response)
    last = torch.where(is_response, positions, -1).max(dim=-1).values  # (B,): -1 for an empty row
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    token_rewards = torch.zeros(response_mask.shape, dtype=dtype, device=response_mask.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    token_rewards[rows, last[rows]] = rewards.detach()[rows].to(dtype)
    return token_rewards
