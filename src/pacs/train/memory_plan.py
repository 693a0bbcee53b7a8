"""Per-rank GPU memory of a training step, phase by phase, by simulation: the paper's models at the
paper's world size, the colocated vLLM engine included.

Nothing here is arithmetic on the trainer's side. For each config the script
  1. builds the config's model on the meta device from its published hyperparameters (no download),
     with activation checkpointing and LoRA as the config sets them;
  2. shards it the way training does, `pacs.distributed.wrapping.wrap_model` (FSDP2: `fully_shard` on
     each of `decoder_layers`, then the root; bf16 compute with fp32 master weights), inside torch's
     fake process group at the config's world size (one CPU process stands for rank 0 of N);
  3. materialises rank 0's shards as fake tensors (shapes and dtypes, no storage), gives every
     trained parameter its gradient and AdamW its state, as they stand from the second update on;
  4. runs one micro-batch of the config's `train.micro_batch_size` sequences of
     `data.max_prompt_length` + `data.max_response_length` tokens (every response at full length,
     the peak) through pacs's own `response_logprobs` (chunked log-prob head, length buckets,
     bf16 autocast) and backward, under torch's `FSDPMemTracker` (`MemTracker` without FSDP),
     which records every tensor's bytes as the step allocates and frees them; then the same
     micro-batch without gradients, as the rollout policy's log-probs are computed.

Phases (GiB per rank; the plan's peak is the largest): `generation`, `old log-probs` (the rollout
policy's log-probs, no gradients) and `update`. Every phase holds the persistent state: parameters
and optimizer state are the bytes of rank 0's tensors; the reference model is a bf16 copy sharded
like the policy, counted only when the config loads one (`algorithm.kl_coef > 0` without LoRA);
PPO's critic (pacs's own value model, fp32 master weights) keeps its weights and AdamW state.
Gradients exist from an update's first backward to its optimizer step (`zero_grad(set_to_none=True)`
frees them), so only `update` holds them; PPO updates its critic (its own micro-batch of the value
loss) before the policy, and `update` is the larger of the two. "gathered weights" and
"activations" split a micro-batch's peak above the state by the tracker's categories (gathered:
all-gathered layer weights and unsharded gradients).

Generation with `rollout.engine: vllm` adds the engine: its weights (the whole model in the compute
dtype, 1/`tensor_parallel_size` of it per rank) and the rest of what `gpu_memory_utilization` gives
it of a `--gpu-gib` GPU (its KV cache and activations: vLLM keeps its total within that fraction),
or `kv_cache_gib` when set (vLLM's activations then uncounted). With sleep mode (on by default on
GPUs) the engine drops both after each rollout, so the other phases do not hold it; without, every
phase does. Generation with `hf` holds the whole model gathered (FSDP unshards every layer at once
for `generate`, in the compute dtype) and transformers' key/value cache after a fake forward of
one generation call (`rollout.generation_batch_size` sequences, at most this rank's share of a
step) at full length.

Fake tensors need shapes only, so data-dependent Python in the step (length buckets, boolean masks,
`int(...)`) runs on the real micro-batch: `RealWhereSmall` keeps tensors of at most
`MAX_REAL_NUMEL` elements real and makes larger ones fake. Gradients are reduce-scattered on every
micro-batch, as `gradient_sync` has them under FSDP. Not counted: CUDA's context and NCCL's
buffers, the allocator's fragmentation and cache, and what vLLM keeps asleep (CUDA graphs'
memory pool): keep headroom (`HEADROOM`).

Run: `.venv/bin/python benchmarks/memory_plan.py [CONFIG ...] [--world-size N] [--gpu-gib G]
[--markdown] [--json] [--jobs N]` (default: configs/paper-*.yaml at 64 ranks and
configs/lora-qwen2.5-7b.yaml on 1; one process per simulation, as many at once as CPU cores);
`--json` prints one JSON object per config, `{"peak_gib": ..., "phases": {phase: {"total_gib": ...,
"parts_gib": {...}}}, ...}`; `--check` compares the simulation with a real run of a small model on
this CPU (peak RSS).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.resources
import json
import os
import resource
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import (
    FakeTensor,
    FakeTensorMode,
    unset_fake_temporarily,
)
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker
from torch.distributed.tensor import DTensor
from torch.nn.modules.module import register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.hooks import RemovableHandle
from transformers import AutoModelForCausalLM, PretrainedConfig, Qwen2Config

from pacs.config import Config, load_config
from pacs.distributed.world import World
from pacs.distributed.wrapping import wrap_model
from pacs.models.loading import (
    disable_dropout,
    enable_activation_checkpointing,
    token_classification_class,
)
from pacs.train.batch import PolicyBatch
from pacs.train.loading import with_training_options
from pacs.train.logprobs import response_logprobs, response_values

GIB = 2**30
PAPER_WORLD_SIZE = 64  # the paper's 8 nodes x 8 GPUs
MAX_REAL_NUMEL = 2**20

# Published hyperparameters (config.json of the Hugging Face repositories), e.g.
# https://huggingface.co/unsloth/Qwen2.5-7B/blob/main/config.json (a copy of Qwen/Qwen2.5-7B's) and
# https://huggingface.co/unsloth/Qwen2.5-3B/blob/main/config.json (a copy of Qwen/Qwen2.5-3B's).
QWEN25 = {
    "Qwen/Qwen2.5-7B": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
    ),
    "Qwen/Qwen2.5-3B": dict(
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
}
GPU_GIB = 80.0
"""An 80 GB card (A100 / H100 80GB), the paper's."""
HEADROOM = 0.10
"""The share of the GPU a plan leaves free for what it does not count (CUDA context, NCCL buffers,
fragmentation): a config fits when its peak is at most (1 - HEADROOM) of the GPU."""
PHASES = ("generation", "validation", "old log-probs", "update")
PARTS = (
    "parameters",
    "optimizer state",
    "gradients",
    "reference model",
    "critic: parameters, optimizer state (and gradients in its update)",
    "gathered weights (peak of a micro-batch)",
    "activations (peak of a micro-batch)",
    "gathered model for generate (hf)",
    "transformers KV cache of one generation call (hf)",
    "vLLM: weights",
    "vLLM: KV cache and activations",
    "validation: gathered model for generate (hf)",
    "validation: transformers KV cache of one call (hf)",
    "generator process: vLLM, never asleep (weights, KV cache, activations)",
    "generator process: its model and KV cache (hf)",
    "weight ring: rollout.max_staleness copies of the model (compute dtype)",
)
"""What a phase holds (`Plan.phases`), in the order the tables print."""
GATHERED = {"Unsharded Param", "Unsharded Grad", "All Gather", "Reduce Scatter"}


@dataclass
class Plan:
    """Bytes per rank of one config at one world size on a `gpu_gib` GPU: for each of `PHASES`,
    what it holds (`PARTS`, absent: none); and how long simulating took (wall-clock and CPU seconds
    of its process: the CPU's count holds on a busy machine)."""

    config: str
    world_size: int
    gpu_gib: float
    phases: dict[str, dict[str, int]]
    notes: list[str]
    seconds: float
    cpu_seconds: float
    overrides: tuple[str, ...] = ()
    """The settings given beside the config file (`key=value`)."""

    def total(self, phase: str) -> int:
        return sum(self.phases[phase].values())

    @property
    def peak(self) -> int:
        return max(self.total(phase) for phase in self.phases)

    def as_json(self) -> dict:
        """`--json`'s object: the peak and each phase's total and parts, in GiB."""
        return {
            "config": self.config,
            "overrides": list(self.overrides),
            "world_size": self.world_size,
            "gpu_gib": self.gpu_gib,
            "peak_gib": round(self.peak / GIB, 2),
            "fits_with_headroom": self.peak <= (1 - HEADROOM) * self.gpu_gib * GIB,
            "phases": {
                phase: {
                    "total_gib": round(self.total(phase) / GIB, 2),
                    "parts_gib": {part: round(size / GIB, 2) for part, size in self.phases[phase].items()},
                }
                for phase in self.phases
            },
            "notes": self.notes,
        }


class RealWhereSmall(TorchDispatchMode):
    """Inside a FakeTensorMode: ops on real tensors only, and factories of at most
    `MAX_REAL_NUMEL` elements, run for real; everything else stays fake. Boolean-mask indexing of
    a fake tensor by a real mask becomes indexing by the mask's real `nonzero()` (same result),
    since a fake nonzero has no size."""

    INDEXING = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.INDEXING and isinstance(args[0], FakeTensor):
            with unset_fake_temporarily():
                indices = [index.nonzero().unbind(1) if _is_real_mask(index) else (index,) for index in args[1]]
            return func(args[0], [index for group in indices for index in group], *args[2:], **kwargs)
        tensors = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]
        if any(isinstance(tensor, FakeTensor) for tensor in tensors):
            return func(*args, **kwargs)
        if not tensors:  # a factory: fake when large
            result = func(*args, **kwargs)
            if not isinstance(result, torch.Tensor) or result.numel() > MAX_REAL_NUMEL:
                return result
        with unset_fake_temporarily():
            return func(*args, **kwargs)


class PeakOnly:
    """A memory tracker that keeps the peak of the whole process only. torch's trackers also keep
    each module's own peak, by walking every module they have seen on every op (O(modules) per
    op: most of the simulation's time at 28 layers, more with LoRA's many modules); the plan reads
    only the process's peak."""

    def _update_peak_stats(self, peak_state) -> None:
        for device, snapshot in self._curr_mem_snap.items():
            if self._peak_mem.get(device, 0) < snapshot[_TOTAL_KEY]:
                self._peak_mem[device] = snapshot[_TOTAL_KEY]
                self._peak_mem_snap[device] = dict(snapshot)


class FSDPPeakTracker(PeakOnly, FSDPMemTracker):
    """`FSDPMemTracker` keeping the process's peak only (`PeakOnly`)."""


class PeakTracker(PeakOnly, MemTracker):
    """`MemTracker` keeping the process's peak only (`PeakOnly`)."""


def _is_real_mask(index: torch.Tensor | None) -> bool:
    return index is not None and not isinstance(index, FakeTensor) and index.dtype == torch.bool


def local_bytes(tensors) -> int:
    """Bytes of this rank's part of `tensors` (the local shard of a DTensor)."""
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def model_config(config: Config) -> Qwen2Config:
    if config.model.path not in QWEN25:
        raise SystemExit(f"{config.model.path}: no published hyperparameters here; known: {', '.join(QWEN25)}")
    return Qwen2Config(**QWEN25[config.model.path], rms_norm_eps=1e-6, rope_theta=1e6)


def build_on_meta(config: Config, hf_config: Qwen2Config, *, critic: bool = False, reference: bool = False) -> torch.nn.Module:
    """The model pacs's trainer builds for `config` (policy, PPO critic or KL reference), on the meta
    device: dtypes, activation checkpointing and LoRA adapters as `pacs.train.trainer` sets them;
    the critic is the token-classification model with one label and no dropout that
    `pacs.models.loading.load_value_model` builds."""
    lora = config.model.lora_rank > 0 and not critic
    dtype = torch.bfloat16 if (lora or reference) and config.model.dtype == "bfloat16" else torch.float32
    with torch.device("meta"):
        if critic:
            critic_config = copy.deepcopy(hf_config)
            critic_config.num_labels, critic_config.classifier_dropout = 1, 0.0
            model = disable_dropout(token_classification_class(critic_config)._from_config(critic_config, dtype=dtype))
        else:
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
        if reference:
            return model.requires_grad_(False)
        return with_training_options(model, config, lora=lora)


def full_micro_batch(config: Config) -> PolicyBatch:
    """`train.micro_batch_size` rows, every prompt and response at its maximum length (real tensors)."""
    rows, prompt, response = config.train.micro_batch_size, config.data.max_prompt_length, config.data.max_response_length
    mask = torch.ones(rows, response)
    return PolicyBatch(
        prompt_ids=torch.ones(rows, prompt, dtype=torch.long),
        prompt_mask=torch.ones(rows, prompt, dtype=torch.long),
        response_ids=torch.ones(rows, response, dtype=torch.long),
        response_mask=mask,
        rewards=torch.zeros(rows),
        old_logprobs=torch.zeros_like(mask),
        entropy=torch.zeros_like(mask),
    )


def simulate_micro_batch(
    model: torch.nn.Module, loss_of: Callable[[torch.nn.Module], torch.Tensor], autocast: bool, fake: FakeTensorMode | None
) -> dict[str, int]:
    """Bytes of `model`'s parameters, gradients and AdamW state on this rank, and the peak of one
    micro-batch (`loss_of(model).backward()`) above them, split into gathered weights and the rest.

    With `fake` the model's tensors are materialised as fake tensors in that mode; without, the
    model is real (the `--check` run). Gradients and optimizer state exist before the micro-batch,
    as on every micro-batch from the second update on."""
    with fake if fake is not None else contextlib.nullcontext():
        if fake is not None:
            model.to_empty(device="cpu")
        trained = [parameter for parameter in model.parameters() if parameter.requires_grad]
        optimizer = torch.optim.AdamW(trained, lr=1e-6)
        for parameter in trained:
            parameter.grad = torch.zeros_like(parameter)
        optimizer.step()
    persistent = {
        "parameters": local_bytes(model.parameters()) + local_bytes(model.buffers()),
        "gradients": local_bytes(parameter.grad for parameter in trained),
        "optimizer state": local_bytes(tensor for state in optimizer.state.values() for tensor in state.values() if tensor.dim()),
    }
    rss_before = _current_rss_bytes()
    peak = tracked_peak(model, optimizer, lambda: loss_of(model), autocast, fake, sum(persistent.values()), backward=True)
    measured = {"rss_above_state": _peak_rss_bytes() - rss_before} if fake is None else {}
    return {**persistent, **peak, **measured}


def simulate_no_grad_micro_batch(
    model: torch.nn.Module, loss_of: Callable[[torch.nn.Module], torch.Tensor], autocast: bool, fake: FakeTensorMode
) -> dict[str, int]:
    """The peak of one micro-batch of `loss_of(model)` without gradients (the rollout policy's
    log-probs) above the model's weights, split as `simulate_micro_batch` splits it; the model's
    tensors are already materialised (`simulate_micro_batch`), and its gradients freed first."""
    for parameter in model.parameters():
        parameter.grad = None

    def forward() -> torch.Tensor:
        with torch.no_grad():
            return loss_of(model)

    weights = local_bytes(model.parameters()) + local_bytes(model.buffers())
    return tracked_peak(model, None, forward, autocast, fake, weights, backward=False)


def tracked_peak(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    forward: Callable[[], torch.Tensor],
    autocast: bool,
    fake: FakeTensorMode | None,
    persistent: int,
    *,
    backward: bool,
) -> dict[str, int]:
    """The peak of `forward()` (under bf16 autocast with `autocast`) and, with `backward`, of its
    output's backward (outside autocast, as the trainer runs it) above `persistent` bytes (what the
    tracker counts of the model and optimizer before it starts), as "gathered" (the tracker's
    `GATHERED` categories) and "activations" (the rest)."""
    is_fsdp = any(isinstance(parameter, DTensor) for parameter in model.parameters())
    tracker = FSDPPeakTracker(model, optimizer) if is_fsdp else PeakTracker()
    if not is_fsdp:
        # MemTracker hooks every parameter's gradient, which fails on frozen ones (LoRA's base):
        # mark those as hooked already, with handles that remove nothing
        no_hooks = OrderedDict()
        for parameter in model.parameters():
            if not parameter.requires_grad:
                tracker._param_to_grad_hook_handles[parameter] = (RemovableHandle(no_hooks), RemovableHandle(no_hooks))
        tracker.track_external(model, *([optimizer] if optimizer is not None else []))
    # the trackers refuse a second forward of the root per session (pacs runs one per length
    # bucket): forget the root's statistics (not the peak) before each
    handle = register_module_forward_pre_hook(lambda module, args: _forget(tracker, model) if module is model else None)
    model.train()
    try:
        with (
            fake if fake is not None else contextlib.nullcontext(),
            tracker,
            RealWhereSmall() if fake else contextlib.nullcontext(),
        ):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                output = forward()
            if backward:
                output.backward()
    finally:
        handle.remove()
    kinds: dict[str, int] = {}
    for peak_by_kind in tracker.get_tracker_snapshot("peak").values():  # one device: the CPU
        for kind, size in peak_by_kind.items():
            kinds[getattr(kind, "value", kind)] = kinds.get(getattr(kind, "value", kind), 0) + size
    transient = kinds.pop("Total") - persistent
    gathered = sum(size for kind, size in kinds.items() if kind in GATHERED)
    return {"gathered": gathered, "activations": transient - gathered}


def _forget(tracker: MemTracker, module: torch.nn.Module) -> None:
    if module in tracker.memory_tracking:
        del tracker.memory_tracking[module]


def _current_rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def generation_sequences(config: Config, world_size: int) -> int:
    """Sequences per `generate` call on a rank (`pacs.rollout.hf.TransformersEngine`): whole
    prompt groups of `rollout.generation_batch_size`, at most the rank's prompts of a step."""
    prompts_per_call = max(1, config.rollout.generation_batch_size // config.rollout.n)
    return min(prompts_per_call, config.train.batch_size // world_size) * config.rollout.n


def validation_sequences(config: Config) -> int:
    """Sequences per `generate` call of validation (`pacs.eval.evaluate`'s `sequences_per_call`):
    whole groups of `eval.n` in `rollout.generation_batch_size`, at least one group."""
    return max(1, config.rollout.generation_batch_size // config.eval.n) * config.eval.n


def kv_cache_bytes(model: torch.nn.Module, sequences: int, tokens: int, fake: FakeTensorMode) -> int:
    """Bytes of the key/value cache that transformers builds for `sequences` x `tokens` (fake forward)."""
    ids = torch.ones(sequences, tokens, dtype=torch.long)
    model.eval()
    with fake, RealWhereSmall(), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        cache = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1).past_key_values
    return local_bytes(tensor for layer in cache.layers for tensor in (layer.keys, layer.values))


def policy_loss(batch: PolicyBatch) -> Callable[[torch.nn.Module], torch.Tensor]:
    """A policy micro-batch: log-probs and entropy through pacs's chunked head (what the first
    update of a step computes), summed (the algorithms' losses are elementwise over (B, R))."""

    def loss_of(model: torch.nn.Module) -> torch.Tensor:
        logprobs, entropy = response_logprobs(model, batch, with_entropy=True)
        return -(logprobs * batch.response_mask).sum() - entropy.sum()

    return loss_of


def critic_loss(batch: PolicyBatch) -> Callable[[torch.nn.Module], torch.Tensor]:
    """A critic micro-batch: pacs's `response_values`, summed."""
    return lambda model: (response_values(model, batch) * batch.response_mask).sum()


def world_of(config: Config, world_size: int) -> World:
    """rank 0 of `world_size` with the config's strategy (`auto`: DDP with several processes, as
    `World.from_environment` decides), on the meta device."""
    if world_size == 1:
        return World.single("meta")
    strategy = "ddp" if config.train.strategy == "auto" else config.train.strategy
    return World(rank=0, world_size=world_size, device=torch.device("meta"), strategy=strategy)


CRITIC, GATHERED_PART, ACTIVATIONS, HF_MODEL, HF_CACHE, VLLM_WEIGHTS, VLLM_REST = PARTS[4:11]
VALIDATION_MODEL, VALIDATION_CACHE, GENERATOR_VLLM, GENERATOR_HF, WEIGHT_RING = PARTS[11:]


def plan(config_path: str, world_size: int, gpu_gib: float = GPU_GIB, overrides: tuple[str, ...] = ()) -> Plan:
    """Simulate `config_path`'s training step (with `overrides`, `key=value` settings) on rank 0 of
    `world_size` (see the module docstring)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    config = load_config(config_path, list(overrides))
    hf_config = model_config(config)
    world = world_of(config, world_size)
    if world.strategy == "ddp":
        raise SystemExit(
            f"{config_path}: train.strategy={config.train.strategy} at {world_size} ranks is DDP; plan fsdp or 1 rank"
        )
    bf16 = torch.bfloat16 if config.model.dtype == "bfloat16" else None
    batch = full_micro_batch(config)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    policy = wrap_model(world, build_on_meta(config, hf_config), compute_dtype=bf16)
    update = simulate_micro_batch(policy, policy_loss(batch), bf16 is not None, fake)
    old = simulate_no_grad_micro_batch(policy, policy_loss(batch), bf16 is not None, fake)
    notes = []
    whole_model = build_on_meta(config, hf_config, reference=True)
    reference = local_bytes(wrap_model(world, whole_model, compute_dtype=bf16).parameters())
    if config.algorithm.kl_coef == 0 or config.model.lora_rank > 0:
        reason = "kl_coef = 0" if config.algorithm.kl_coef == 0 else "LoRA: the base with adapters off"
        notes.append(f"no reference model ({reason}); a bf16 one sharded like the policy: {reference / GIB:.2f} GiB")
        reference = 0
    kept = {"parameters": update["parameters"], "optimizer state": update["optimizer state"], "reference model": reference}
    policy_update = {
        **kept,
        "gradients": update["gradients"],
        GATHERED_PART: update["gathered"],
        ACTIVATIONS: update["activations"],
    }
    if trains_a_critic(config):
        kept[CRITIC], policy_update = ppo_update(config, hf_config, world, batch, fake, kept, policy_update, notes)
    phases = {
        "old log-probs": {**kept, GATHERED_PART: old["gathered"], ACTIVATIONS: old["activations"]},
        "update": policy_update,
    }
    numel = sum(parameter.numel() for parameter in whole_model.parameters())
    compute_bytes = 2 if bf16 is not None else 4
    if config.rollout.max_staleness:
        generator = generator_process(config, hf_config, world_size, gpu_gib, numel * compute_bytes, compute_bytes, notes)
        phases["generation"] = dict(kept)
        for phase in phases.values():
            phase.update(generator)
    elif config.rollout.engine == "vllm":
        engine = vllm_engine(config, hf_config, world_size, gpu_gib, numel * compute_bytes, compute_bytes, notes)
        phases["generation"] = {**kept, **engine}
        if config.rollout.vllm.sleep_mode is False:  # None: on, on a GPU
            notes.append("sleep mode off: the engine holds its memory in every phase")
            for phase in ("old log-probs", "update"):
                phases[phase].update(engine)
    else:
        sequences = generation_sequences(config, world_size)
        cache = kv_cache_bytes(policy, sequences, config.data.max_prompt_length + config.data.max_response_length, fake)
        notes.append(
            f"transformers' KV cache for {sequences} sequences of {config.data.max_prompt_length} + "
            f"{config.data.max_response_length} tokens"
        )
        gathered = 0 if world.strategy == "none" else numel * compute_bytes
        phases["generation"] = {**kept, HF_MODEL: gathered, HF_CACHE: cache}
    if config.data.val is not None:
        phases["validation"] = validation(config, hf_config, world, numel * compute_bytes, compute_bytes, phases, kept, notes)
    ordered = {
        phase: {part: phases[phase][part] for part in PARTS if phases[phase].get(part)} for phase in PHASES if phase in phases
    }
    return Plan(
        config_path,
        world_size,
        gpu_gib,
        ordered,
        notes,
        time.perf_counter() - start,
        time.process_time() - cpu_start,
        tuple(overrides),
    )


def kv_bytes_per_token(hf_config: PretrainedConfig, compute_bytes: int) -> int:
    """Bytes of one token's keys and values over every layer: 2 x layers x key/value heads x head
    dimension x the compute dtype's bytes (56 KiB for Qwen2.5-7B in bf16). The head dimension is the
    config's `head_dim` where it has one (Qwen3), else hidden_size / attention heads; key/value
    heads are the attention heads without grouped-query attention."""
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    return 2 * hf_config.num_hidden_layers * kv_heads * head_dim * compute_bytes


def generator_process(
    config: Config, hf_config: Qwen2Config, world_size: int, gpu_gib: float, weights: int, compute_bytes: int, notes: list[str]
) -> dict[str, int]:
    """With `rollout.max_staleness` >= 1, the generator process beside each training process
    (`pacs.train.async_generator`), on the same GPU in every phase: it never sleeps. vLLM holds its
    whole `gpu_memory_utilization` x the GPU (or its weights and `kv_cache_gib`); transformers
    holds its own copy of the model in the compute dtype and the KV cache of one generation call.
    The weight ring the trainer pushes through (`pacs.train.async_generator`) holds
    `rollout.max_staleness` copies of the model in the compute dtype on the same GPU, in every
    phase. The generator's CUDA context is not counted (notes)."""
    if config.rollout.engine == "vllm":
        engine = vllm_engine(config, hf_config, world_size, gpu_gib, weights, compute_bytes, notes)
        held = {GENERATOR_VLLM: engine[VLLM_WEIGHTS] + engine[VLLM_REST]}
    else:
        sequences = generation_sequences(config, world_size)
        tokens = config.data.max_prompt_length + config.data.max_response_length
        held = {GENERATOR_HF: weights + sequences * tokens * kv_bytes_per_token(hf_config, compute_bytes)}
    held[WEIGHT_RING] = config.rollout.max_staleness * weights
    notes.append(
        f"rollout.max_staleness={config.rollout.max_staleness}: the generator process and the weight ring hold "
        f"{sum(held.values()) / GIB:.2f} GiB of the GPU in every phase (never asleep), plus a CUDA context of its own; "
        "no host memory holds the weights on their way"
    )
    return held


def validation(
    config: Config,
    hf_config: Qwen2Config,
    world: World,
    weights: int,
    compute_bytes: int,
    phases: dict[str, dict[str, int]],
    kept: dict[str, int],
    notes: list[str],
) -> dict[str, int]:
    """The validation phase (`Trainer.validate`, every `train.eval_every` steps and after the last):
    a synchronous run with vLLM validates with its engine, awake (the generation phase's parts);
    otherwise (`hf`, and every asynchronous run: the trainer's own engine is transformers') with
    transformers' generate on the policy gathered in the compute dtype, and the KV cache of one call
    of `rollout.generation_batch_size` sequences (whole groups of `eval.n`) at full length;
    beside the generator process with `rollout.max_staleness` >= 1."""
    if config.rollout.engine == "vllm" and not config.rollout.max_staleness:
        return dict(phases["generation"])
    sequences = validation_sequences(config)
    tokens = config.data.max_prompt_length + config.data.max_response_length
    cache = sequences * tokens * kv_bytes_per_token(hf_config, compute_bytes)
    notes.append(f"validation: transformers' KV cache for {sequences} sequences of {tokens} tokens")
    generator = {
        part: size for part, size in phases["generation"].items() if part.startswith("generator process") or part == WEIGHT_RING
    }
    gathered = 0 if world.strategy == "none" else weights
    return {**kept, VALIDATION_MODEL: gathered, VALIDATION_CACHE: cache, **generator}


def ppo_update(
    config: Config,
    hf_config: Qwen2Config,
    world: World,
    batch: PolicyBatch,
    fake: FakeTensorMode,
    kept: dict[str, int],
    policy_update: dict[str, int],
    notes: list[str],
) -> tuple[int, dict[str, int]]:
    """The bytes of PPO's critic outside its update (its weights and AdamW state), and PPO's update
    phase: the larger of the critic's update (before the policy's: the policy's weights and AdamW
    state held, the critic's whole state and micro-batch) and the policy's (the critic's weights
    and AdamW state held)."""
    bf16 = torch.bfloat16 if config.model.dtype == "bfloat16" else None
    critic = wrap_model(world, build_on_meta(config, hf_config, critic=True), compute_dtype=bf16)
    critic_update = simulate_micro_batch(critic, critic_loss(batch), bf16 is not None, fake)
    critic_kept = critic_update["parameters"] + critic_update["optimizer state"]
    critic_phase = {
        **kept,
        CRITIC: critic_kept + critic_update["gradients"],
        GATHERED_PART: critic_update["gathered"],
        ACTIVATIONS: critic_update["activations"],
    }
    policy_phase = {**policy_update, CRITIC: critic_kept}
    notes.append(
        f"PPO: the critic's update (before the policy's) peaks at {sum(critic_phase.values()) / GIB:.2f} GiB, "
        f"the policy's at {sum(policy_phase.values()) / GIB:.2f} GiB"
    )
    return critic_kept, max(critic_phase, policy_phase, key=lambda phase: sum(phase.values()))


def vllm_engine(
    config: Config, hf_config: Qwen2Config, world_size: int, gpu_gib: float, weights: int, compute_bytes: int, notes: list[str]
) -> dict[str, int]:
    """The colocated vLLM engine's bytes on a rank: its share of the weights (1/tensor_parallel_size
    of `weights`), and the rest of `gpu_memory_utilization` x the GPU (KV cache and activations),
    or `kv_cache_gib`. Notes how many full-length sequences that KV cache holds at once."""
    settings = config.rollout.vllm
    tp = settings.tensor_parallel_size
    own_weights = weights // tp
    if settings.kv_cache_gib is not None:
        rest = int(settings.kv_cache_gib * GIB)
        notes.append("vLLM's activations not counted (rollout.vllm.kv_cache_gib sizes its KV cache alone)")
    else:
        rest = int(settings.gpu_memory_utilization * gpu_gib * GIB) - own_weights
        if rest <= 0:
            notes.append(f"rollout.vllm.gpu_memory_utilization={settings.gpu_memory_utilization} does not hold vLLM's weights")
            rest = 0
    per_token = kv_bytes_per_token(hf_config, compute_bytes) // tp
    length = settings.max_model_len or config.data.max_prompt_length + config.data.max_response_length
    group_sequences = config.train.batch_size // world_size * tp * config.rollout.n
    sequences = min(config.rollout.generation_batch_size, group_sequences)
    notes.append(
        f"vLLM: {sequences} sequences at once (max_num_seqs) of up to {length} tokens need {sequences * length * per_token / GIB:.2f} GiB "
        f"of KV cache per rank; what the engine has beside its weights holds at most {rest // (length * per_token)} at full length"
    )
    return {VLLM_WEIGHTS: own_weights, VLLM_REST: rest}


def least_bytes(config: Config, numel: int, kv_per_token: int, world: World, gpu_bytes: int) -> dict[str, dict[str, int]]:
    """What a rank holds at least in each phase, without simulating (no activations, no layers
    gathered for a micro-batch, no critic): the trained state (fp32 weights and AdamW's two moments,
    12 bytes a parameter, sharded over the ranks under FSDP; with LoRA the frozen base in the compute
    dtype), a KL reference model (the compute dtype, sharded), the gradients in the update (4 bytes a
    parameter, sharded), and what vLLM reserves (`gpu_memory_utilization` x `gpu_bytes`, or its
    weights and `kv_cache_gib`) while it generates, in every phase when it never sleeps (the
    generator process of `rollout.max_staleness` >= 1, or sleep mode off). Transformers' generate
    (the `hf` engine's generation, and validation when the trainer's own engine is transformers':
    with `hf`, or in any asynchronous run) holds the model gathered in the compute dtype (under FSDP)
    and the KV cache of one call, sequences x (max_prompt_length + max_response_length) x
    `kv_per_token` bytes (`kv_bytes_per_token`); so does transformers' generator process, with its
    own copy of the model. With `rollout.max_staleness` = k >= 1 the weight ring holds k copies of
    the model in the compute dtype in every phase. The same closed forms as the simulated plan's (`generator_process`,
    `validation`)."""
    shards = world.world_size if world.strategy == "fsdp" else 1
    compute_bytes = 2 if config.model.dtype == "bfloat16" else 4
    weights = numel * compute_bytes
    lora = config.model.lora_rank > 0
    tokens = config.data.max_prompt_length + config.data.max_response_length
    state = {"trained state": numel * (compute_bytes if lora else 12) // shards}
    if config.algorithm.kl_coef > 0 and not lora:
        state["reference model"] = weights // shards
    gradients = {"gradients": 0 if lora else numel * 4 // shards}
    gathered = 0 if world.strategy == "none" else weights
    settings = config.rollout.vllm
    if config.rollout.engine == "vllm":
        held = (
            weights // settings.tensor_parallel_size + int(settings.kv_cache_gib * GIB)
            if settings.kv_cache_gib is not None
            else int(settings.gpu_memory_utilization * gpu_bytes)
        )
        engine = {"vLLM": held}
    elif config.rollout.max_staleness:
        engine = {"generator process (hf)": weights + generation_sequences(config, world.world_size) * tokens * kv_per_token}
    else:
        engine = {
            GENERATE_MODEL: gathered,
            GENERATE_CACHE: generation_sequences(config, world.world_size) * tokens * kv_per_token,
        }
    if config.rollout.max_staleness:
        engine[RING] = config.rollout.max_staleness * weights
    asynchronous = bool(config.rollout.max_staleness)
    never_sleeps = asynchronous or (config.rollout.engine == "vllm" and settings.sleep_mode is False)
    beside = engine if never_sleeps else {}
    phases = {"generation": {**state, **engine}, "update": {**state, **gradients, **beside}}
    if config.data.val is not None and (asynchronous or config.rollout.engine == "hf"):
        cache = validation_sequences(config) * tokens * kv_per_token
        phases["validation"] = {**state, VALIDATION_GENERATE_MODEL: gathered, VALIDATION_GENERATE_CACHE: cache, **beside}
    return phases


GENERATE_MODEL, GENERATE_CACHE = "model gathered for generate", "KV cache of one generate call"
RING = "weight ring"
VALIDATION_GENERATE_MODEL, VALIDATION_GENERATE_CACHE = f"validation: {GENERATE_MODEL}", f"validation: {GENERATE_CACHE}"


def settings_to_change(config: Config, world: World, parts: Iterable[str]) -> list[str]:
    """The settings that lower `parts` (`least_bytes`'s names) of a phase, with their values now."""
    rollout = config.rollout
    fixes = [
        f"shard over more GPUs (train.strategy=fsdp, now {world.strategy} on {world.world_size}) "
        "or train LoRA adapters (model.lora_rank)"
    ]
    if "vLLM" in parts:
        fixes.append(
            f"lower rollout.vllm.gpu_memory_utilization (now {rollout.vllm.gpu_memory_utilization}) "
            "or set rollout.vllm.kv_cache_gib"
        )
    if rollout.max_staleness and any(part in ("vLLM", RING) or part.startswith("generator") for part in parts):
        fixes.append(f"set rollout.max_staleness=0 (now {rollout.max_staleness}; a synchronous engine sleeps through the update)")
    elif "vLLM" in parts and rollout.vllm.sleep_mode is False:
        fixes.append("turn rollout.vllm.sleep_mode on (now off: the engine holds its memory through the update)")
    if any(part.endswith(GENERATE_CACHE) for part in parts):
        fixes.append(
            f"lower rollout.generation_batch_size (now {rollout.generation_batch_size}: the sequences of one generate call) "
            f"or data.max_response_length (now {config.data.max_response_length})"
        )
    if VALIDATION_GENERATE_CACHE in parts:
        fixes.append("leave validation out (data.val=null)")
    return fixes


def memory_problem(
    config: Config, numel: int, kv_per_token: int, world: World, gpu_bytes: int, device: str = "the GPU"
) -> str | None:
    """Why `config` cannot fit a `gpu_bytes` device whatever its activations (the largest of
    `least_bytes`'s phases for a model of `numel` parameters and `kv_per_token` bytes of keys and
    values a token is above `gpu_bytes`), naming the settings that lower that phase; or None."""
    phases = least_bytes(config, numel, kv_per_token, world, gpu_bytes)
    phase = max(phases, key=lambda name: sum(phases[name].values()))
    need = sum(phases[phase].values())
    if need <= gpu_bytes:
        return None
    held = ", ".join(f"{part} {size / GIB:.1f}" for part, size in phases[phase].items() if size)
    return (
        f"this run cannot fit {device} ({gpu_bytes / GIB:.1f} GiB): its {phase} phase holds at least {need / GIB:.1f} GiB "
        f"per GPU before any activation ({held} GiB). To fit: {'; '.join(settings_to_change(config, world, phases[phase]))}. "
        "The whole plan, activations included: "
        f"`python benchmarks/memory_plan.py CONFIG --world-size {world.world_size} KEY=VALUE ...` (docs/memory.md)"
    )


def check_fits_device(config: Config, world: World) -> None:
    """Refuse (ValueError, `memory_problem`) a run on a CUDA device too small for it, before
    anything loads: the device's size from CUDA, the model's parameters counted on the meta
    device from its config.json, and its keys and values a token from the same config."""
    from transformers import AutoConfig

    from pacs.models.loading import resolve_model_path

    hf_config = AutoConfig.from_pretrained(resolve_model_path(config.model.path))
    with torch.device("meta"):
        numel = sum(parameter.numel() for parameter in AutoModelForCausalLM.from_config(hf_config).parameters())
    kv_per_token = kv_bytes_per_token(hf_config, 2 if config.model.dtype == "bfloat16" else 4)
    properties = torch.cuda.get_device_properties(world.device)
    if problem := memory_problem(
        config, numel, kv_per_token, world, properties.total_memory, f"{world.device} ({properties.name})"
    ):
        raise ValueError(problem)


def simulate(config_path: str, world_size: int, gpu_gib: float = GPU_GIB, overrides: tuple[str, ...] = ()) -> Plan:
    """`plan` inside a fake process group of `world_size` ranks."""
    with fake_process_group(world_size):
        return plan(config_path, world_size, gpu_gib, overrides)


@contextlib.contextmanager
def fake_process_group(world_size: int):
    """torch's fake process group of `world_size` ranks in this process: collectives that move no data."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def table(plan: Plan) -> str:
    """What each phase holds (a column each), its total, the peak and whether it fits."""
    parts = [part for part in PARTS if any(part in held for held in plan.phases.values())]
    width = max(map(len, parts))
    fits = "fits" if plan.peak <= (1 - HEADROOM) * plan.gpu_gib * GIB else "does NOT fit"
    settings = f" with {' '.join(plan.overrides)}" if plan.overrides else ""
    lines = [
        f"{plan.config}{settings}: rank 0 of {plan.world_size} (simulated in {plan.seconds:.1f} s, {plan.cpu_seconds:.1f} s of CPU)",
        f"  {'GiB per rank':<{width}}  " + "  ".join(f"{phase:>13}" for phase in plan.phases),
    ]
    for part in [*parts, "total"]:
        sizes = [plan.total(phase) if part == "total" else plan.phases[phase].get(part, 0) for phase in plan.phases]
        lines.append(f"  {part:<{width}}  " + "  ".join(f"{size / GIB:13.2f}" for size in sizes))
    lines.append(f"  peak {plan.peak / GIB:.2f} GiB: {fits} a {plan.gpu_gib:g} GiB GPU with {HEADROOM:.0%} headroom")
    lines += [f"  ({note})" for note in plan.notes]
    return "\n".join(lines)


def markdown(plans: list[Plan]) -> str:
    """Each phase's total and the peak, one column per config (configs with the same figures
    share a column)."""
    columns: dict[tuple, list[Plan]] = {}
    for plan in plans:
        columns.setdefault(
            (plan.world_size, tuple(plan.total(phase) if phase in plan.phases else 0 for phase in PHASES)), []
        ).append(plan)
    header = [
        " / ".join(Path(plan.config).stem for plan in group)
        + f", {group[0].world_size} rank"
        + ("s" if group[0].world_size > 1 else "")
        for group in columns.values()
    ]
    lines = ["| GiB per rank | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|"]
    for phase in PHASES:
        cells = [f"{group[0].total(phase) / GIB:.2f}" if phase in group[0].phases else "-" for group in columns.values()]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    lines.append("| **peak** | " + " | ".join(f"**{group[0].peak / GIB:.2f}**" for group in columns.values()) + " |")
    return "\n".join(lines)


def default_runs() -> list[tuple[str, int]]:
    paper = sorted(f"builtin:{path.stem}" for path in Path(str(importlib.resources.files("pacs.configs"))).glob("paper-*.yaml"))
    return [(path, PAPER_WORLD_SIZE) for path in paper] + [("builtin:lora-qwen2.5-7b", 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "configs",
        nargs="*",
        help="config files (default: the paper's at 64 ranks, the LoRA 7B on 1), and key=value settings for every one "
        "(e.g. rollout.max_staleness=1)",
    )
    parser.add_argument("--world-size", type=int, help="ranks for every config given")
    parser.add_argument("--gpu-gib", type=float, default=GPU_GIB, help=f"GPU memory in GiB (default {GPU_GIB:g})")
    parser.add_argument("--markdown", action="store_true", help="also print the table of docs/results.md")
    parser.add_argument("--json", action="store_true", help="print one JSON object per config instead of tables")
    parser.add_argument("--jobs", type=int, help="simulations run at once (default: one per CPU core)")
    parser.add_argument("--check", action="store_true", help="compare with a real run of a small model (peak RSS)")
    parser.add_argument("--check-run", nargs=2, metavar=("fake|real", "none|fsdp"), help=argparse.SUPPRESS)
    args = parser.parse_intermixed_args()  # settings may follow the options
    if args.check_run:
        print(json.dumps(check_run(args.check_run[0] == "fake", args.check_run[1])))
        return
    if args.check:
        check()
        return
    overrides = tuple(argument for argument in args.configs if "=" in argument)
    paths = [argument for argument in args.configs if "=" not in argument]
    runs = [(path, args.world_size or PAPER_WORLD_SIZE) for path in paths] or default_runs()
    start = time.perf_counter()
    # configs that differ only in the algorithm's coefficients share one simulation
    keys = [(simulation_key(load_config(path, list(overrides))), world_size) for path, world_size in runs]
    first_run = dict(zip(reversed(keys), reversed(runs)))
    # one process per simulation (each its own fake process group), forked before torch computes
    with ProcessPoolExecutor(args.jobs or min(len(first_run), os.cpu_count() or 1), mp_context=get_context("fork")) as pool:
        futures = {key: pool.submit(simulate, *run, args.gpu_gib, overrides) for key, run in first_run.items()}
        plans = []
        for (path, world_size), key in zip(runs, keys):
            done = futures[key].result()
            plans.append(Plan(path, world_size, done.gpu_gib, done.phases, done.notes, done.seconds, done.cpu_seconds, overrides))
            print(json.dumps(plans[-1].as_json()) if args.json else table(plans[-1]) + "\n", flush=True)
    if args.json:
        return
    print(f"{len(plans)} configs, {len(first_run)} simulations, {time.perf_counter() - start:.1f} s")
    if args.markdown:
        print("\n" + markdown(plans))


def trains_a_critic(config: Config) -> bool:
    """Whether the run's algorithm needs a critic's values (PPO's, or a user's algorithm's)."""
    return "values" in config.algorithm.build(config.rollout.n, config.data.max_response_length).needs


def simulation_key(config: Config) -> tuple:
    """What the simulated memory depends on."""
    return (
        config.model.model_dump_json(),
        config.data.max_prompt_length,
        config.data.max_response_length,
        trains_a_critic(config),
        config.algorithm.kl_coef > 0,
        config.rollout.engine,
        config.rollout.vllm.model_dump_json(),
        config.rollout.n,
        config.rollout.generation_batch_size,
        config.rollout.max_staleness > 0,
        config.data.val is not None,
        config.eval.n,
        config.train.batch_size,
        config.train.micro_batch_size,
        config.train.strategy,
        config.train.gradient_checkpointing,
    )


CHECK_MODEL = dict(
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=2,
    vocab_size=32000,
    tie_word_embeddings=False,
)
CHECK_SETTINGS = [
    "model.path=check",
    "data.max_prompt_length=64",
    "data.max_response_length=2048",
    "train.micro_batch_size=4",
    "train.gradient_checkpointing=true",
    "model.dtype=bfloat16",
]


def check_run(fake: bool, strategy: str) -> dict[str, int]:
    """One micro-batch of the small `CHECK_MODEL` on rank 0 of 1 (`strategy` "none" or "fsdp"),
    fake (simulated) or real (tracked, and its resident set measured)."""
    config = load_config("configs/demo.yaml", CHECK_SETTINGS)
    with fake_process_group(1):
        world = World(rank=0, world_size=1, device=torch.device("meta" if fake else "cpu"), strategy=strategy)
        with torch.device("meta") if fake else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_config(Qwen2Config(**CHECK_MODEL), dtype=torch.float32)
        enable_activation_checkpointing(model)
        model = wrap_model(world, model, compute_dtype=torch.bfloat16)
        fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None
        return simulate_micro_batch(model, policy_loss(full_micro_batch(config)), True, fake_mode)


def check_run_on_gpu() -> dict[str, int]:
    """`check_run`'s real micro-batch (one process) on the GPU, measured by CUDA's allocator: its
    peak above the state (all "activations": nothing is gathered without FSDP)."""
    config = load_config("configs/demo.yaml", CHECK_SETTINGS)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**CHECK_MODEL), dtype=torch.float32).cuda()
    enable_activation_checkpointing(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    batch = full_micro_batch(config).to("cuda")
    torch.cuda.synchronize()
    state = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    model.train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = policy_loss(batch)(model)
    loss.backward()
    torch.cuda.synchronize()
    return {"gathered": 0, "activations": torch.cuda.max_memory_allocated() - state}


def check() -> None:
    """Simulated against real: each run in a fresh process (a clean resident set)."""
    for strategy in ("none", "fsdp"):
        results = {}
        for mode in ("fake", "real"):
            child = subprocess.run(
                [sys.executable, "-m", "pacs.train.memory_plan", "--check-run", mode, strategy],
                capture_output=True,
                text=True,
                check=True,
            )
            results[mode] = json.loads(child.stdout.splitlines()[-1])
        fake, real = results["fake"], results["real"]
        simulated = fake["gathered"] + fake["activations"]
        tracked = real["gathered"] + real["activations"]
        print(
            f"strategy {strategy}: peak of a micro-batch above the state (MiB): simulated {simulated / 2**20:.0f}, "
            f"tracked on real tensors {tracked / 2**20:.0f}, measured resident set {real['rss_above_state'] / 2**20:.0f}; "
            f"state simulated {sum(fake[k] for k in ('parameters', 'gradients', 'optimizer state')) / 2**20:.0f}, "
            f"real {sum(real[k] for k in ('parameters', 'gradients', 'optimizer state')) / 2**20:.0f}"
        )


if __name__ == "__main__":
    main()
