"""Statistics inside each prompt's group of ``n`` responses: the group view, leave-one-out
centring (RLOO, PACS's ``rloo`` score), normalisation by the group's mean and spread (GRPO, PACS's
``grpo`` score), and which groups hold more than one outcome.

    leave_one_out_centred(x)_i = x_i − 1/(n−1) · Σ_{j≠i} x_j
    group_normalised(x)_i      = (x_i − mean_g x) / (std_g x + ε)    (unbiased std)
"""

from __future__ import annotations

import torch


def group_view(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """View a flat batch as one row per prompt group.

    Formula: ``out[g, k] = values[g * n + k]`` with ``n = group_size``.

    Args:
        values: (B,) tensor, B a multiple of ``group_size``.
        group_size: responses per prompt ``n`` (a positive integer).

    Returns:
        (B // n, n) view of ``values``.

    Raises:
        ValueError: if ``values`` is not 1-D, ``group_size`` is not a positive integer, or B is not
            a multiple of ``group_size``.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    if values.dim() != 1:
        raise ValueError(f"expected a 1-D (B,) tensor of per-response values, got shape {tuple(values.shape)}")
    batch_size = values.shape[0]
    if batch_size % group_size != 0:
        raise ValueError(
            f"batch size {batch_size} is not a multiple of group_size {group_size}; "
            f"each prompt's {group_size} responses must be whole, consecutive rows"
        )
    return values.view(batch_size // group_size, group_size)


GRPO_STD_EPS = 1e-6
"""Added to the group standard deviation before dividing by it (as in verl's GRPO)."""


def _shifted_to_first_of_group(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) values → (B // n, n) float64 ``d[g, k] = x[g·n + k] − x[g·n]`` (differentiable)."""
    grouped = group_view(values, group_size).to(torch.float64)
    return grouped - grouped[:, :1]


def leave_one_out_centred(values: torch.Tensor, group_size: int) -> torch.Tensor:
    """Each value minus the mean of the other values of its group (differentiable).

    Formula: ``out_i = x_i − 1/(n−1) · Σ_{j≠i} x_j`` over the n = ``group_size`` rows of i's group,
    computed in float64 on ``d_j = x_j − x_first`` (the same value: the shift cancels), so that a
    group whose values are all equal gets exactly 0 (every d_j is then exactly 0) rather than
    rounding error.

    Args:
        values: (B,) tensor, B a multiple of ``group_size`` (callers check n ≥ 2).

    Returns:
        (B,) centred values in ``values``' dtype, with gradient if ``values`` has one.
    """
    shifted = _shifted_to_first_of_group(values, group_size)
    others_mean = (shifted.sum(dim=-1, keepdim=True) - shifted) / (group_size - 1)
    return (shifted - others_mean).reshape(-1).to(values.dtype)


def group_normalised(
    values: torch.Tensor, group_size: int, *, divide_by_std: bool = True, eps: float, floor: float = 0.0
) -> torch.Tensor:
    """Each value centred on its group's mean, and divided by the group's std (differentiable).

    Formula: ``out_i = (x_i − mean_j x_j) / max(std_j x_j + eps, floor)``, std unbiased (divides by
    n − 1, as ``torch.std`` and verl); without the division when ``divide_by_std`` is False. Computed in
    float64 on ``d_j = x_j − x_first`` (mean and std are shifted alike, so ``out`` is unchanged),
    so that a group whose values are all equal gets exactly 0 (every d_j is then exactly 0; in
    float32, eight rewards 0.7 lie 6e-8 from their computed mean, which the division by
    std + eps = 6e-8 + 1e-6 would turn into 0.056).
    The gradient is the formula's: at an all-equal group ``∂out_i/∂x_j = (δ_ij − 1/n) / eps``.

    Args:
        values: (B,) tensor, B a multiple of ``group_size`` (callers check n ≥ 2).

    Returns:
        (B,) normalised values in ``values``' dtype, with gradient if ``values`` has one.
    """
    shifted = _shifted_to_first_of_group(values, group_size)
    centred = shifted - shifted.mean(dim=-1, keepdim=True)
    if divide_by_std:
        centred = centred / (shifted.std(dim=-1, keepdim=True) + eps).clamp(min=floor)
    return centred.reshape(-1).to(values.dtype)


def mixed_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Which prompt groups have rewards that are not all equal (the groups whose group-relative
    advantages, and PACS's class-weighted residuals, are not all zero).

    Args:
        rewards: (B,) rewards, B a multiple of ``group_size``.
        group_size: responses per prompt n.

    Returns:
        (B // n,) bool: R_gk ≠ R_g0 for some k.
    """
    grouped = group_view(rewards, group_size)
    return (grouped != grouped[:, :1]).any(dim=-1)


def mixed_group_fraction(rewards: torch.Tensor, group_size: int) -> float:
    """Fraction of prompt groups whose rewards are not all equal: mean of ``mixed_groups``."""
    return float(mixed_groups(rewards, group_size).float().mean())


def check_group_size(group_size: int, minimum: int, needed_by: str) -> None:
    """Raise ValueError unless ``group_size`` is an integer of at least ``minimum``.

    Args:
        group_size: responses per prompt n (``rollout.n``).
        minimum: the smallest valid n.
        needed_by: what needs it, reported in the error, e.g. ``"RLOO's leave-one-out baseline"``.

    Raises:
        ValueError: e.g. ``RLOO's leave-one-out baseline needs group_size >= 2 (responses per
            prompt, rollout.n), got 1``.
    """
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < minimum:
        raise ValueError(f"{needed_by} needs group_size >= {minimum} (responses per prompt, rollout.n), got {group_size!r}")
