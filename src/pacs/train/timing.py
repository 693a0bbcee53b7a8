"""Where a step's time goes: every phase timed (`PhaseTimes`); what the step's time bought is
`pacs.train.throughput`'s."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import torch

Result = TypeVar("Result")


class PhaseTimes:
    """Seconds spent in each phase of one step on this process, from its construction:

        times = PhaseTimes(device)
        with times.phase("generate"): ...          # adds to the phase "generate"
        times.metrics()   # {"time/generate_s": ..., ..., "time/other_s": ..., "time/step_s": ...}

    On a GPU each phase ends with `torch.cuda.synchronize`, so the kernels a phase queued are
    counted in it rather than in the next phase that waits for them."""

    def __init__(self, device: torch.device):
        self.started = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.device = device

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def count_inside(self, name: str, seconds: float, within: str) -> None:
        """`seconds` of the phase `within` were spent in the phase `name` (the tool's calls during
        "generate"): count them in `name` instead."""
        self.seconds[within] = self.seconds.get(within, 0.0) - seconds
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def metrics(self) -> dict[str, float]:
        """`time/<phase>_s` for every phase that ran, `time/step_s` since construction and
        `time/other_s` = step − Σ phases (batching, step terms, collectives between phases)."""
        step = time.perf_counter() - self.started
        timings = {f"time/{name}_s": seconds for name, seconds in self.seconds.items()}
        return {**timings, "time/other_s": step - sum(self.seconds.values()), "time/step_s": step}


def timed(function: Callable[..., Result], *args, **kwargs) -> tuple[Result, float]:
    """`function(*args, **kwargs)` and the seconds it took."""
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start
