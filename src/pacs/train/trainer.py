"""The RLVR loop, one for every algorithm, on Hugging Face `accelerate`.

Each step: draw `train.batch_size` prompts -> sample `rollout.n` responses each -> score them
with the verifier -> recompute the rollout policy's log-probs -> `train.epochs` passes of
optimizer updates over mini-batches of `train.mini_batch_size` prompts -> log, validate,
checkpoint. One process is accelerate's trivial case; a prompt's whole group stays on one rank.
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator
from rich.console import Console
from tqdm.auto import tqdm

from pacs.algos.core import masked_mean, mixed_group_fraction
from pacs.algos.registry import build_algorithm
from pacs.config import Config, ConfigError, dump_config
from pacs.data.loading import load_rows
from pacs.data.prompts import EncodedPrompts, encode_prompts
from pacs.eval.evaluate import evaluate
from pacs.models.loading import load_causal_lm, load_tokenizer, load_value_model
from pacs.rewards import ScoringPool
from pacs.rollout.base import SamplingParams
from pacs.rollout.hf import TransformersEngine
from pacs.train import builtin_models  # noqa: F401  (registers builtin:tiny-arithmetic)
from pacs.train.batch import PolicyBatch, response_logprobs_no_grad, response_values_no_grad
from pacs.train.checkpoint import (
    CRITIC_DIR,
    latest_checkpoint,
    load_trainer_state,
    restore_rng_states,
    rng_states,
    save_checkpoint,
)
from pacs.train.metrics import MetricsLogger
from pacs.train.sampler import PromptSampler
from pacs.train.update import UpdateSettings, update_critic, update_policy



@dataclass
class TrainResult:
    output_dir: Path
    final_checkpoint: Path
    last_metrics: dict[str, float]
    skipped_updates: int


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


def _group_metrics(rewards: torch.Tensor, response_mask: torch.Tensor, group_size: int) -> dict[str, float]:
    lengths = response_mask.sum(dim=1)
    return {
        "reward/mean": float(rewards.mean()),
        "reward/groups_mixed_fraction": mixed_group_fraction(rewards, group_size),
        "response_length/mean": float(lengths.mean()),
        "response_length/max": float(lengths.max()),
    }


def train(config: Config, *, show_progress: bool = True) -> TrainResult:
    """Run `config` to the end (or from its newest checkpoint with `resume=auto`)."""
    output_dir = Path(config.output_dir)
    checkpoints_dir = output_dir / "checkpoints"
    resume_from = latest_checkpoint(checkpoints_dir) if config.resume == "auto" else None
    if config.resume == "never" and latest_checkpoint(checkpoints_dir) is not None:
        raise ConfigError(
            f"{checkpoints_dir} already holds checkpoints; pass resume=auto to continue that run "
            "or choose another output_dir"
        )
    output_dir.mkdir(parents=True, exist_ok=True)
    dump_config(config, output_dir / "config.yaml")
    console = Console(stderr=True, soft_wrap=True)
    seed_everything(config.seed)

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model_source = str(resume_from) if resume_from else config.model.path
    tokenizer = load_tokenizer(model_source)
    model = load_causal_lm(model_source, dtype=config.model.dtype)
    compute_dtype = torch.float64 if config.model.dtype == "float64" else torch.float32

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

    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr, weight_decay=config.train.weight_decay)
    critic = critic_optimizer = None
    if "values" in algorithm.needs:
        critic_source = str(resume_from / CRITIC_DIR) if resume_from else config.critic.path or config.model.path
        critic = load_value_model(critic_source, dtype=config.model.dtype)
        critic_optimizer = torch.optim.AdamW(
            critic.parameters(), lr=config.critic.lr, weight_decay=config.train.weight_decay
        )
    sampler = PromptSampler(len(train_prompts.rows), config.seed)
    start_step = 0
    if resume_from:
        state = load_trainer_state(resume_from)
        optimizer.load_state_dict(state["optimizer"])
        if critic_optimizer is not None:
            critic_optimizer.load_state_dict(state["critic_optimizer"])
        sampler = PromptSampler(**state["sampler"])
        restore_rng_states(state["rng"])
        start_step = state["step"]
        console.print(f"resuming from {resume_from} (step {start_step})")
    model, optimizer = accelerator.prepare(model, optimizer)
    if critic is not None:
        critic, critic_optimizer = accelerator.prepare(critic, critic_optimizer)
    engine = TransformersEngine(
        accelerator.unwrap_model(model), tokenizer, max_sequences_per_call=config.rollout.generation_batch_size
    )
    rollout_params = SamplingParams(
        n=config.rollout.n,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        max_new_tokens=config.data.max_response_length,
    )
    settings = UpdateSettings(
        mini_batch_size=config.train.mini_batch_size,
        micro_batch_size=config.train.micro_batch_size,
        epochs=config.train.epochs,
        grad_clip=config.train.grad_clip,
        temperature=config.rollout.temperature,
    )

    @functools.cache
    def reference_model():
        """The frozen initial policy, loaded only when an algorithm asks for reference log-probs."""
        return load_causal_lm(config.model.path, dtype=config.model.dtype).to(accelerator.device).eval()

    def trainer_state(step: int) -> dict:
        state = {"step": step, "optimizer": optimizer.state_dict(), "sampler": sampler.state(), "rng": rng_states()}
        if critic_optimizer is not None:
            state["critic_optimizer"] = critic_optimizer.state_dict()
        return state

    def checkpoint(name: str, step: int) -> Path:
        return save_checkpoint(
            checkpoints_dir / name,
            accelerator.unwrap_model(model),
            tokenizer,
            trainer_state(step),
            critic=accelerator.unwrap_model(critic) if critic is not None else None,
        )

    def validate() -> dict[str, float]:
        params = SamplingParams(
            n=config.eval.n,
            temperature=config.eval.temperature,
            top_p=config.eval.top_p,
            max_new_tokens=config.data.max_response_length,
        )
        devices = [] if accelerator.device.type == "cpu" else [accelerator.device]
        with torch.random.fork_rng(devices=devices):
            result = evaluate(engine, tokenizer, val_prompts.rows, params, scorer, show_progress=False)
        metrics = {
            f"val/{source}/{name}": value for source, metrics in result.metrics.items() for name, value in metrics.items()
        }
        return {**metrics, "val/reward_timeouts": float(result.timed_out)}

    logger = MetricsLogger(output_dir, resume_step=start_step)
    try:
        skipped_updates = 0
        metrics: dict[str, float] = {}
        progress = tqdm(
            range(start_step + 1, config.train.steps + 1),
            initial=start_step,
            total=config.train.steps,
            desc="training",
            unit="step",
            disable=not show_progress,
        )
        for step in progress:
            step_start = time.perf_counter()
            indices = sampler.next_batch(config.train.batch_size)
            rollouts = engine.generate([train_prompts.token_ids[i] for i in indices], rollout_params)
            generation_time = time.perf_counter() - step_start
            rows = [train_prompts.rows[i] for i in indices for _ in range(config.rollout.n)]
            scored = scorer.score(rows, rollouts.response_texts)
            rewards = torch.tensor(scored.scores)
            batch = PolicyBatch.from_rollouts(rollouts, rewards, compute_dtype).to(accelerator.device)
            batch.old_logprobs, rollout_entropy = response_logprobs_no_grad(
                model,
                batch,
                micro_batch_size=config.train.micro_batch_size,
                temperature=config.rollout.temperature,
                with_entropy=True,
            )
            if "ref_logprobs" in algorithm.needs:
                batch.row_terms["ref_logprobs"] = response_logprobs_no_grad(
                    reference_model(), batch, micro_batch_size=config.train.micro_batch_size, temperature=config.rollout.temperature
                )
            if critic is not None:
                batch.row_terms["values"] = response_values_no_grad(
                    critic, batch, micro_batch_size=config.train.micro_batch_size
                )
            batch.row_terms.update(algorithm.prepare_step(batch.tensors()))
            metrics = {}
            if critic is not None:
                metrics.update(update_critic(critic, critic_optimizer, accelerator, batch, algorithm, settings))
            if step > config.critic.warmup_steps or critic is None:
                metrics.update(update_policy(model, optimizer, accelerator, batch, algorithm, settings))
            else:
                metrics.update({"loss": 0.0, "updates/skipped": 0.0, "actor/critic_warmup": 1.0})
            skipped_updates += int(metrics["updates/skipped"])
            step_time = time.perf_counter() - step_start
            num_tokens = int(batch.prompt_mask.sum() + batch.response_mask.sum())
            metrics.update(_group_metrics(batch.rewards, batch.response_mask, config.rollout.n))
            metrics.update(
                {
                    "actor/entropy": float(masked_mean(rollout_entropy, batch.response_mask).mean()),
                    "reward/timeouts": float(scored.timed_out),
                    "reward/crashes": float(scored.crashed),
                    "time/step_s": step_time,
                    "time/generation_s": generation_time,
                    "throughput/tokens_per_s": num_tokens / step_time,
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
    return TrainResult(output_dir, final, metrics, skipped_updates)
