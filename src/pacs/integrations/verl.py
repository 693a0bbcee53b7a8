"""PACS for verl users: an advantage estimator and a policy loss in verl's registries
(`verl.trainer.ppo.core_algos`), both named "pacs", so that PACS runs under verl's default trainer
with configuration alone:

    algorithm.adv_estimator=pacs actor_rollout_ref.actor.policy_loss.loss_mode=pacs

With `pip install 'pacs[verl]'` beside verl, verl imports this module itself in every process that
imports verl (pacs declares it in verl's "verl.plugins" entry points); `VERL_USE_EXTERNAL_MODULES=
pacs.integrations.verl` does the same where entry points are turned off. A registration that fails
is logged at ERROR level with its cause (verl's plugin loader itself logs it at DEBUG only).

PACS's score ψ_i needs every response of i's prompt, which verl scatters: it balances sequence
lengths across data-parallel ranks (trainer.balance_batch; always in its v1 trainer), shuffles
mini-batches (actor.shuffle) and packs micro-batches by token count (actor.use_dynamic_bsz). So the
per-response constants are computed where verl computes advantages, on the whole batch, with each
prompt's responses found by their prompt id (`uid`), and the actor's loss needs row i alone:

    adv_estimator  advantages[i, t] = A_i · m_it,  A_i = −∂S/∂r_i at r = 0 (θ = θ_old), S = Σ_i w_i ·
                   BCEWithLogits(ψ_i, R_i) over the responses of each uid (`pacs.algos.pacs_advantages`),
                   R_i = Σ_t token_level_rewards[i, t] in [0, 1]; the grpo score's denominator
                   floored at β · GRPO_SPREAD_FLOOR, as in pacs's trainer (`pacs.algos.pacs`: at
                   r = 0 the authors' formula gives advantages of order 1e5)
    loss_mode      loss_micro = −dp_size / global_batch_size · Σ_{i ∈ micro} ρ_i · A_i · r_i(θ),
                   r_i = β Σ_t m_it (log π_θ(o_it) − log π_old(o_it)),
                   ρ_i verl's sequence-level rollout-correction weight (1 without one)

Summed over micro-batches and averaged over ranks, the first update after a rollout (θ = θ_old,
ppo_mini_batch_size = data.train_batch_size, ppo_epochs = 1) has the gradient of PACS's loss
L = S / B over the batch, with the sampler correction as pacs's trainer applies it (each response's
whole coefficient times its own weight, `pacs.algos.sampler_corrected_coefficients`: per-response
importance weights, the group's statistics from the sampler, so the true gradient up to a positive
factor on the first update, `pacs.algos.pacs`): exact, whatever
the row order, ranks, micro-batch sizes or dynamic batching. With several mini-batches or epochs
per rollout, each later update keeps the coefficients of θ_old, A_i from e_i = w_i (R_i − σ(ψ_i))
at σ(ψ_i) = 1/2, while pacs's own trainer recomputes σ(ψ_i) at the current θ from whole groups;
the difference in each e_i is at most w_i · |ψ_i| / 4, ψ_i = r_i − mean_{j≠i} r_j at the current
θ (the loss logs mean |r_i| as actor/pacs_abs_proxy). Every mini-batch's loss is normalised by its
own size, as verl's losses are, so each update has the scale of a whole-batch update.

Used from verl: algorithm.rollout_correction with rollout_is="sequence" (TIS or IcePop thresholds,
batch normalisation) and sequence-level rejection sampling (rollout_rs="seq_*": a rejected
response's mask is zero, so its coefficient is 0 while its reward still counts in its group's
baseline: the same correction with ρ = 0); the entropy and KL-loss terms verl adds to the policy
loss (actor.loss_agg_mode applies to those only). Refused with a ValueError naming the setting:
advantages that are not one value per response (another adv_estimator such as gae), rewards
outside [0, 1] (algorithm.use_kl_in_reward=True), no prompt ids, rollout.n < 2 with the rloo or
grpo score, token-level rollout correction (rollout_is="token", rollout_rs="token_*"), and
rollout_correction.bypass_mode (it replaces the policy loss by its own). The loss cannot see which
adv_estimator made the advantages: set both to the same registered name.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from typing import Any

import numpy as np
import torch

from pacs.algos import ESTIMATORS, WEIGHTINGS, pacs_advantages, reward_proxy, sampler_corrected_coefficients
from pacs.algos.masks import check_choice
from pacs.algos.pacs import GRPO_SPREAD_FLOOR

INSTALL = "pip install 'pacs[verl]'"
NAME = "pacs"
logger = logging.getLogger(__name__)


def _core_algos():
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as error:
        raise ImportError(f"pacs.integrations.verl needs verl, which is not installed: {INSTALL}") from error
    return core_algos


def unsupported_rollout_correction(config: Any) -> list[str]:
    """The settings of verl's algorithm.rollout_correction that PACS cannot use, each with what to set."""
    correction = config.get("rollout_correction", None) if config is not None else None
    if correction is None:
        return []
    found = []
    if correction.get("bypass_mode", False):
        found.append("algorithm.rollout_correction.bypass_mode=True: set False (it replaces the policy loss by its own)")
    if correction.get("rollout_is", None) == "token":
        found.append("algorithm.rollout_correction.rollout_is='token': set 'sequence' (PACS weights a response as a whole)")
    token_level = [mode for mode in str(correction.get("rollout_rs", None) or "").split(",") if mode.startswith("token")]
    if token_level:
        found.append(
            f"algorithm.rollout_correction.rollout_rs={','.join(token_level)}: use the sequence-level seq_* modes "
            "(PACS weights a response as a whole)"
        )
    return found


def group_ids(index: np.ndarray | None) -> torch.Tensor:
    """(B,) integer ids from verl's per-row prompt ids (`uid`)."""
    if index is None:
        raise ValueError("adv_estimator=pacs needs the batch's prompt ids (data.non_tensor_batch['uid'])")
    _, ids = np.unique(np.asarray(index).astype(str), return_inverse=True)
    return torch.as_tensor(ids.reshape(-1), dtype=torch.long)


def pacs_advantage_estimator(*, estimator: str = "rloo", weighting: str = "question", beta: float = 1.0):
    """A verl advantage estimator computing PACS's advantages with these settings (see the module
    docstring); β sets the grpo score's spread floor β · GRPO_SPREAD_FLOOR, so pass the loss's β."""
    check_choice("estimator", estimator, ESTIMATORS)
    check_choice("weighting", weighting, WEIGHTINGS)
    if not (isinstance(beta, (int, float)) and math.isfinite(beta) and beta > 0):
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")

    def compute_pacs_advantages(
        token_level_rewards: torch.Tensor,
        response_mask: torch.Tensor,
        index: np.ndarray | None = None,
        config: Any = None,
        **_: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, T) rewards and mask, (B,) prompt ids -> (B, T) advantages A_i · m_it, twice (verl's
        advantages and returns)."""
        rewards = token_level_rewards.sum(dim=-1).double()
        if not bool(((rewards >= 0) & (rewards <= 1)).all()):
            raise ValueError(
                f"adv_estimator=pacs needs rewards in [0, 1] (PACS's BCE target); got min {rewards.min().item()}, max "
                f"{rewards.max().item()} (algorithm.use_kl_in_reward=True adds a KL term to them: set it False)"
            )
        unsupported = unsupported_rollout_correction(config)
        if unsupported:
            raise ValueError("adv_estimator=pacs cannot use:\n  " + "\n  ".join(unsupported))
        _, advantages = pacs_advantages(
            torch.zeros_like(rewards), rewards, group_ids(index), estimator=estimator, weighting=weighting,
            spread_floor=beta * GRPO_SPREAD_FLOOR,
        )  # fmt: skip
        advantages = advantages.to(token_level_rewards.dtype).unsqueeze(-1) * response_mask.to(token_level_rewards.dtype)
        return advantages, advantages

    compute_pacs_advantages.pacs_settings = {"estimator": estimator, "weighting": weighting, "beta": beta}
    return compute_pacs_advantages


def per_response(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(B,) the value of each response's first token (0 for a response of no tokens), and whether
    `values` (B, T) is one value over each response's tokens."""
    first_token = mask.argmax(dim=-1, keepdim=True)  # (B, 1)
    value = values.gather(-1, first_token).squeeze(-1) * (mask.sum(dim=-1) > 0)
    return value, bool((((values - value.unsqueeze(-1)) * mask) == 0).all())


def pacs_policy_loss_fn(*, beta: float = 1.0, estimator: str = "rloo"):
    """A verl policy loss for PACS's advantages (see the module docstring), with proxy scale β;
    `estimator` is the score of the paired adv_estimator (rloo and grpo need rollout.n >= 2)."""
    if not (isinstance(beta, (int, float)) and math.isfinite(beta)):
        raise ValueError(f"beta must be a finite number, got {beta!r}")
    check_choice("estimator", estimator, ESTIMATORS)

    def compute_pacs_loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """(B, T) tensors of one micro-batch -> (its term of the mini-batch's loss, metrics)."""
        mask = response_mask.to(log_prob.dtype)
        coefficients, one_per_response = per_response(advantages.to(log_prob.dtype), mask)
        unsupported = [] if one_per_response else ["advantages not one value per response: set algorithm.adv_estimator=pacs"]
        group_size = config.get("rollout_n", None) if config is not None else None
        if estimator != "naive" and group_size is not None and group_size < 2:
            unsupported.append(
                f"actor_rollout_ref.rollout.n={group_size}: set 2 or more (the {estimator} score compares responses)"
            )
        if rollout_is_weights is not None:
            weights, one_per_response = per_response(rollout_is_weights.to(log_prob.dtype), mask)
            if one_per_response:
                coefficients = sampler_corrected_coefficients(coefficients, weights)
            else:
                unsupported.append(
                    "token-level rollout-correction weights: set algorithm.rollout_correction.rollout_is='sequence'"
                )
        if unsupported:
            raise ValueError("loss_mode=pacs cannot compute PACS with:\n  " + "\n  ".join(unsupported))
        proxy_rewards = reward_proxy(log_prob, old_log_prob.to(log_prob.dtype), mask, beta=beta)  # (B,)
        batch_info = (config.get("global_batch_info", None) if config is not None else None) or {}
        global_rows = batch_info.get("global_batch_size") or log_prob.shape[0]
        loss = -(coefficients.detach() * proxy_rewards).sum() * batch_info.get("dp_size", 1) / global_rows
        return loss, {"actor/pacs_abs_proxy": proxy_rewards.detach().abs().mean().item()}

    compute_pacs_loss.pacs_settings = {"beta": beta, "estimator": estimator}
    return compute_pacs_loss


def register(name: str = NAME, *, beta: float = 1.0, estimator: str = "rloo", weighting: str = "question") -> None:
    """Register PACS in verl as `algorithm.adv_estimator=name` (score `estimator`, class weights
    `weighting`) and `actor.policy_loss.loss_mode=name` (proxy scale `beta`). A module a user
    lists in VERL_USE_EXTERNAL_MODULES can call `register("pacs_beta2", beta=2.0)`.

    Raises:
        ValueError: an invalid setting, or `name` already taken by another advantage estimator.
    """
    core_algos = _core_algos()
    advantage_fn = pacs_advantage_estimator(estimator=estimator, weighting=weighting, beta=beta)
    loss_fn = pacs_policy_loss_fn(beta=beta, estimator=estimator)
    registered = core_algos.ADV_ESTIMATOR_REGISTRY.get(name)
    if getattr(registered, "pacs_settings", None) != advantage_fn.pacs_settings:
        core_algos.register_adv_est(name)(advantage_fn)
    core_algos.register_policy_loss(name)(loss_fn)


def _register_on_import() -> None:
    try:
        register()
    except Exception:
        logger.exception(
            "pacs could not register adv_estimator=%s and loss_mode=%s in verl (verl will answer 'Unsupported loss "
            "mode: %s')",
            NAME, NAME, NAME,
        )  # fmt: skip
        raise


if importlib.util.find_spec("verl") is not None:
    _register_on_import()
