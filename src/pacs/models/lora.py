"""LoRA adapters on a causal LM (through `peft`, the optional extra `pip install 'pacs[lora]'`).

Each target linear layer y = W x keeps W frozen and learns a low-rank update:

    y = W x + (alpha / r) * B A x,      A: (r, in_features), B: (out_features, r), B = 0 at the start

so the adapted model starts as the base model, and with its adapters disabled it *is* the base
model: the frozen reference of a KL penalty costs no second copy of the weights
(`PeftModel.disable_adapter()`).

A LoRA checkpoint directory holds the merged model (W + (alpha / r) B A in every target layer) as
a plain Hugging Face model, loadable by any tool, and the adapter beside it in `ADAPTER_DIR`
(`adapter_config.json`, `adapter_model.safetensors`). The adapter is in a subdirectory because
transformers treats a directory that holds `adapter_config.json` as an adapter to load on top of
another model.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel

if TYPE_CHECKING:  # peft is an optional extra: imported when LoRA is asked for (`require_peft`)
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer
    from typing_extensions import TypeIs

ADAPTER_DIR = "adapter"
ADAPTER_NAME = "default"
INSTALL_HINT = "pip install 'pacs[lora]'"


def require_peft() -> ModuleType:
    """The `peft` module; ImportError naming the extra to install when it is missing."""
    try:
        import peft
    except ImportError as error:
        raise ImportError(
            f"model.lora_rank > 0 trains LoRA adapters with the optional dependency peft, which is not "
            f"installed: {INSTALL_HINT} (or pip install 'peft>=0.13'); model.lora_rank=0 trains the full model"
        ) from error
    return peft


def is_lora(model: torch.nn.Module) -> TypeIs[PeftModel]:
    """Whether `model` is a peft model (False whenever peft was never imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def _is_lora_layer(module: object) -> TypeIs[LoraLayer]:
    """Whether `module` is one of peft's LoRA layers (a linear layer or a parameter wrapper)."""
    return isinstance(module, require_peft().tuners.lora.LoraLayer)


def language_model(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face model that `generate` and `save_pretrained` belong to: inside a peft model,
    its base model (with the adapters in place and active); any other model itself."""
    return model.get_base_model() if is_lora(model) else model


@dataclass(frozen=True)
class SavedAdapter:
    """The adapter weights that `save_adapter` wrote (peft's names, on the CPU), and where from."""

    directory: Path
    weights: dict[str, torch.Tensor]


def read_adapter(directory: Path) -> SavedAdapter:
    """The adapter in `directory` (a checkpoint's `ADAPTER_DIR`), for `add_lora`; ValueError when
    it holds none."""
    if not (directory / "adapter_config.json").is_file():
        raise ValueError(f"{directory} holds no LoRA adapter (no adapter_config.json)")
    return SavedAdapter(directory, require_peft().load_peft_weights(str(directory), device="cpu"))


def add_lora(
    model: PreTrainedModel,
    *,
    rank: int,
    alpha: float,
    dropout: float,
    target_modules: str | list[str],
    adapter: SavedAdapter | None = None,
) -> torch.nn.Module:
    """`model` with LoRA adapters of rank `rank` on `target_modules` ("all-linear": every linear
    layer but the output head), as a peft model whose adapter parameters alone require grad.

    New adapters start with B = 0 (the model is unchanged); `adapter`: weights that `save_adapter`
    wrote (`read_adapter`), loaded instead (resume). Adapters on a bfloat16/float16 base are held
    in float32; on a float32/float64 base, in its dtype.

    Raises:
        ImportError: peft is missing (names the extra to install).
        ValueError: a target module name matches nothing in the model, or `adapter` does not fit.
    """
    peft = require_peft()
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=target_modules, task_type="CAUSAL_LM")
    try:
        with warnings.catch_warnings():  # peft asks transformers for a property it has renamed
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            adapted = peft.get_peft_model(model, config)
    except ValueError as error:
        raise ValueError(
            f"model.lora_target_modules={target_modules!r} does not fit {type(model).__name__}: {error}. "
            "Use 'all-linear' or names of its linear layers (such as q_proj, v_proj for Qwen2 and Llama)"
        ) from None
    if adapter is not None:
        _load_adapter_weights(peft, adapted, adapter)
    return adapted


def _load_adapter_weights(peft: ModuleType, model: torch.nn.Module, adapter: SavedAdapter) -> None:
    misfit = (
        f"the adapter in {adapter.directory} does not fit this model's LoRA layers (check model.lora_rank and "
        "model.lora_target_modules against the run that wrote it)"
    )
    try:
        result = peft.set_peft_model_state_dict(model, dict(adapter.weights), adapter_name=ADAPTER_NAME)
    except RuntimeError as error:  # a tensor of another shape
        raise ValueError(f"{misfit}: {str(error).strip().splitlines()[-1]}") from None
    missing = [key for key in result.missing_keys if is_adapter_weight(key)]
    if result.unexpected_keys or missing:
        raise ValueError(f"{misfit}: missing {missing[:3]}, unexpected {result.unexpected_keys[:3]}")


def is_adapter_weight(key: str) -> bool:
    """Whether `key` of a peft model's state dict names an adapter tensor (LoRA's A or B)."""
    return ".lora_" in key


def merged_tensors(
    model: torch.nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]], adapters: dict[str, torch.Tensor]
) -> Iterator[tuple[str, torch.Tensor]]:
    """The merged model's state-dict entries, as plain Hugging Face keys, one for each of
    `named_tensors` (the peft model's state-dict entries that are not adapter weights, e.g.
    gathered one at a time from FSDP shards) as it comes, with `adapters` (the peft model's
    adapter tensors, by key) merged in, without changing `model`. Each is computed where its
    tensor lies (the GPU for a weight sync, the CPU for a checkpoint): nothing is copied.

    Every adapted weight W becomes W + scaling * delta (`_lora_delta`), summed in float32 (or
    float64) and stored in W's dtype; every other tensor is passed on, and the keys lose peft's
    `base_model.model.` prefix and `base_layer` segments. Adapted weights are those of LoRA
    layers (linear layers) and of LoRA parameter wrappers (a mixture of experts' stacked expert
    weights, its router), which peft nests one per parameter of a module. Only one layer's
    update exists at a time, never a merged copy of the model.
    """
    prefix = "base_model.model."
    adapted = {
        _adapted_weight_key(name, module): (name, module) for name, module in model.named_modules() if _is_lora_layer(module)
    }
    for key, value in named_tensors:
        if key in adapted:
            layer_name, layer = adapted[key]
            wide = torch.promote_types(value.dtype, torch.float32)
            lora_a, lora_b = (adapters[f"{layer_name}.lora_{part}.{ADAPTER_NAME}.weight"].to(value.device, wide) for part in "AB")
            value = (value.to(wide) + _lora_delta(layer, lora_a, lora_b)).to(value.dtype)
        yield ".".join(part for part in key.split(".") if part != "base_layer").removeprefix(prefix), value


def _adapted_weight_key(name: str, layer: LoraLayer | torch.nn.Module) -> str:
    """The state-dict key of the weight that the LoRA layer `name` adapts: `weight` (or, for a
    parameter wrapper, its `parameter_name`) of the module under its chain of `base_layer`s."""
    base_name, base = name, layer
    while _is_lora_layer(base):
        base_name, base = f"{base_name}.base_layer", base.base_layer
    return f"{base_name}.{getattr(layer, 'parameter_name', 'weight')}"


def _lora_delta(layer: LoraLayer, lora_a: torch.Tensor, lora_b: torch.Tensor) -> torch.Tensor:
    """scaling * B A in the adapted weight's shape, as peft merges it.

    A linear layer: A (r, in), B (out, r) -> B A (out, in), transposed for fan_in_fan_out.
    E stacked experts (peft's ParamWrapper): A (E r, in), B (out, r E) -> per expert e,
    B_e A_e with A_e = A.view(E, r, in)[e] and B_e = B.view(out, r, E)[..., e]: (E, out, in),
    or (E, in, out) where the experts' module stores its weights transposed (`is_transposed`).
    """
    scaling = layer.scaling[ADAPTER_NAME]
    experts = getattr(layer, "num_experts", 1)
    if experts == 1:
        delta = lora_b @ lora_a
        return (delta.T if getattr(layer, "fan_in_fan_out", False) else delta) * scaling  # a linear layer's (lora.Linear)
    per_expert_a = lora_a.reshape(experts, -1, lora_a.shape[-1])
    per_expert_b = lora_b.reshape(lora_b.shape[0], -1, experts)
    layout = "eio" if getattr(layer.get_base_layer(), "is_transposed", False) else "eoi"
    return torch.einsum(f"ore,eri->{layout}", per_expert_b, per_expert_a) * scaling


def save_adapter(model: PeftModel, directory: Path, adapters: dict[str, torch.Tensor]) -> None:
    """Write the adapter of the peft `model` (adapter_config.json, adapter_model.safetensors) to
    `directory`, with the weights `adapters` (its adapter tensors by state-dict key, e.g. gathered
    from FSDP shards)."""
    model.save_pretrained(str(directory), state_dict=adapters, safe_serialization=True, save_embedding_layers=False)
