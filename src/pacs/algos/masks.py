"""Masked reductions and argument checks that every algorithm in ``pacs.algos`` uses.

Notation used across the package:

- ``B``: number of responses in a batch; ``T``: number of response token positions.
- ``n`` (``group_size``): responses sampled per prompt; rows ``[g*n, (g+1)*n)`` of a batch share
  prompt ``g``, so a batch holds ``G = B // n`` groups.
- ``response_mask``: 1 at response tokens, 0 at padding. In a multi-turn response the trainer also
  puts 0 at a tool's output (`pacs.train.batch.PolicyBatch.loss_mask`): every sum, mean and token
  count of an algorithm then runs over the tokens the model sampled.

Masked reductions:

    masked_sum(v, m)  = Σ_t m_t · v_t
    masked_mean(v, m) = Σ_t m_t · v_t / max(Σ_t m_t, 1)

Pure tensor math: imports torch only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum of ``values`` over ``dim`` at positions where ``mask`` is 1.

    Formula: ``Σ_t mask_t · values_t``. Positions where ``mask`` is 0 contribute exactly 0 (and
    no gradient), even when ``values`` holds inf or nan there.

    Args:
        values: float tensor of any shape, e.g. (B, T).
        mask: tensor of the same shape as ``values`` with entries in {0, 1} (float, int or bool).
        dim: dimension to reduce.

    Returns:
        ``values`` reduced over ``dim``, e.g. (B,) for (B, T) inputs with ``dim=-1``.
    """
    check_same_shape(values=values, mask=mask)
    return torch.where(mask.bool(), values, torch.zeros_like(values)).sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Mean of ``values`` over ``dim`` at positions where ``mask`` is 1.

    Formula: ``Σ_t mask_t · values_t / max(Σ_t mask_t, 1)``. The denominator is clamped at 1 so an
    all-masked slice gives 0 instead of 0/0.

    Args:
        values: float tensor of any shape, e.g. (B, T).
        mask: tensor of the same shape as ``values`` with entries in {0, 1} (float, int or bool).
        dim: dimension to reduce.

    Returns:
        ``values`` averaged over ``dim``, e.g. (B,) for (B, T) inputs with ``dim=-1``.
    """
    token_counts = mask.to(values.dtype).sum(dim).clamp(min=1)
    return masked_sum(values, mask, dim) / token_counts


def check_same_shape(**tensors: torch.Tensor) -> None:
    """Raise ValueError unless all keyword tensors have one shape.

    Args:
        **tensors: tensors of any shape, keyed by the argument name reported in the error.

    Raises:
        ValueError: naming every argument with its shape, e.g.
            ``shape mismatch: logprobs (4, 7), response_mask (4, 6); all must have one shape``.
    """
    shapes = {name: tuple(tensor.shape) for name, tensor in tensors.items()}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} {shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch: {listed}; all must have one shape")


def check_choice(name: str, value: str, choices: Sequence[str]) -> None:
    """Raise ValueError unless ``value`` is one of ``choices``.

    Args:
        name: option name reported in the error, e.g. ``"estimator"``.
        value: the option value given.
        choices: the valid values.

    Raises:
        ValueError: e.g. ``unknown estimator 'foo'; valid: 'rloo', 'grpo', 'naive'``.
    """
    if value not in choices:
        valid = ", ".join(repr(choice) for choice in choices)
        raise ValueError(f"unknown {name} {value!r}; valid: {valid}")
