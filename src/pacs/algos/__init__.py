"""Algorithms as pure tensor math: losses, scores and weights, each built-in's options (its
configuration section, `pacs.algos.options`) beside its math. Imports torch and pydantic only.

A module that defines a section is a built-in algorithm, found by `pacs.config.algorithms.registry`;
the others are the math the algorithms share. This module re-exports the first algorithms for short
imports; a new one need not be added here."""

from __future__ import annotations

from pacs.algos.aggregation import (
    LOSS_AGG_MODES,
    aggregate_loss,
    aggregation_weights,
    weighted_token_sum,
)
from pacs.algos.cispo import CISPO, cispo_surrogate
from pacs.algos.dapo import DAPO
from pacs.algos.dr_grpo import DrGRPO
from pacs.algos.groups import mixed_groups
from pacs.algos.grpo import GRPO, grpo_advantages
from pacs.algos.gspo import GSPO, sequence_clipped_surrogate
from pacs.algos.kl import KL_ESTIMATORS, kl_penalty
from pacs.algos.pacs import (
    ESTIMATORS,
    PACS,
    PROXIES,
    WEIGHTINGS,
    class_weights,
    group_scores,
    pacs_advantages,
    pacs_loss,
    pacs_loss_from_proxy,
    reward_proxy,
    sampler_corrected_coefficients,
)
from pacs.algos.pg import ClippedPolicyGradient
from pacs.algos.ppo import PPO, explained_variance, gae_advantages, value_loss, whiten
from pacs.algos.rloo import RLOO, rloo_advantages
from pacs.algos.shaping import outcome_token_rewards, overlong_penalty, shaped_rewards
from pacs.algos.surrogates import clipped_surrogate

__all__ = [
    "CISPO",
    "DAPO",
    "ESTIMATORS",
    "GRPO",
    "GSPO",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "PACS",
    "PPO",
    "PROXIES",
    "RLOO",
    "WEIGHTINGS",
    "ClippedPolicyGradient",
    "DrGRPO",
    "aggregate_loss",
    "aggregation_weights",
    "class_weights",
    "cispo_surrogate",
    "clipped_surrogate",
    "explained_variance",
    "gae_advantages",
    "group_scores",
    "grpo_advantages",
    "kl_penalty",
    "mixed_groups",
    "outcome_token_rewards",
    "overlong_penalty",
    "pacs_advantages",
    "pacs_loss",
    "pacs_loss_from_proxy",
    "reward_proxy",
    "rloo_advantages",
    "sampler_corrected_coefficients",
    "sequence_clipped_surrogate",
    "shaped_rewards",
    "value_loss",
    "weighted_token_sum",
    "whiten",
]
