"""`algorithm.name` -> the trainer plug-in that implements it (see `pacs.algos.base`).

Every algorithm reads only its own options from the `algorithm` config section.
"""

from __future__ import annotations

from typing import Any, Callable

from pacs.algos.base import Algorithm
from pacs.algos.grpo import GRPO
from pacs.algos.pacs import PACS
from pacs.algos.ppo import PPO
from pacs.algos.rloo import RLOO

CLIPPED_PG_OPTIONS = (
    "horizon",
    "clip_low",
    "clip_high",
    "dual_clip",
    "loss_agg",
    "loss_scale",
    "kl_coef",
    "kl_estimator",
    "kl_in_reward",
    "entropy_coef",
    "rollout_is_cap",
)

ALGORITHMS: dict[str, tuple[Callable[..., Algorithm], tuple[str, ...]]] = {
    "pacs": (PACS, ("beta", "proxy", "estimator", "weighting", "kl_coef", "kl_estimator", "entropy_coef", "loss_agg", "horizon",
              "rollout_is_cap")),
    "grpo": (GRPO, (*CLIPPED_PG_OPTIONS, "norm_by_std")),
    "rloo": (RLOO, CLIPPED_PG_OPTIONS),
    "ppo": (PPO, (*CLIPPED_PG_OPTIONS, "gamma", "lam", "value_clip", "critic_loss_agg", "critic_loss_scale")),
}


def build_algorithm(name: str, *, group_size: int, **options: Any) -> Algorithm:
    """Construct algorithm `name` for groups of `group_size` responses from the options it uses.

    `options` may hold every key of the `algorithm` config section plus `horizon` (the maximum
    response length); each algorithm takes the ones listed for it in `ALGORITHMS`.
    """
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm.name {name!r}; valid: {', '.join(map(repr, ALGORITHMS))}")
    constructor, used = ALGORITHMS[name]
    return constructor(group_size, **{key: options[key] for key in used if key in options})
