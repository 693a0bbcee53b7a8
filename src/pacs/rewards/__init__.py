"""Verifiable rewards: rule-based scorers, a registry by data_source, and user plug-ins."""

from __future__ import annotations

from pacs.rewards.arithmetic import arithmetic_score, extract_boxed
from pacs.rewards.registry import (
    REWARD_FUNCTIONS,
    ComputeScore,
    default_compute_score,
    load_reward_function,
    score_responses,
)

__all__ = [
    "REWARD_FUNCTIONS",
    "ComputeScore",
    "arithmetic_score",
    "default_compute_score",
    "extract_boxed",
    "load_reward_function",
    "score_responses",
]
