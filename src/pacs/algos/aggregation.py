"""How per-token losses become one loss: L = Σ_i w_i Σ_t m_it ℓ_it, with the row weights w_i set
by the aggregation mode (``aggregation_weights``) over a whole mini-batch, so that micro-batches'
losses add up to the mini-batch's.
"""

from __future__ import annotations

import typing
from typing import Literal

import torch

from pacs.algos.masks import check_choice, check_same_shape, masked_sum

LossAggregation = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
"""How per-token losses are aggregated (``aggregation_weights``); the type of the `loss_agg` options."""


LOSS_AGG_MODES: tuple[str, ...] = typing.get_args(LossAggregation)


def aggregation_weights(
    response_mask: torch.Tensor,
    mode: str,
    *,
    num_rows: int | None = None,
    num_tokens: float | None = None,
    max_response_length: int | None = None,
) -> torch.Tensor:
    """Per-row weights w with which a loss mode aggregates per-token losses: L = Σ_i w_i Σ_t m_it ℓ_it.

    The modes are defined over a mini-batch (one optimizer update) of ``num_rows`` rows holding
    ``num_tokens`` response tokens in all; because every w_i depends on row i and those two
    mini-batch constants only, the weights of any subset of rows (a micro-batch) give exactly
    that subset's share of the mini-batch loss:

        token-mean:               w_i = 1 / num_tokens
        seq-mean-token-sum:       w_i = 1 / num_rows
        seq-mean-token-mean:      w_i = 1 / (num_rows · max(Σ_t m_it, 1))
        seq-mean-token-sum-norm:  w_i = 1 / (num_rows · max_response_length)

    ``seq-mean-token-sum-norm`` is Dr. GRPO's unbiased aggregation (Liu et al. 2025, arXiv
    2503.20783; verl's name, used by the paper's GRPO baseline): token sums divided by a constant,
    the maximum response length, so that no response's tokens are up- or down-weighted by its
    length. verl divides by the padded width of each micro-batch tensor instead, which varies with
    the batch's longest response (and here with how the trainer trims padding per micro-batch), so
    the same tokens would get different weights in different batches; the constant ``max_response_length``
    keeps the weight a fixed 1 / (num_rows · max_response_length), as Dr. GRPO intends.

    Args:
        response_mask: (b, T) response mask of the rows to weight (float, int or bool).
        mode: one of ``LOSS_AGG_MODES``.
        num_rows: rows in the whole mini-batch; None: b (these rows are the mini-batch).
        num_tokens: response tokens in the whole mini-batch, > 0; None: the mask's sum, at least 1.
        max_response_length: the maximum response length, required by ``seq-mean-token-sum-norm``.

    Returns:
        (b,) weights, float64 for a float64 mask and float32 otherwise, no gradient.

    Raises:
        ValueError: unknown ``mode``, ``response_mask`` not 2-D, non-positive ``num_rows``,
            ``num_tokens`` or ``max_response_length``, or a missing ``max_response_length`` for ``seq-mean-token-sum-norm``.
    """
    check_choice("loss_agg", mode, LOSS_AGG_MODES)
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be 2-D (B, T), got shape {tuple(response_mask.shape)}")
    dtype = torch.float64 if response_mask.dtype == torch.float64 else torch.float32
    token_counts = response_mask.to(dtype).sum(dim=-1)
    if num_rows is None:
        num_rows = response_mask.shape[0]
    elif isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
        raise ValueError(f"num_rows must be a positive integer (rows in the mini-batch), got {num_rows!r}")
    if num_tokens is None:
        num_tokens = max(float(token_counts.sum()), 1.0)
    elif not num_tokens > 0:
        raise ValueError(f"num_tokens must be > 0 (response tokens in the mini-batch), got {num_tokens!r}")
    ones = torch.ones_like(token_counts)
    if mode == "token-mean":
        return ones / num_tokens
    if mode == "seq-mean-token-sum":
        return ones / num_rows
    if mode == "seq-mean-token-mean":
        return 1 / (num_rows * token_counts.clamp(min=1))
    if isinstance(max_response_length, bool) or not isinstance(max_response_length, int) or max_response_length < 1:
        raise ValueError(
            f"loss_agg 'seq-mean-token-sum-norm' needs max_response_length, the maximum response length, as a "
            f"positive integer; got {max_response_length!r}"
        )
    return ones / (num_rows * max_response_length)


def weighted_token_sum(per_token: torch.Tensor, response_mask: torch.Tensor, row_weights: torch.Tensor) -> torch.Tensor:
    """Formula: ``Σ_i w_i Σ_t m_it · per_token_it``.

    Args:
        per_token: (B, T) per-token values, e.g. losses.
        response_mask: (B, T) 1 at response tokens, 0 at padding.
        row_weights: (B,) weights w, e.g. from ``aggregation_weights``; cast to ``per_token``'s dtype.

    Returns:
        0-dim sum, differentiable w.r.t. ``per_token``.
    """
    row_sums = masked_sum(per_token, response_mask)
    check_same_shape(row_sums=row_sums, row_weights=row_weights)
    return (row_weights.to(row_sums.dtype) * row_sums).sum()


def aggregate_loss(
    per_token_loss: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    *,
    num_rows: int | None = None,
    num_tokens: float | None = None,
    max_response_length: int | None = None,
) -> torch.Tensor:
    """These rows' share of a mini-batch loss under loss aggregation ``mode``.

    Formula: ``L = Σ_i w_i Σ_t m_it ℓ_it`` with w from ``aggregation_weights`` (see there for the
    modes). Called on each micro-batch with the mini-batch's ``num_rows`` and ``num_tokens``, the
    shares sum to the mini-batch loss, in value and gradient. Without them the rows are taken to
    be the whole mini-batch, e.g. token-mean is ``Σ_it m ℓ / Σ_it m``.

    Args:
        per_token_loss: (b, T) per-token losses ℓ.
        response_mask: (b, T) 1 at response tokens, 0 at padding (float, int or bool).
        mode: one of ``LOSS_AGG_MODES``.
        num_rows, num_tokens, max_response_length: see ``aggregation_weights``.

    Returns:
        0-dim loss, differentiable w.r.t. ``per_token_loss``.

    Raises:
        ValueError: as ``aggregation_weights``, or shapes that differ.
    """
    check_same_shape(per_token_loss=per_token_loss, response_mask=response_mask)
    weights = aggregation_weights(
        response_mask, mode, num_rows=num_rows, num_tokens=num_tokens, max_response_length=max_response_length
    )
    return weighted_token_sum(per_token_loss, response_mask, weights)
