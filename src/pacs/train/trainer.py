"""The RLVR loop, one for every algorithm, on one process or many.

Each step: draw `train.batch_size` prompts -> sample `rollout.n` responses each -> score them
with the verifier -> recompute the rollout policy's log-probs (except for the first mini-batch,
whose first update takes them from its own forward pass) -> `train.epochs` passes of optimizer
updates over mini-batches of `train.mini_batch_size` prompts -> log, validate, checkpoint.
Launched by torchrun or `accelerate launch`, each process takes its share of every mini-batch
(a prompt's whole group stays on one rank) and `pacs.train.distributed.World` says who does
what; one process is the trivial case.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from pacs.algos.core import mixed_group_fraction
from pacs.algos.registry import build_algorithm
from pacs.config import Config, ConfigError, dump_config
from pacs.data.loading import load_rows
from pacs.data.prompts import EncodedPrompts, encode_prompts
from pacs.eval.evaluate import evaluate
from pacs.models.loading import DTYPES, enable_activation_checkpointing, load_causal_lm, load_tokenizer, load_value_model
from pacs.models.lora import ADAPTER_DIR, add_lora, language_model, require_peft
from pacs.outputs import claim_output_dir
from pacs.progress import progress_bar
from pacs.rewards import ScoringPool
from pacs.rollout.base import SamplingParams
from pacs.rollout.hf import TransformersEngine
from pacs.train import builtin_models  # noqa: F401  (registers builtin:tiny-arithmetic)
from pacs.train.batch import PolicyBatch, fill_rollout_logprobs, response_logprobs_no_grad, response_values_no_grad
from pacs.train.checkpoint import CRITIC_DIR, latest_checkpoint, load_trainer_state, restore_rng_states, write_checkpoint
from pacs.train.distributed import World
from pacs.train.metrics import MetricsLogger
from pacs.train.preflight import check_run_inputs
from pacs.train.sampler import PromptSampler
from pacs.train.update import UpdateSettings, update_critic, update_policy



@dataclass
class TrainResult:
    output_dir: Path
    final_checkpoint: Path
    last_metrics: dict[str, float]
    skipped_updates: int
    is_writer: bool = True
    """False on every rank but 0 of a multi-process run (which reports the same global metrics)."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def load_prompts(specs: str | list[str], tokenizer, max_prompt_length: int, default_split: str) -> EncodedPrompts:
    """Rows of every spec, tokenized through the chat template; over-long prompts counted."""
    rows = [row for spec in ([specs] if isinstance(specs, str) else specs) for row in load_rows(spec, default_split=default_split)]
    prompts = encode_prompts(tokenizer, rows, max_prompt_length)
    if not prompts.rows:
        raise ConfigError(
            f"every one of the {len(rows)} prompts in {specs} is longer than data.max_prompt_length={max_prompt_length}"
        )
    return prompts


def rollout_metrics(
    rewards: torch.Tensor, response_lengths: torch.Tensor, entropy_sums: torch.Tensor, group_size: int
) -> dict[str, float]:
    """What a step's rollouts look like: mean reward, fraction of groups with mixed outcomes,
    response lengths, and the rollout policy's entropy averaged over every response token.

    rewards, response_lengths, entropy_sums: (B,) per response, entropy summed over its tokens.
    """
    return {
        "reward/mean": float(rewards.mean()),
        "reward/groups_mixed_fraction": mixed_group_fraction(rewards, group_size),
        "response_length/mean": float(response_lengths.mean()),
        "response_length/max": float(response_lengths.max()),
        "actor/entropy": float(entropy_sums.sum() / response_lengths.sum().clamp(min=1)),
    }


def mixed_precision(device: torch.device, dtype: str):
    """The context forward passes run in: bfloat16 autocast for `model.dtype=bfloat16` (the
    weights stay float32), nothing otherwise."""
    if dtype == "bfloat16":
        return functools.partial(torch.autocast, device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext


def parameter_counts(model: torch.nn.Module) -> dict[str, float]:
    """`model/trainable_parameters` (those the optimizer updates) and `model/total_parameters`
    (tied weights counted once)."""
    parameters = list(model.parameters())
    return {
        "model/trainable_parameters": float(sum(p.numel() for p in parameters if p.requires_grad)),
        "model/total_parameters": float(sum(p.numel() for p in parameters)),
    }


def check_resumable(checkpoint: Path, lora_rank: int) -> None:
    """Refuse to resume a LoRA run from a full-model checkpoint and the other way round."""
    has_adapter = (checkpoint / ADAPTER_DIR).is_dir()
    if has_adapter != (lora_rank > 0):
        written = "with LoRA (it holds adapter/)" if has_adapter else "without LoRA (no adapter/)"
        raise ConfigError(
            f"{checkpoint} was written {written} and cannot be resumed with model.lora_rank={lora_rank}; "
            "resume with the run's own model.lora_rank, or start a new output_dir from its merged weights "
            f"(model.path={checkpoint})"
        )


def train(config: Config, *, show_progress: bool = True) -> TrainResult:
    """Run `config` to the end (or from its newest checkpoint with `resume=auto`), in this
    process and every other one the launcher started."""
    world = World.from_environment(config.train.strategy)
    try:
        result = _train(config, world, show_progress=show_progress)
        world.barrier()  # no rank tears its process group down while another still uses it
        return result
    finally:
        world.close()


def _train(config: Config, world: World, *, show_progress: bool) -> TrainResult:
    world.check_divisible(config.train.batch_size, config.train.mini_batch_size)
    lora = config.model.lora_rank > 0
    if lora:
        try:
            require_peft()
        except ImportError as error:
            raise ConfigError(str(error)) from None
    check_run_inputs(config)
    output_dir = Path(config.output_dir)
    checkpoints_dir = output_dir / "checkpoints"
    resume_from = latest_checkpoint(checkpoints_dir) if config.resume == "auto" else None
    if config.resume == "never" and latest_checkpoint(checkpoints_dir) is not None:
        raise ConfigError(
            f"{checkpoints_dir} already holds checkpoints; pass resume=auto to continue that run "
            "or choose another output_dir"
        )
    if world.is_writer:
        claim_output_dir(output_dir, "pacs train", reuse=config.resume == "auto")
        dump_config(config, output_dir / "config.yaml")
    console = Console(stderr=True, soft_wrap=True, quiet=not world.is_writer)
    seed_everything(config.seed)
    if resume_from:
        check_resumable(resume_from, config.model.lora_rank)

    weights_dtype = "float64" if config.model.dtype == "float64" else "float32"
    autocast = mixed_precision(world.device, config.model.dtype)
    # with LoRA the frozen base comes from model.path (in bf16 under mixed precision), the adapter from the checkpoint
    model_source = str(resume_from) if resume_from and not lora else config.model.path
    with world.node_leader_first():
        tokenizer = load_tokenizer(str(resume_from) if resume_from else config.model.path)
        model = load_causal_lm(model_source, dtype=config.model.dtype if lora else weights_dtype)
    if config.train.gradient_checkpointing:
        enable_activation_checkpointing(model)
    if lora:
        model = add_lora(
            model,
            rank=config.model.lora_rank,
            alpha=config.model.lora_alpha,
            dropout=config.model.lora_dropout,
            target_modules=config.model.lora_target_modules,
            adapter=resume_from / ADAPTER_DIR if resume_from else None,
        )
    sizes = parameter_counts(model)
    console.print(
        f"model: {sizes['model/trainable_parameters']:,.0f} of {sizes['model/total_parameters']:,.0f} parameters trained"
        + (f" (LoRA rank {config.model.lora_rank})" if lora else "")
    )
    compute_dtype = DTYPES[weights_dtype]

    train_prompts = load_prompts(config.data.train, tokenizer, config.data.max_prompt_length, "train")
    val_prompts = (
        load_prompts(config.data.val, tokenizer, config.data.max_prompt_length, "val") if config.data.val else None
    )
    for name, prompts in (("train", train_prompts), ("val", val_prompts)):
        if prompts is not None and prompts.num_filtered:
            console.print(
                f"[yellow]data.{name}: {prompts.num_filtered} of {prompts.num_filtered + len(prompts.rows)} prompts "
                f"are longer than data.max_prompt_length={config.data.max_prompt_length} tokens and were left out"
            )
    scorer = ScoringPool(config.reward.function, num_workers=config.reward.num_workers, timeout_s=config.reward.timeout_s)
    algorithm = build_algorithm(
        group_size=config.rollout.n, horizon=config.data.max_response_length, **config.algorithm.model_dump()
    )

    bf16 = torch.bfloat16 if config.model.dtype == "bfloat16" else None
    critic = critic_optimizer = None
    if "values" in algorithm.needs:
        critic_source = str(resume_from / CRITIC_DIR) if resume_from else config.critic.path or config.model.path
        with world.node_leader_first():
            critic = load_value_model(critic_source, dtype=weights_dtype)
        if config.train.gradient_checkpointing:
            enable_activation_checkpointing(critic)
    model = world.wrap(model, compute_dtype=bf16)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=config.train.lr, weight_decay=config.train.weight_decay
    )
    if critic is not None:
        critic = world.wrap(critic, compute_dtype=bf16)
        critic_optimizer = torch.optim.AdamW(
            critic.parameters(), lr=config.critic.lr, weight_decay=config.train.weight_decay
        )
    sampler = PromptSampler(len(train_prompts.rows), config.seed)
    start_step = 0
    if resume_from:
        state = load_trainer_state(resume_from)
        world.load_optimizer_state(model, optimizer, state["optimizer"])
        if critic is not None:
            world.load_optimizer_state(critic, critic_optimizer, state["critic_optimizer"])
        sampler = PromptSampler(**state["sampler"])
        restore_rng_states(state["rng"], world)
        start_step = state["step"]
        console.print(f"resuming from {resume_from} (step {start_step})")
    elif world.rank > 0:
        torch.manual_seed(config.seed * 1_000_003 + world.rank)
    engine = TransformersEngine(language_model(world.unwrap(model)), tokenizer, max_sequences_per_call=config.rollout.generation_batch_size)
    rollout_params = SamplingParams(
        n=config.rollout.n,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        max_new_tokens=config.data.max_response_length,
    )
    settings = UpdateSettings(
        mini_batch_size=config.train.mini_batch_size // world.world_size,
        micro_batch_size=config.train.micro_batch_size,
        epochs=config.train.epochs,
        grad_clip=config.train.grad_clip,
        temperature=config.rollout.temperature,
        autocast=autocast,
    )

    @functools.cache
    def reference_model():
        """The frozen initial policy, loaded only when an algorithm asks for reference log-probs
        (in bfloat16 under mixed precision: it is never trained)."""
        with world.node_leader_first():  # on resume, the first load of config.model.path
            return load_causal_lm(config.model.path, dtype=config.model.dtype).to(world.device).eval()

    @contextlib.contextmanager
    def reference_policy():
        """The frozen initial policy to compute reference log-probs with: with LoRA, the policy
        itself with its adapters disabled (run through its wrapper, so FSDP gathers its shards);
        otherwise the loaded `reference_model()`."""
        if not lora:
            yield reference_model()
            return
        with world.unwrap(model).disable_adapter():
            yield model

    def checkpoint(name: str, step: int) -> Path:
        return write_checkpoint(
            world,
            checkpoints_dir / name,
            tokenizer,
            step=step,
            sampler=sampler,
            policy=(model, optimizer),
            critic=(critic, critic_optimizer) if critic is not None else None,
        )

    def validate() -> dict[str, float]:
        """Rank 0 evaluates the validation prompts with the current policy (all ranks hold the
        gathered weights meanwhile under FSDP)."""
        params = SamplingParams(
            n=config.eval.n,
            temperature=config.eval.temperature,
            top_p=config.eval.top_p,
            max_new_tokens=config.data.max_response_length,
        )
        devices = [] if world.device.type == "cpu" else [world.device]
        with world.generation(model), autocast(), torch.random.fork_rng(devices=devices):
            if not world.is_writer:
                return {}
            result = evaluate(engine, tokenizer, val_prompts.rows, params, scorer, show_progress=False)
        metrics = {
            f"val/{source}/{name}": value for source, metrics in result.metrics.items() for name, value in metrics.items()
        }
        return {**metrics, "val/reward_timeouts": float(result.timed_out)}

    logger = MetricsLogger(output_dir, world, resume_step=start_step)
    try:
        skipped_updates = 0
        metrics: dict[str, float] = {}
        progress = progress_bar(
            range(start_step + 1, config.train.steps + 1),
            initial=start_step,
            total=config.train.steps,
            desc="training",
            unit="step",
            disable=not (show_progress and world.is_writer),
        )
        for step in progress:
            step_start = time.perf_counter()
            indices = world.shard_prompts(sampler.next_batch(config.train.batch_size), config.train.mini_batch_size)
            with world.generation(model), autocast():
                rollouts = engine.generate([train_prompts.token_ids[i] for i in indices], rollout_params)
            generation_time = time.perf_counter() - step_start
            rows = [train_prompts.rows[i] for i in indices for _ in range(config.rollout.n)]
            scored = scorer.score(rows, rollouts.response_texts)
            rewards = torch.tensor(scored.scores)
            if config.train.save_rollouts:
                logger.log_rollouts(step, rows, rollouts.response_texts, scored.scores)
            batch = PolicyBatch.from_rollouts(rollouts, rewards, compute_dtype).to(world.device)
            updates_policy = critic is None or step > config.critic.warmup_steps
            first_update_rows = min(len(batch), settings.mini_batch_size * config.rollout.n) if updates_policy else 0
            with autocast():  # the first update's rows get π_old from that update's own forward pass
                fill_rollout_logprobs(
                    model,
                    batch,
                    slice(first_update_rows, None),
                    micro_batch_size=config.train.micro_batch_size,
                    temperature=config.rollout.temperature,
                )
                if "ref_logprobs" in algorithm.needs:
                    with reference_policy() as reference:
                        batch.row_terms["ref_logprobs"] = response_logprobs_no_grad(
                            reference, batch, micro_batch_size=config.train.micro_batch_size, temperature=config.rollout.temperature
                        )
                if critic is not None:
                    batch.row_terms["values"] = response_values_no_grad(
                        critic, batch, micro_batch_size=config.train.micro_batch_size
                    )
            step_inputs = {name: value for name, value in batch.tensors().items() if name != "old_logprobs"}
            batch.row_terms.update(algorithm.prepare_step(step_inputs, sum_over_ranks=world.sum))
            metrics = {}
            if critic is not None:
                metrics.update(update_critic(critic, critic_optimizer, world, batch, algorithm, settings))
            if updates_policy:
                metrics.update(
                    update_policy(
                        model, optimizer, world, batch, algorithm, settings, rows_without_old_logprobs=first_update_rows
                    )
                )
            else:
                metrics.update({"loss": 0.0, "updates/skipped": 0.0, "actor/critic_warmup": 1.0})
            metrics.update({"time/step_s": time.perf_counter() - step_start, "time/generation_s": generation_time})
            if step == start_step + 1:
                metrics.update(sizes)
            metrics = world.reduce_metrics(metrics)
            skipped_updates += int(metrics["updates/skipped"])
            per_row = torch.stack(
                [
                    batch.rewards,
                    batch.response_mask.sum(dim=1),
                    (batch.entropy * batch.response_mask).sum(dim=1),
                    batch.prompt_mask.sum(dim=1).to(batch.rewards.dtype),
                ],
                dim=1,
            )
            rewards_all, lengths_all, entropy_all, prompt_lengths_all = world.gather_rows(per_row.double()).unbind(dim=1)
            metrics.update(rollout_metrics(rewards_all, lengths_all, entropy_all, config.rollout.n))
            timeouts, crashes = world.sum(torch.tensor([scored.timed_out, scored.crashed], dtype=torch.float64)).tolist()
            metrics.update(
                {
                    "reward/timeouts": timeouts,
                    "reward/crashes": crashes,
                    "throughput/tokens_per_s": float(lengths_all.sum() + prompt_lengths_all.sum()) / metrics["time/step_s"],
                }
            )
            if val_prompts is not None and (
                step == config.train.steps or (config.train.eval_every and step % config.train.eval_every == 0)
            ):
                metrics.update(validate())
            logger.log(step, metrics)
            progress.set_postfix(reward=f"{metrics['reward/mean']:.3f}", loss=f"{metrics['loss']:.4f}")
            if config.train.save_every and step % config.train.save_every == 0:
                checkpoint(f"step_{step}", step)
        progress.close()
    finally:
        logger.close()
        scorer.close()
    final = checkpoint("final", config.train.steps)
    return TrainResult(output_dir, final, metrics, skipped_updates, is_writer=world.is_writer)
