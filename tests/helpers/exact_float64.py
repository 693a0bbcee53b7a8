"""Float64 models that are float64 throughout, for the exactness tests.

Hugging Face's RMSNorms (Qwen2RMSNorm and its copies) compute in float32 whatever their input's
dtype, which caps a float64 model at float32 precision: two computations that are equal in exact
arithmetic but shaped differently (a prompt run once for its whole group, or per response; other
micro-batches; 2 processes or 1) then differ by ~1e-8 relative in their gradients, and a mixture
of experts may route a token to another expert. The exactness tests compare such computations at
1e-9 or tighter, so their float64 models normalise in float64: the built-in Qwen2 and the tiny
architectures whose 2-process steps `test_architectures` compares.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
from transformers.models.granite.modeling_granite import GraniteRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeRMSNorm


def _scaled_by_weight(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """weight * h / rms(h), as Qwen2RMSNorm computes it (Qwen3-MoE's and Granite's are copies)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _scaled_by_one_plus_weight(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """(1 + weight) * h / rms(h), as Gemma3RMSNorm computes it."""
    return hidden_states * torch.rsqrt(hidden_states.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


FLOAT64_FORWARDS: dict[type[torch.nn.Module], Callable] = {
    Qwen2RMSNorm: _scaled_by_weight,
    Qwen3MoeRMSNorm: _scaled_by_weight,
    GraniteRMSNorm: _scaled_by_weight,
    Gemma3RMSNorm: _scaled_by_one_plus_weight,
}
_FLOAT32_FORWARDS = {norm: norm.forward for norm in FLOAT64_FORWARDS}


def _forward_in_input_dtype(norm: type[torch.nn.Module]) -> Callable:
    def forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype != torch.float64:
            return _FLOAT32_FORWARDS[norm](self, hidden_states)
        return FLOAT64_FORWARDS[norm](self, hidden_states)

    return forward


def normalise_float64_in_float64() -> None:
    """From now on in this process, the RMSNorms of FLOAT64_FORWARDS keep float64 inputs in float64."""
    for norm in FLOAT64_FORWARDS:
        norm.forward = _forward_in_input_dtype(norm)


class GradientRecordingAdamW(torch.optim.AdamW):
    """AdamW that keeps a copy of every parameter's gradient at each step, for tests that compare
    two ways of computing the same updates gradient by gradient."""

    def __init__(self, params, **options):
        super().__init__(params, **options)
        self.gradients: list[list[torch.Tensor]] = []

    def step(self, closure=None):
        self.gradients.append([p.grad.detach().clone() for group in self.param_groups for p in group["params"]])
        return super().step(closure)


def assert_same_updates(reference: tuple[list, dict], other: tuple[list, dict], *, steps: int) -> None:
    """Two runs of the same updates, each (`GradientRecordingAdamW.gradients`, the update's metrics),
    agree to 1e-10: `steps` optimizer steps each, every gradient, every metric; the reference's
    first gradient is not ~0, so agreeing means something."""
    (gradients, metrics), (other_gradients, other_metrics) = reference, other
    assert len(other_gradients) == len(gradients) == steps
    assert max(g.abs().max().item() for g in gradients[0]) > 1e-3
    for other_update, update in zip(other_gradients, gradients):
        assert max((a - b).abs().max().item() for a, b in zip(other_update, update)) < 1e-10
    assert other_metrics.keys() == metrics.keys()
    for name, value in metrics.items():
        assert other_metrics[name] == pytest.approx(value, abs=1e-10), name
