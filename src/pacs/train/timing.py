"""Where a step's time goes: every phase timed (`PhaseTimes`), and the model FLOPs utilisation
(`model_flops`, `flops_utilisation`).

MFU counts the model's multiply-adds as the 6ND rule does (Kaplan et al. 2020; PaLM's MFU): a
pass over T tokens of a model of N parameters costs 2·N·T FLOPs forward and 6·N·T forward and
backward. Attention's own FLOPs (quadratic in the length) and recomputation (activation
checkpointing, the no-grad passes an update makes for its metrics) are not counted.
"""

from __future__ import annotations

import contextlib
import math
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


def flop_parameters(model: torch.nn.Module) -> float:
    """N of the 6ND rule: the parameters that multiply, i.e. every parameter (tied weights once)
    but an input embedding that is not also the output layer (a lookup, no multiply-adds)."""
    parameters = {id(p): p.numel() for p in model.parameters()}
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if embeddings is not None and (output is None or output.weight is not embeddings.weight):
        parameters.pop(id(embeddings.weight), None)
    return float(sum(parameters.values()))


def model_flops(parameters: float, tokens: torch.Tensor, *, forward_passes, training_passes) -> torch.Tensor:
    """FLOPs = 2·N·T·forward_passes + 6·N·T·training_passes, elementwise.

    parameters: N (`flop_parameters`); tokens: (B,) T of each row (prompt and response);
    forward_passes, training_passes: numbers or (B,) tensors of passes over each row."""
    return parameters * tokens * (2 * forward_passes + 6 * training_passes)


def flops_utilisation(flops: float, seconds: float, peak_flops: float, processes: int) -> float:
    """`perf/mfu` = FLOPs / (seconds · peak FLOP/s of one device · processes); nan for no time."""
    return flops / (seconds * peak_flops * processes) if seconds > 0 else math.nan
