"""PACS for verl users: an advantage estimator and a policy loss in verl's registries
(`verl.trainer.ppo.core_algos`), both named "pacs", so that PACS runs with configuration alone:

    algorithm.adv_estimator=pacs actor_rollout_ref.actor.policy_loss.loss_mode=pacs
    trainer.use_v1=False trainer.balance_batch=False
    actor_rollout_ref.actor.shuffle=False actor_rollout_ref.actor.use_dynamic_bsz=False
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=<a multiple of actor_rollout_ref.rollout.n>

With `pip install 'pacs[verl]'` beside verl, verl imports this module itself in every process that
imports verl (pacs declares it in verl's "verl.plugins" entry points); `VERL_USE_EXTERNAL_MODULES=
pacs.integrations.verl` does the same where entry points are turned off.

    adv_estimator "pacs"  advantages[i, t] = R_i · m_it, R_i = Σ_t token_level_rewards[i, t], the
                          verifier reward in [0, 1]: PACS's BCE target, carried to the actor.
    loss_mode "pacs"      L = 1/B · Σ_i w_i · BCEWithLogits(ψ_i, R_i) (`pacs.algos.pacs_loss`) with
                          the logratio proxy r_i = β · Σ_t m_it (log π_θ − log π_old), the score
                          "rloo" and the class weights "question" (`register` for other settings).

ψ_i needs r_j of every response j in the group of i at the current θ, so each micro-batch must hold
whole groups. verl calls the loss once per micro-batch and sums their gradients; the micro-batch's
term is normalised by the global mini-batch as verl's own losses are (config.global_batch_info):

    loss_micro = dp_size / global_batch_size · Σ_{i ∈ micro} w_i · BCE(ψ_i, R_i)

so that Σ over micro-batches (and the mean over data-parallel ranks) is L of the mini-batch.

Refused with a ValueError naming the setting: advantages that are not "pacs"'s (another
adv_estimator, or KL in the reward: R outside [0, 1]); groups not contiguous when the advantages
are computed (balancing sequence lengths across ranks reorders rows: verl 0.9.1's default v1
trainer always balances, its legacy trainer, trainer.use_v1=False, only with
trainer.balance_batch=True); actor.shuffle or actor.use_dynamic_bsz (both
reorder or regroup rows); a micro-batch whose row count is not a multiple of rollout.n; and
rollout-correction weights (per-token weights PACS does not define). Under these checks the
micro-batches tile the group-ordered batch in order, each a multiple of n rows, so each holds whole
groups. loss_agg_mode applies to verl's entropy and KL terms only: PACS's loss is a mean over
responses by definition.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import numpy as np
import torch

from pacs.algos import ESTIMATORS, PROXIES, WEIGHTINGS, pacs_loss
from pacs.algos.core import check_choice

INSTALL = "pip install 'pacs[verl]'"
NAME = "pacs"


def _core_algos():
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as error:
        raise ImportError(f"pacs.integrations.verl needs verl, which is not installed: {INSTALL}") from error
    return core_algos


def check_groups(index: np.ndarray | None) -> int:
    """The group size n if `index` (one prompt id per row) holds runs of n equal ids, one run per
    prompt; else ValueError saying which rows break the order."""
    if index is None:
        raise ValueError("adv_estimator=pacs needs the batch's prompt ids (data.non_tensor_batch['uid'])")
    ids = list(index)
    starts = [row for row in range(len(ids)) if row == 0 or ids[row] != ids[row - 1]]
    sizes = np.diff([*starts, len(ids)])
    first_ids = [ids[start] for start in starts]
    if len(set(first_ids)) != len(first_ids) or len(set(sizes.tolist())) != 1:
        raise ValueError(
            "adv_estimator=pacs needs each prompt's responses in consecutive rows, equally many per prompt; got "
            f"runs of {sizes.tolist()[:16]} rows over {len(set(first_ids))} prompts. Balancing sequence lengths "
            "across ranks reorders rows: verl's v1 trainer always does, its legacy one unless told not to; set "
            "trainer.use_v1=False trainer.balance_batch=False"
        )
    return int(sizes[0])


def pacs_rewards_as_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray | None = None,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's adv_estimator "pacs": (B, T) advantages = returns = R_i · m_it, R_i = Σ_t token_level_rewards[i, t].

    Raises:
        ValueError: R outside [0, 1] (PACS's BCE target; KL in the reward makes it so), or rows not
            in consecutive equal groups (see `check_groups`).
    """
    rewards = token_level_rewards.sum(dim=-1)
    if not bool(((rewards >= 0) & (rewards <= 1)).all()):
        raise ValueError(
            f"adv_estimator=pacs needs rewards in [0, 1] (PACS's BCE target); got min {rewards.min().item()}, max "
            f"{rewards.max().item()} (algorithm.use_kl_in_reward=True adds a KL term to them: set it False)"
        )
    check_groups(index)
    advantages = rewards.unsqueeze(-1) * response_mask.to(rewards.dtype)
    return advantages, advantages


def unsupported_actor_settings(config: Any) -> list[str]:
    """The settings of verl's actor config under which micro-batches may not hold whole groups."""
    found = []
    if config.get("use_dynamic_bsz", False):
        found.append("actor_rollout_ref.actor.use_dynamic_bsz=True: set False (it regroups rows by length)")
    if config.get("shuffle", False):
        found.append("actor_rollout_ref.actor.shuffle=True: set False (it reorders rows)")
    micro = config.get("ppo_micro_batch_size_per_gpu")
    group_size = config.get("rollout_n")
    if micro is not None and group_size and micro % group_size:
        found.append(
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}: a multiple of rollout.n={group_size}"
        )
    return found


def rewards_from_advantages(advantages: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """(B,) R_i read back from the "pacs" estimator's (B, T) advantages R_i · m_it, and whether the
    advantages are of that form (one value per response, in [0, 1])."""
    first_token = mask.argmax(dim=-1, keepdim=True)  # (B, 1)
    rewards = advantages.gather(-1, first_token).squeeze(-1)
    constant = bool((((advantages - rewards.unsqueeze(-1)) * mask) == 0).all())
    return rewards, constant and bool(((rewards >= 0) & (rewards <= 1)).all())


def pacs_policy_loss_fn(
    *, beta: float = 1.0, proxy: str = "logratio", estimator: str = "rloo", weighting: str = "question"
):
    """A verl policy loss computing PACS with these settings (see `pacs.algos.pacs_loss`)."""
    if not (isinstance(beta, (int, float)) and math.isfinite(beta)):
        raise ValueError(f"beta must be a finite number, got {beta!r}")
    check_choice("proxy", proxy, PROXIES)
    check_choice("estimator", estimator, ESTIMATORS)
    check_choice("weighting", weighting, WEIGHTINGS)

    def compute_pacs_loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """(B, T) tensors of one micro-batch of whole groups -> (its term of L, metrics)."""
        unsupported = unsupported_actor_settings(config)
        group_size = config.get("rollout_n")
        rows = log_prob.shape[0]
        if rows % group_size:
            unsupported.append(f"a micro-batch of {rows} rows, not whole groups of rollout.n={group_size}")
        if rollout_is_weights is not None:
            unsupported.append("rollout-correction weights (actor.policy_loss.rollout_correction): turn them off")
        mask = response_mask.to(log_prob.dtype)
        rewards, from_pacs = rewards_from_advantages(advantages, mask)
        if not from_pacs:
            unsupported.append("advantages not per-response rewards in [0, 1]: set algorithm.adv_estimator=pacs")
        if unsupported:
            raise ValueError("loss_mode=pacs cannot compute PACS exactly with:\n  " + "\n  ".join(unsupported))
        settings = {"beta": beta, "proxy": proxy, "estimator": estimator, "weighting": weighting}
        loss = pacs_loss(log_prob, old_log_prob, mask, rewards, group_size, **settings)  # mean over the micro-batch
        batch_info = config.get("global_batch_info") or {}
        global_rows = batch_info.get("global_batch_size") or rows
        term = loss * (rows / global_rows) * batch_info.get("dp_size", 1)
        return term, {"actor/pacs_loss": loss.detach().item()}

    return compute_pacs_loss


def register(name: str = NAME, **settings: Any) -> None:
    """Register PACS in verl: `loss_mode=name` with `settings` (see `pacs_policy_loss_fn`) and, once,
    `adv_estimator=pacs`. A module a user lists in VERL_USE_EXTERNAL_MODULES can call
    `register("pacs_beta2", beta=2.0)`."""
    core_algos = _core_algos()
    core_algos.register_policy_loss(name)(pacs_policy_loss_fn(**settings))
    if core_algos.ADV_ESTIMATOR_REGISTRY.get(NAME) is not pacs_rewards_as_advantages:
        core_algos.register_adv_est(NAME)(pacs_rewards_as_advantages)


if importlib.util.find_spec("verl") is not None:
    register()
