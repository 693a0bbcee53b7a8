"""Algorithms as pure tensor math: losses, scores and weights. Imports torch only."""

from __future__ import annotations

from pacs.algos.pacs import (
    ESTIMATORS,
    PROXIES,
    WEIGHTINGS,
    class_weights,
    group_scores,
    pacs_loss,
    pacs_loss_from_proxy,
    reward_proxy,
)

__all__ = [
    "ESTIMATORS",
    "PROXIES",
    "WEIGHTINGS",
    "class_weights",
    "group_scores",
    "pacs_loss",
    "pacs_loss_from_proxy",
    "reward_proxy",
]
