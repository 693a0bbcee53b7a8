"""`algorithm.name` -> the trainer plug-in that implements it (see `pacs.algos.base`)."""

from __future__ import annotations

from typing import Any, Callable

from pacs.algos.base import Algorithm
from pacs.algos.pacs import PACS

ALGORITHMS: dict[str, Callable[..., Algorithm]] = {"pacs": PACS}


def build_algorithm(name: str, *, group_size: int, **options: Any) -> Algorithm:
    """Construct algorithm `name` for groups of `group_size` responses with its `options`."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm.name {name!r}; valid: {', '.join(map(repr, ALGORITHMS))}")
    return ALGORITHMS[name](group_size, **options)
