"""What `model.dtype` means for each kind of tensor in a run: the one home of the precision rule.

model.dtype   trained weights    batch tensors    forward passes          frozen models   an engine's own
              and optimizer      (log-probs,                                              copy (vLLM, the
                                 losses)                                                  async generator)
float32       float32            float32          float32                 float32         float32
bfloat16      float32 (master)   float32          bfloat16 (autocast, or  bfloat16        bfloat16
                                                  FSDP's mixed precision)
float64       float64            float64          float64                 float64         float64 (vLLM:
                                                                                          refused)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pacs.models.loading import DTYPES


@dataclass(frozen=True)
class Precision:
    """The dtypes of a run whose `model.dtype` is `dtype` (module docstring)."""

    dtype: str

    @property
    def weights(self) -> str:
        """What trained weights (and so their optimizer state) are held in: float64 for float64
        runs, float32 otherwise (bfloat16 runs compute in bfloat16 from float32 master weights)."""
        return "float64" if self.dtype == "float64" else "float32"

    @property
    def tensors(self) -> torch.dtype:
        """The dtype of a step's batch: masks, rewards, log-probs and what is computed from them."""
        return DTYPES[self.weights]

    @property
    def frozen(self) -> str:
        """What a model that is never trained is held in (the KL reference, LoRA's base weights)."""
        return self.dtype

    @property
    def bf16_compute(self) -> torch.dtype | None:
        """bfloat16 when forward passes compute in it (FSDP's mixed-precision policy), else None."""
        return torch.bfloat16 if self.dtype == "bfloat16" else None

    @property
    def engine(self) -> str:
        """What a rollout engine with its own copy of the weights (vLLM, the asynchronous
        generator's) holds them in: the run's dtype (float64 only for transformers' engine)."""
        return self.dtype

    def autocast(self, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
        """The context forward passes on `device` run in: bfloat16 autocast for bfloat16 runs (the
        weights stay float32), nothing otherwise."""
        if self.bf16_compute is not None:
            return functools.partial(torch.autocast, device_type=device.type, dtype=self.bf16_compute)
        return contextlib.nullcontext
