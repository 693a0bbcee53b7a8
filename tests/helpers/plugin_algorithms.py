"""Users' algorithm sections that cannot be used, each for one reason, for the tests of
`algorithm.name` = `package.module:Class` (tests/config/test_algorithm_plugins.py); the usable one
is the documentation's own example, docs/examples/my_algorithm.py."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from pacs.algos.base import AlgorithmBase
from pacs.config import BaseAlgorithmConfig

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
"""The folder of docs/examples/my_algorithm.py, the usable example (put on `sys.path` to import it)."""


class NotAnAlgorithm:
    """Has the methods' names nowhere."""


class WithoutBuilds(BaseAlgorithmConfig):
    """A section that names no algorithm class."""


class BuildsNotAnAlgorithm(BaseAlgorithmConfig):
    builds = NotAnAlgorithm


class Minimal(AlgorithmBase):
    """Writes only what the protocol requires."""

    def __init__(self, group_size: int, *, max_response_length: int, limit: int = 1):
        super().__init__(group_size, max_response_length=max_response_length)
        if limit > group_size:
            raise ValueError(f"limit={limit} exceeds the group size {group_size}")

    def prepare_update(self, minibatch, current_logprobs, policy_is_rollout_policy, totals=None):
        return {}, {"loss": 0.0}

    def micro_batch_loss(self, logprobs, micro, row_terms):
        return (logprobs * 0).sum()


class OptionNotTaken(BaseAlgorithmConfig):
    """`temperature` is no keyword of `Minimal`."""

    builds = Minimal
    temperature: float = 1.0


class RefusedByConstructor(BaseAlgorithmConfig):
    """`Minimal` refuses a `limit` above the group size."""

    builds = Minimal
    limit: int = Field(1, ge=1)


class UnknownNeed(Minimal):
    needs = frozenset({"advantages"})


class NeedsAnUnknownTensor(BaseAlgorithmConfig):
    builds = UnknownNeed


class ValuesWithoutCriticLoss(Minimal):
    needs = frozenset({"values"})


class NeedsACriticItCannotTrain(BaseAlgorithmConfig):
    builds = ValuesWithoutCriticLoss
