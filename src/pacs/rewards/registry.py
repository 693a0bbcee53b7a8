"""Reward functions by ``data_source``, user plug-ins by ``"module:function"``, and batch scoring.

A reward function has the verl signature

    compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None)
        -> float | dict

returning a score in [0, 1], or a dict whose ``"score"`` key holds it (other keys are extra
information). ``REWARD_FUNCTIONS`` maps a row's ``data_source`` to such a function: "arithmetic"
for the built-in task, and the math benchmarks (``pacs.rewards.math.MATH_DATA_SOURCES``) to the
math verifier. A data_source ``KIND/NAME`` is scored as ``KIND`` (``math/algebra`` by the math
verifier, ``reward_function_for``): a set of one's own gets a name of its own, reported apart, and
a built-in scorer.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable

import numpy as np

from pacs.plugins import import_function
from pacs.rewards.arithmetic import arithmetic_score
from pacs.rewards.math import MATH_DATA_SOURCES, math_compute_score

ComputeScore = Callable[[str, str, str, dict | None], float | dict]
RewardCall = tuple[str, str, str, dict | None]


def _arithmetic_compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """Adapt ``arithmetic_score`` to the reward-function signature."""
    return arithmetic_score(solution_str, ground_truth)


REWARD_FUNCTIONS: dict[str, ComputeScore] = {
    "arithmetic": _arithmetic_compute_score,
    **{data_source: math_compute_score for data_source in MATH_DATA_SOURCES},
}


def reward_function_for(data_source: str) -> ComputeScore | None:
    """The reward function registered for ``data_source``, or for its kind (the part before the
    first "/") when the data_source itself is not registered; None if neither is."""
    return REWARD_FUNCTIONS.get(data_source) or REWARD_FUNCTIONS.get(data_source.split("/", 1)[0])


def default_compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float | dict:
    """Score ``solution_str`` with the reward function registered for ``data_source`` (or its kind)."""
    compute_score = reward_function_for(data_source)
    if compute_score is None:
        raise ValueError(
            f"No reward function for data_source {data_source!r}; known: {sorted(REWARD_FUNCTIONS)} (and KIND/NAME "
            "for each). Give a custom one as 'module:function'"
        )
    return compute_score(data_source, solution_str, ground_truth, extra_info)


def load_reward_function(spec: str | None) -> ComputeScore:
    """Return ``default_compute_score`` for None, else import the function ``"package.module:function"``."""
    return default_compute_score if spec is None else import_function(spec)


def _describe_row(data_source: str, extra_info: dict | None) -> str:
    """Name a row in error messages by its data_source and extra_info index."""
    return f"data_source {data_source!r}, extra_info index {(extra_info or {}).get('index')}"


def _checked_score(result: object, data_source: str, extra_info: dict | None) -> float:
    """Return ``result`` (a number or numpy bool, or a dict with ``"score"``) as a float in [0, 1]; else raise."""
    where = _describe_row(data_source, extra_info)
    if isinstance(result, dict):
        if "score" not in result:
            raise ValueError(f"Reward dict for {where} has no 'score' key (keys: {sorted(result)})")
        result = result["score"]
    if not isinstance(result, (numbers.Real, np.bool_)):
        raise ValueError(f"Reward for {where} must be a number in [0, 1], got {type(result).__name__} {result!r}")
    try:
        score = float(result)
    except OverflowError:
        raise ValueError(f"Reward for {where} must be in [0, 1], got a number too large for a float") from None
    if not (math.isfinite(score) and 0.0 <= score <= 1.0):
        raise ValueError(f"Reward for {where} must be in [0, 1], got {score}")
    return score


def reward_calls(rows: list[dict], responses: list[str]) -> list[RewardCall]:
    """Pair ``responses[i]`` with ``rows[i]`` as ``(data_source, solution_str, ground_truth, extra_info)``."""
    if len(rows) != len(responses):
        raise ValueError(f"Got {len(rows)} rows but {len(responses)} responses; expected one response per row")
    return [
        (row["data_source"], response, row["reward_model"]["ground_truth"], row.get("extra_info"))
        for row, response in zip(rows, responses)
    ]


def score_responses(compute_score: ComputeScore, rows: list[dict], responses: list[str]) -> list[float]:
    """Score ``responses[i]`` against ``rows[i]``; return one float in [0, 1] per response."""
    return [_checked_score(compute_score(*call), call[0], call[3]) for call in reward_calls(rows, responses)]
