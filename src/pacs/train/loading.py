"""What `Trainer.setup` loads: the policy (wrapped for the strategy, with LoRA and activation
checkpointing as configured) and its optimizer, PPO's critic, the frozen reference, and the
training and validation prompts. Every rank loads the same way; rank 0 alone reads full weights
and sends them (`pacs.distributed.wrapping.load_on_rank0`).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from rich.console import Console
from transformers import PreTrainedTokenizerBase

from pacs.config import Config, ConfigError
from pacs.data.loading import load_rows, rendering_comment
from pacs.data.prompts import EncodedPrompts, check_some_prompt_fits, encode_prompts
from pacs.distributed.collectives import (
    run_on_every_rank,
    run_on_rank0,
)
from pacs.distributed.world import World
from pacs.distributed.wrapping import (
    load_on_rank0,
    wrap_frozen_model,
    wrap_model,
)
from pacs.models.loading import (
    enable_activation_checkpointing,
    load_causal_lm,
    load_tokenizer,
    load_value_model,
)
from pacs.models.lora import (
    ADAPTER_DIR,
    SavedAdapter,
    add_lora,
    read_adapter,
)
from pacs.models.precision import Precision
from pacs.train.checkpointing.state import (
    CRITIC_DIR,
    REFERENCE_DIR,
)
from pacs.train.throughput import flop_parameters

NODE_INPUTS_HOW_TO_FIX = (
    "Every node runs the same command and reads model.path, the data files and the reward function from its own "
    "disk, at the same paths (a relative path from its own working directory): put what a node lacks there. "
    "Only rank 0 needs the output_dir and its checkpoints."
)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_prompts(specs: str | list[str], tokenizer, max_prompt_length: int, default_split: str) -> EncodedPrompts:
    """Rows of every spec, tokenized through the chat template; over-long prompts counted."""
    spec_list = [specs] if isinstance(specs, str) else specs
    rows_by_spec = {spec: load_rows(spec, default_split=default_split) for spec in spec_list}
    prompts = encode_prompts(tokenizer, [row for spec in spec_list for row in rows_by_spec[spec]], max_prompt_length)
    if not prompts.rows:  # refused before anything loads or is written (`check_run_inputs`); here for a caller that did not check
        try:
            check_some_prompt_fits(tokenizer, rows_by_spec, max_prompt_length)
        except ValueError as error:
            raise ConfigError(f"data.{default_split}: {error}") from None
    return prompts


def parameter_counts(model: torch.nn.Module) -> dict[str, float]:
    """`model/trainable_parameters` (those the optimizer updates) and `model/total_parameters`
    (tied weights counted once)."""
    parameters = list(model.parameters())
    return {
        "model/trainable_parameters": float(sum(p.numel() for p in parameters if p.requires_grad)),
        "model/total_parameters": float(sum(p.numel() for p in parameters)),
    }


@dataclass
class Policy:
    """The trained model (wrapped for the strategy) and what goes with it."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    tokenizer: PreTrainedTokenizerBase
    sizes: dict[str, float]
    """`parameter_counts` of the unwrapped model, logged at a run's first step."""
    flop_parameters: float
    """N of `perf/mfu`'s 6ND rule (`pacs.train.throughput.flop_parameters`)."""


class Critic(NamedTuple):
    """PPO's value model (wrapped for the strategy) and its optimizer."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    flop_parameters: float
    """N of `perf/mfu`'s 6ND rule (`pacs.train.throughput.flop_parameters`)."""

    def trained(self) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """The model and its optimizer, as checkpoints save and restore them."""
        return self.model, self.optimizer


def load_policy(config: Config, world: World, resume_from: Path | None, console: Console) -> Policy:
    """The policy, wrapped for the strategy, with its optimizer over the trainable parameters.
    Its tokenizer comes from `model.path` on every node (a checkpoint may be on rank 0's disk
    alone). The full model (from the checkpoint, or `model.path`) is read by rank 0 alone and
    sent to every rank (`load_on_rank0`); with LoRA every rank loads the base from `model.path`
    in the run's dtype (peft wraps a whole model) and rank 0 alone reads the checkpoint's adapter,
    which every rank receives."""
    lora, precision = config.model.lora_rank > 0, Precision(config.model.dtype)
    tokenizer = run_on_every_rank(
        world, lambda: load_tokenizer(config.model.path), how_to_fix=NODE_INPUTS_HOW_TO_FIX, node_leader_first=True
    )
    adapter = None
    if lora:
        load_base = functools.partial(load_causal_lm, config.model.path, dtype=precision.frozen)
        model = run_on_every_rank(world, load_base, how_to_fix=NODE_INPUTS_HOW_TO_FIX, node_leader_first=True)
        rank0_weights = None
        if resume_from:
            adapter = run_on_rank0(world, lambda: read_adapter(resume_from / ADAPTER_DIR))
    else:
        load_full = functools.partial(load_causal_lm, str(resume_from or config.model.path), dtype=precision.weights)
        model, rank0_weights = load_on_rank0(world, load_full)
    model = with_training_options(model, config, lora=lora, adapter=adapter)
    sizes, multiplying = parameter_counts(model), flop_parameters(model)
    console.print(
        f"model: {sizes['model/trainable_parameters']:,.0f} of {sizes['model/total_parameters']:,.0f} parameters trained"
        + (f" (LoRA rank {config.model.lora_rank})" if lora else "")
    )
    model = wrap_model(world, model, compute_dtype=precision.bf16_compute, rank0_weights=rank0_weights)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=config.train.lr, weight_decay=config.train.weight_decay
    )
    return Policy(model, optimizer, tokenizer, sizes, multiplying)


def with_training_options(
    model: torch.nn.Module, config: Config, *, lora: bool, adapter: SavedAdapter | None = None
) -> torch.nn.Module:
    """`model` as the run trains it: activation checkpointing with `train.gradient_checkpointing`,
    and with `lora` the `model.lora_*` adapters (new, or the saved `adapter`). New adapters are
    drawn from `seed` alone, leaving torch's random state as it was: the same on every rank
    whatever loading drew on each (FSDP keeps each rank's shard of its own draw, no broadcast)."""
    if config.train.gradient_checkpointing:
        enable_activation_checkpointing(model)
    if not lora:
        return model
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return add_lora(
            model,
            rank=config.model.lora_rank,
            alpha=config.model.lora_alpha,
            dropout=config.model.lora_dropout,
            target_modules=config.model.lora_target_modules,
            adapter=adapter,
        )


def load_critic(config: Config, world: World, resume_from: Path | None) -> Critic:
    """PPO's critic (from the checkpoint's `critic/`, `critic.path` or `model.path`), wrapped like
    the policy, and its optimizer."""
    source = str(resume_from / CRITIC_DIR) if resume_from else config.critic.path or config.model.path
    precision = Precision(config.model.dtype)
    critic, rank0_weights = load_on_rank0(world, functools.partial(load_value_model, source, dtype=precision.weights))
    critic = with_training_options(critic, config, lora=False)
    multiplying = flop_parameters(critic)
    critic = wrap_model(world, critic, compute_dtype=precision.bf16_compute, rank0_weights=rank0_weights)
    optimizer = torch.optim.AdamW(critic.parameters(), lr=config.critic.lr, weight_decay=config.train.weight_decay)
    return Critic(critic, optimizer, multiplying)


def load_reference(config: Config, world: World, resume_from: Path | None) -> torch.nn.Module:
    """The frozen reference policy (the KL penalty's, PACS's with a fixed reference), from
    `model.path` (in bfloat16 under mixed precision: it is never trained), sharded under FSDP like
    the policy; a run whose reference is reset (`train.reference_reset_every`) resumes it from the
    checkpoint's `reference/`."""
    moves = config.train.reference_reset_every > 0
    source = str(resume_from / REFERENCE_DIR) if resume_from and moves else config.model.path
    load = functools.partial(load_causal_lm, source, dtype=Precision(config.model.dtype).frozen)
    reference, rank0_weights = load_on_rank0(world, load)
    return wrap_frozen_model(world, reference, rank0_weights=rank0_weights)


def record_rendering(config: Config, tokenizer, train_prompts: EncodedPrompts) -> None:
    """Append to the run's config.yaml, as comments (which loading it back ignores), how the chat
    template renders its prompts (`rendering_comment`, on the first training prompt)."""
    comment = rendering_comment(tokenizer, train_prompts.rows[0], config.model.path)
    with (Path(config.output_dir) / "config.yaml").open("a") as file:
        file.write(comment)


def load_train_and_val_prompts(config: Config, tokenizer, console: Console) -> tuple[EncodedPrompts, EncodedPrompts | None]:
    """`data.train` and `data.val` (if set) through the chat template; says how many prompts were
    too long and left out."""
    train_prompts = load_prompts(config.data.train, tokenizer, config.data.max_prompt_length, "train")
    val_prompts = load_prompts(config.data.val, tokenizer, config.data.max_prompt_length, "val") if config.data.val else None
    for name, prompts in (("train", train_prompts), ("val", val_prompts)):
        if prompts is not None and prompts.num_filtered:
            console.print(
                f"[yellow]data.{name}: {prompts.num_filtered} of {prompts.num_filtered + len(prompts.rows)} prompts "
                f"are longer than data.max_prompt_length={config.data.max_prompt_length} tokens and were left out"
            )
    return train_prompts, val_prompts
