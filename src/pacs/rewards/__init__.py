"""Verifiable rewards: rule-based scorers, the math verifier, a registry by data_source, user
plug-ins, and a process pool that scores with a hard time limit per call."""

from __future__ import annotations

from pacs.rewards.arithmetic import arithmetic_score, extract_boxed
from pacs.rewards.math import math_score, math_score_timeouts
from pacs.rewards.pool import BatchScores, ScoringPool
from pacs.rewards.registry import (
    REWARD_FUNCTIONS,
    ComputeScore,
    default_compute_score,
    load_reward_function,
    score_responses,
)

__all__ = [
    "REWARD_FUNCTIONS",
    "BatchScores",
    "ComputeScore",
    "ScoringPool",
    "arithmetic_score",
    "default_compute_score",
    "extract_boxed",
    "load_reward_function",
    "math_score",
    "math_score_timeouts",
    "score_responses",
]
