"""The KL penalty to a reference policy π_ref, per token (``kl_penalty``): k1, k2 (gradient of
KL(π_θ ‖ π_ref)) or k3 (gradient of KL(π_ref ‖ π_θ)), in the loss or in the reward.
"""

from __future__ import annotations

import typing
from typing import Literal

import torch

from pacs.algos.masks import check_choice, check_same_shape

KlEstimator = Literal["k1", "k2", "k3"]
"""The per-token KL estimators of ``kl_penalty``."""


KL_ESTIMATORS: tuple[str, ...] = typing.get_args(KlEstimator)


def check_kl_penalty(kl_coef: float, kl_estimator: str, *, in_reward: bool = False) -> None:
    """Raise ValueError unless ``kl_estimator`` can serve as a KL penalty with weight ``kl_coef``.

    ``k1`` is refused as a loss (``kl_coef > 0`` and not ``in_reward``): its expected gradient is
    zero (see ``kl_penalty``), so it adds noise and pulls π_θ nowhere. Subtracted from the reward
    (``in_reward``) an estimate is a constant, not differentiated, and k1 is the classic choice.

    Raises:
        ValueError: an unknown ``kl_estimator``, or ``"k1"`` with ``kl_coef > 0``, naming the valid
            choices.
    """
    check_choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    if kl_estimator == "k1" and kl_coef > 0 and not in_reward:
        raise ValueError(
            f"kl_estimator 'k1' with kl_coef={kl_coef!r}: as a loss on tokens sampled from the policy, "
            "k1 = log π_θ − log π_ref has expected gradient zero (E[∇log π_θ] = 0), so it adds noise and "
            "does not regularise; valid with kl_coef > 0: 'k2' (follows the gradient of KL(π_θ ‖ π_ref)), "
            "'k3' (follows the gradient of KL(π_ref ‖ π_θ); GRPO's default); or subtract k1 from the reward "
            "instead (kl_in_reward=true, the classic PPO-RLHF penalty)"
        )


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, response_mask: torch.Tensor, estimator: str = "k3"
) -> torch.Tensor:
    """Per-token KL estimators between π_θ and the reference π_ref on tokens sampled from π_θ
    (J. Schulman, "Approximating KL divergence", 2020, http://joschu.net/blog/kl-approx.html).

    Formula (δ_it = ref_logprobs_it − logprobs_it = log π_ref(o_it) − log π_θ(o_it) at response
    tokens, δ = 0 at padding, so padding gives exactly 0 and no gradient, whatever its log-probs):
        k1 = −δ                 value: unbiased for KL(π_θ ‖ π_ref), high variance, can be < 0
        k2 = ½ δ²               value: biased, low variance
        k3 = exp(δ) − δ − 1     value: unbiased for KL(π_θ ‖ π_ref), low variance, ≥ 0

    As a loss, back-propagated on samples o ~ π_old = π_θ (the sample itself held fixed), the
    estimators follow different divergences; in expectation over o given its prefix:
        k1:  ∇k1 = ∇log π_θ(o),                        E = 0: no regularisation, only noise
        k2:  ∇k2 = (log π_θ(o) − log π_ref(o)) ∇log π_θ(o),   E = ∇KL(π_θ ‖ π_ref)  (forward)
        k3:  ∇k3 = (1 − π_ref(o)/π_θ(o)) ∇log π_θ(o),        E = ∇KL(π_ref ‖ π_θ)  (reverse; GRPO's)
    so k1 is refused as a penalty (``check_kl_penalty``); k2 and k3 both pull π_θ towards π_ref.
    verl clamps k3 (its ``low_var_kl``) to [−10, 10]; pacs does not: the clamp binds where
    π_ref(o)/π_θ(o) > e^2.6 ≈ 13, on the tokens π_θ has made much rarer than π_ref, and there sets
    the gradient to 0, so the penalty would stop pulling exactly where it is most needed (and
    k3's gradient would no longer be that of KL(π_ref ‖ π_θ)). The paper's baselines use no KL term.

    Args:
        logprobs: (B, T) log-probs under the current policy π_θ.
        ref_logprobs: (B, T) log-probs of the same tokens under the reference policy π_ref.
        response_mask: (B, T) 1 at response tokens, 0 at padding (float, int or bool).
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        (B, T) per-token estimates, exactly 0 at padding positions.

    Raises:
        ValueError: unknown ``estimator`` or shapes that differ.
    """
    check_choice("kl_estimator", estimator, KL_ESTIMATORS)
    check_same_shape(logprobs=logprobs, ref_logprobs=ref_logprobs, response_mask=response_mask)
    delta = torch.where(response_mask.bool(), ref_logprobs - logprobs, torch.zeros_like(logprobs))
    if estimator == "k1":
        return -delta
    if estimator == "k2":
        return 0.5 * delta**2
    return torch.exp(delta) - delta - 1
