"""The RLVR loop, one for every algorithm, on one process or many.

Each step: draw `train.batch_size` prompts -> sample `rollout.n` responses each -> score them
with the verifier -> recompute the rollout policy's log-probs (except for the first mini-batch,
whose first update takes them from its own forward pass; `train.old_logprobs_from_first_update`)
-> the algorithm's step terms -> `train.epochs` passes of optimizer
updates over mini-batches of `train.mini_batch_size` prompts -> log, validate, checkpoint.
Launched by torchrun or `accelerate launch`, each process takes its share of every mini-batch
(a prompt's whole group stays on one rank) and `pacs.distributed` says who does
what; one process is the trivial case.
"""

from __future__ import annotations

import contextlib
import functools
import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

import torch
from rich.console import Console

from pacs.algos.base import Algorithm
from pacs.algos.groups import mixed_group_fraction
from pacs.config import Config, ConfigError
from pacs.data.prompts import EncodedPrompts
from pacs.distributed.collectives import (
    barrier,
    gather_objects,
    gather_objects_on_rank0,
    gather_rows,
    run_on_every_rank,
    run_on_rank0,
    slowest_timings,
    sum_over_ranks,
)
from pacs.distributed.generation import unsharded_for_generation
from pacs.distributed.state_dict import parameters_by_name
from pacs.distributed.world import World
from pacs.distributed.wrapping import (
    unwrap,
)
from pacs.eval.evaluate import EvalResult, evaluate
from pacs.models.loading import (
    DTYPES,
)
from pacs.models.lora import (
    language_model,
    require_peft,
)
from pacs.models.precision import Precision
from pacs.outputs import check_run_in_place, disk_faults, free_bytes
from pacs.progress import progress_bar
from pacs.rewards import ScoringPool
from pacs.rewards.pool import BatchScores, ScoringWatch
from pacs.rollout.base import (
    GenerationGroup,
    RolloutEngine,
    Rollouts,
    SamplingParams,
    rank_seed,
)
from pacs.rollout.multiturn import ToolCallingEngine, tool_metrics, with_tools
from pacs.train.async_generator import (
    RolloutPipeline,
    in_flight_to_resume,
    start_pipeline,
)
from pacs.train.batch import PolicyBatch
from pacs.train.checkpointing.folders import (
    FINAL,
    link_checkpoint,
    remove_older_checkpoints,
)
from pacs.train.checkpointing.resume import (
    RunStart,
    claim_for_node_record,
    job_history,
    open_run,
    record_checkpoint,
    records_checkpoints,
)
from pacs.train.checkpointing.state import (
    checkpoint_size_estimate,
    checkpoint_space_warning,
    restore_training_state,
    write_checkpoint,
)
from pacs.train.colocated_engine import (
    build_engine,
    generation_group,
    policy_weights,
    pushes_weights,
    sampler_correction,
    sampler_mismatch,
)
from pacs.train.determinism import use_deterministic_kernels
from pacs.train.dynamic_sampling import Draw, sample_mixed_groups
from pacs.train.loading import (
    NODE_INPUTS_HOW_TO_FIX,
    Critic,
    Policy,
    load_critic,
    load_policy,
    load_reference,
    load_train_and_val_prompts,
    record_rendering,
    seed_everything,
)
from pacs.train.logprobs import (
    fill_rollout_logprobs,
    response_logprobs_no_grad,
    response_values_no_grad,
)
from pacs.train.memory_plan import check_fits_device
from pacs.train.metrics import MetricsLogger
from pacs.train.preflight import check_node_inputs
from pacs.train.sampler import PromptSampler
from pacs.train.throughput import StepWork, step_mfu
from pacs.train.timing import (
    PhaseTimes,
    timed,
)
from pacs.train.update import (
    UpdateSettings,
    scheduled_learning_rate,
    set_learning_rate,
    update_critic,
    update_policy,
)


@dataclass
class TrainResult:
    output_dir: Path
    final_checkpoint: Path
    last_metrics: dict[str, float]
    skipped_updates: int
    is_writer: bool = True
    """False on every rank but 0 of a multi-process run (which reports the same global metrics)."""
    finished_before: bool = False
    """The run had already done its `train.steps`: nothing was trained or written."""


_said_once: set[str] = set()
"""Notes this process has printed, which it does not print again."""


def rollout_metrics(
    rewards: torch.Tensor,
    response_lengths: torch.Tensor,
    entropy_sums: torch.Tensor,
    group_size: int,
    max_response_length: int,
    model_token_counts: torch.Tensor | None = None,
) -> dict[str, float]:
    """What a step's rollouts look like: mean reward, fraction of groups with mixed outcomes,
    response lengths (a tool's output included), the fraction of responses cut at the length
    limit (as long as `max_response_length` or longer: verl's `response_length/clip_ratio`), and
    the rollout policy's entropy averaged over every token the model sampled.

    rewards, response_lengths, entropy_sums: (B,) per response, entropy summed over the model's
    tokens; model_token_counts: (B,) the model's tokens of each response (None: all of them).
    """
    entropy_tokens = response_lengths if model_token_counts is None else model_token_counts
    return {
        "reward/mean": float(rewards.mean()),
        "reward/groups_mixed_fraction": mixed_group_fraction(rewards, group_size),
        "response_length/mean": float(response_lengths.mean()),
        "response_length/max": float(response_lengths.max()),
        "response_length/clip_ratio": float((response_lengths >= max_response_length).double().mean()),
        "actor/entropy": float(entropy_sums.sum() / entropy_tokens.sum().clamp(min=1)),
    }


def train(
    config: Config,
    *,
    show_progress: bool = True,
    allow_changes: bool = False,
    replace: bool = False,
    report: Callable[[TrainResult], object] | None = None,
) -> TrainResult:
    """Run `config` to the end (or from its newest checkpoint with `resume=auto`, or when torchrun
    restarted the job), in this process and every other one the launcher started. A resume with
    settings that change the optimisation is refused unless `allow_changes`; `replace`
    (`--overwrite`) moves a previous run in output_dir aside first, under the same claim of the
    folder as the rest of the start (`pacs.train.checkpointing.resume.open_run`). `report` is
    called with the result on rank 0 while the run still holds its folder's lock, so what it says
    of the folder (the final checkpoint's path) is not moved away before it is said."""
    if config.train.deterministic:
        use_deterministic_kernels()  # before any GPU library computes
    world = World.from_environment(config.train.strategy, timeout_s=config.train.distributed_timeout_s)
    try:
        return run_to_the_end(config, world, show_progress, allow_changes, replace=replace, report=report)
    finally:
        world.close()  # the trainer and its models are out of reach by now (World.close)


def run_to_the_end(
    config: Config,
    world: World,
    show_progress: bool,
    allow_changes: bool = False,
    *,
    replace: bool = False,
    report: Callable[[TrainResult], object] | None = None,
) -> TrainResult:
    """Check the inputs and decide where the run starts (`begin`), set the trainer up and run
    every step; every rank leaves after the last one's barrier. A finished run ends at once.
    `report`: see `train`."""
    start, run_lock = begin(config, world, allow_changes, replace=replace)
    try:
        if start.finished:
            result = finished_result(config, world, start)
        else:
            trainer = Trainer.setup(config, world, start)
            with contextlib.ExitStack() as stack:
                stack.enter_context(
                    contextlib.closing(trainer.engine)
                )  # vLLM's teardown ends the process group: after the barrier
                if trainer.pipeline is not None:
                    stack.enter_context(contextlib.closing(trainer.pipeline))
                result = trainer.run(show_progress=show_progress, run_lock=run_lock)
                barrier(world)  # no rank tears its process group down while another still uses it
        if report is not None and result.is_writer:
            report(result)
        return result
    finally:
        if run_lock is not None:
            run_lock.close()


def begin(config: Config, world: World, allow_changes: bool = False, *, replace: bool = False) -> tuple[RunStart, IO[str] | None]:
    """What every rank checks before anything loads (the batch split, the generation groups, peft
    for LoRA, each node's own inputs), then where the run starts: rank 0's decision (`pacs.train.checkpointing.resume.open_run`),
    told on its console and sent to every rank, with rank 0's run lock (None elsewhere). Each
    other node's first process claims its own output_dir for its record of the checkpoints."""
    world.check_divisible(config.train.batch_size, config.train.mini_batch_size)
    try:
        generation_group(config, world)
        if world.device.type == "cuda":
            check_fits_device(config, world)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if config.model.lora_rank > 0:
        try:
            require_peft()
        except ImportError as error:
            raise ConfigError(str(error)) from None
    # rank 0 checks every input in open_run (before it writes); the other ranks, their own disks' here
    run_on_every_rank(world, lambda: None if world.is_writer else check_node_inputs(config), how_to_fix=NODE_INPUTS_HOW_TO_FIX)
    past = job_history(world, Path(config.output_dir))
    opened: tuple[RunStart, IO[str] | None] | None = None

    def open_on_rank0() -> RunStart:
        nonlocal opened
        opened = open_run(config, past, allow_changes=allow_changes, replace=replace)
        return opened[0]  # the run lock stays with rank 0: a file it holds open, not sent

    start = run_on_rank0(world, open_on_rank0)
    console = Console(stderr=True, soft_wrap=True, quiet=not world.is_writer)
    for note in start.notes:
        console.print(note)
    if not start.finished:
        output_dir = Path(config.output_dir)
        run_on_every_rank(world, lambda: claim_for_node_record(world, output_dir), how_to_fix=NODE_INPUTS_HOW_TO_FIX)
    return start, opened[1] if opened is not None else None


def finished_result(config: Config, world: World, start: RunStart) -> TrainResult:
    """The result of a run that had already finished: its final checkpoint and last metrics."""
    metrics_file = Path(config.output_dir) / "metrics.jsonl"
    lines = metrics_file.read_text().splitlines() if world.is_writer and metrics_file.is_file() else []
    last = {key: value for key, value in json.loads(lines[-1]).items() if key != "step"} if lines else {}
    return TrainResult(Path(config.output_dir), start.checkpoint, last, 0, is_writer=world.is_writer, finished_before=True)


@dataclass(kw_only=True)
class Trainer:
    """What a run builds once (`setup`), and the step that uses it (`step`, `run`)."""

    config: Config
    world: World
    policy: Policy
    critic: Critic | None
    """PPO's critic; None for algorithms without one."""
    reference: torch.nn.Module | None
    """The frozen reference (the KL penalty's, PACS's with a fixed reference) when the algorithm
    needs one and the run has no LoRA (with LoRA it is the policy with its adapters disabled): the
    initial policy, or the policy at its last reset (`reset_reference`)."""
    algorithm: Algorithm
    engine: RolloutEngine
    """What this process generates with: the rollouts (synchronous runs) and validation."""
    pipeline: RolloutPipeline | None
    """With rollout.max_staleness >= 1, this process's generator process and its schedule
    (`pacs.train.async_generator`), which samples the training batches; None otherwise."""
    generation_group: GenerationGroup
    """The ranks that generate together with this one (vLLM's tensor parallelism; alone otherwise)."""
    scorer: ScoringPool
    scoring_watch: ScoringWatch
    train_prompts: EncodedPrompts
    val_prompts: EncodedPrompts | None
    sampler: PromptSampler
    start_step: int
    tracker_runs: dict[str, str]
    """Tracker name -> the run id a resumed checkpoint holds (continued by `MetricsLogger`)."""
    settings: UpdateSettings
    console: Console
    engine_has_policy_weights: bool
    """False while an engine with its own copy of the weights (vLLM) holds others than the
    policy's: at the start, and after every update (with `rollout.vllm.sync_weights`)."""
    writer_host: str
    """The host rank 0 writes checkpoints on (named in other nodes' records)."""
    last_step_checkpoint: Path | None
    """A checkpoint of the state after the last step (`step_N`, N = train.steps), which `final`
    links to instead of writing a second copy."""
    checkpoint_bytes: int = 0
    """About the size of one checkpoint (`checkpoint_size_estimate`), named when a save fills the disk."""

    # ----- built once ----------------------------------------------------------------------------

    @classmethod
    def setup(cls, config: Config, world: World, start: RunStart) -> Trainer:
        """Models, optimizers, prompts, scorer and engine, restored from `start.checkpoint` when the
        run resumes (`begin`: every rank resumes the checkpoint rank 0 chose)."""
        resume_from = start.checkpoint
        group = generation_group(config, world)  # checked in `begin`
        console = Console(stderr=True, soft_wrap=True, quiet=not world.is_writer)
        seed_everything(config.seed)
        algorithm = config.algorithm.build(group_size=config.rollout.n, max_response_length=config.data.max_response_length)
        policy = load_policy(config, world, resume_from, console)
        critic = load_critic(config, world, resume_from) if "values" in algorithm.needs else None
        needs_reference = "ref_logprobs" in algorithm.needs and config.model.lora_rank == 0
        reference = load_reference(config, world, resume_from) if needs_reference else None
        train_prompts, val_prompts = run_on_every_rank(
            world, lambda: load_train_and_val_prompts(config, policy.tokenizer, console), how_to_fix=NODE_INPUTS_HOW_TO_FIX
        )
        if world.is_writer:
            record_rendering(config, policy.tokenizer, train_prompts)
        sampler, start_step, tracker_runs, in_flight = restore_progress(
            config, world, resume_from, policy, critic, len(train_prompts.rows)
        )
        if resume_from:
            console.print(f"resuming from {resume_from} (step {start_step})")
        models = [policy.model, *([critic.model] if critic else []), *([reference] if config.train.reference_reset_every else [])]
        checkpoint_bytes = checkpoint_size_estimate([model for model in models if model is not None])
        if world.is_writer and (
            warning := checkpoint_space_warning(
                config, Path(config.output_dir), checkpoint_bytes, free_bytes(Path(config.output_dir))
            )
        ):
            console.print(f"warning: {warning}")
        engine = with_tools(
            build_engine(config, world, language_model(unwrap(policy.model)), policy.tokenizer), policy.tokenizer, config.rollout
        )
        pipeline = None
        if config.rollout.max_staleness:
            pipeline = start_pipeline(
                config,
                world,
                in_flight,
                next_prompts=lambda: next_prompt_shares(config, world, sampler, [world.rank])[0],
                token_ids=lambda indices: [train_prompts.token_ids[i] for i in indices],
            )
        scorer, scoring_watch = reward_scoring(config)
        return cls(
            config=config,
            world=world,
            policy=policy,
            critic=critic,
            reference=reference,
            algorithm=algorithm,
            engine=engine,
            pipeline=pipeline,
            generation_group=group,
            scorer=scorer,
            scoring_watch=scoring_watch,
            train_prompts=train_prompts,
            val_prompts=val_prompts,
            sampler=sampler,
            start_step=start_step,
            tracker_runs=tracker_runs,
            settings=update_settings(config, world),
            console=console,
            engine_has_policy_weights=not pushes_weights(engine, config),
            writer_host=start.writer_host,
            last_step_checkpoint=resume_from if resume_from and start_step == config.train.steps else None,
            checkpoint_bytes=checkpoint_bytes,
        )

    # ----- the loop ------------------------------------------------------------------------------

    def run(self, *, show_progress: bool = True, run_lock: IO[str] | None = None) -> TrainResult:
        """Every step from `start_step + 1` to `train.steps`: log, validate and checkpoint as the
        config says (a run from its start validates first, as step 0, with `train.eval_at_start`);
        the final checkpoint at the end. Rank 0, which holds the output folder's
        `run_lock`, looks before it writes a step's results whether the folder was moved away
        (`pacs.outputs.check_run_in_place`); when it was, every rank stops with its message."""
        config, world = self.config, self.world
        output_dir = Path(config.output_dir)
        logger = MetricsLogger(output_dir, world, resume_step=self.start_step, config=config, resumed_runs=self.tracker_runs)
        skipped_updates, metrics, checkpoint_time = 0, {}, {}
        note = self.algorithm.startup_note
        if note is not None and note not in _said_once:
            _said_once.add(note)  # once per process: a comparison trains the same algorithm several times
            self.console.print(note)
        try:
            steps = progress_bar(
                range(self.start_step + 1, config.train.steps + 1),
                initial=self.start_step,
                total=config.train.steps,
                desc="training",
                unit="step",
                disable=not (show_progress and world.is_writer),
            )
            if self.start_step == 0 and config.train.eval_at_start and self.val_prompts is not None:
                validation, validation["time/validate_s"] = timed(self.validate)
                run_on_rank0(world, lambda: check_run_in_place(output_dir, run_lock))
                logger.log(0, validation)
            if self.pipeline is not None:
                self.pipeline.begin(self.start_step, self.engine_weights)
            for step in steps:
                metrics = {**self.step(step, logger), **checkpoint_time}
                if self.validates_at(step):
                    validation, metrics["time/validate_s"] = timed(self.validate)
                    metrics.update(validation)
                run_on_rank0(world, lambda: check_run_in_place(output_dir, run_lock))
                logger.log(step, metrics)
                self.watch_scoring(step, metrics, steps)
                skipped_updates += int(metrics["updates/skipped"])
                steps.set_postfix(reward=f"{metrics['reward/mean']:.3f}", loss=f"{metrics['loss']:.4f}")
                checkpoint_time = {}
                if config.train.save_every and step % config.train.save_every == 0:
                    # timed on the next step's line: this one is written first, so a run killed while
                    # saving resumes with every step's line
                    _, checkpoint_time["time/checkpoint_s"] = timed(self.save_step, step, logger.run_ids)
            steps.close()
        finally:
            logger.close()
            self.scorer.close()
        final = self.save_final(logger.run_ids)
        return TrainResult(output_dir, final, metrics, skipped_updates, is_writer=world.is_writer)

    def watch_scoring(self, step: int, metrics: dict[str, float], steps) -> None:
        """Warn (on rank 0, above the progress bar) of a step whose answers mostly got no score,
        and stop the run on every rank (`ScoringWatch`: global counts, so all ranks agree) after
        `reward.stop_after_failing_steps` of them in a row."""
        answers = self.config.train.batch_size * self.config.rollout.n
        warnings = [
            self.scoring_watch.observe(f"step {step}", int(metrics["reward/timeouts"]), int(metrics["reward/crashes"]), answers),
            self.scoring_watch.observe_restarts(f"step {step}", int(metrics["reward/server_restarts"])),
        ]
        for warning in warnings:
            if warning and self.world.is_writer:
                steps.write(warning, file=sys.stderr)

    def step(self, step: int, logger: MetricsLogger) -> dict[str, float]:
        """One step of the algorithm on this rank's share of the step's prompts: rollout → score
        → old log-probs → step terms (reference log-probs, values, advantages) → updates; its
        global metrics, with the time of each phase (`PhaseTimes`)."""
        times = PhaseTimes(self.world.device)
        resets_reference = self.reset_reference(step)
        with times.phase("weight_sync"):
            self.sync_engine_weights()
        sample, sampling_metrics = self.scored_rollouts(step, times)
        sampling_metrics.update(self.tool_use(times))
        rows, rollouts, scored = sample.rows, sample.rollouts, sample.scored
        if self.config.train.save_rollouts:
            logger.log_rollouts(step, rows, rollouts.response_texts, scored.scores)
        if self.config.rollout.tools is not None and self.config.train.traces_per_step:
            logger.log_traces(step, rows, rollouts, scored.scores, self.policy.tokenizer, self.config.train.traces_per_step)
        batch_dtype = Precision(self.config.model.dtype).tensors
        batch = PolicyBatch.from_rollouts(rollouts, torch.tensor(scored.scores), batch_dtype).to(self.world.device)
        updates_policy = self.critic is None or step > self.config.critic.warmup_steps
        first_update_rows = self.rows_from_first_update(len(batch), updates_policy)
        with times.phase("old_logprobs"):
            self.fill_old_logprobs(batch, slice(first_update_rows, None))
        self.fill_step_terms(batch, times, old_logprobs_known=first_update_rows == 0)
        train = self.config.train
        lr = set_learning_rate(self.policy.optimizer, scheduled_learning_rate(train.lr, train.lr_schedule, step, train.steps))
        metrics = {"lr": lr, **sampling_metrics, **self.update(batch, updates_policy, first_update_rows, times)}
        if self.pipeline is not None:
            with times.phase("weight_sync"):
                self.pipeline.advance(step, self.engine_weights)
        if self.config.train.reference_reset_every:
            metrics["reference/reset"] = float(resets_reference)
        metrics.update(self.sampler_metrics(batch))
        metrics.update(slowest_timings(self.world, times.metrics(), by="time/step_s"))
        metrics.update(step_report(self.world, batch, scored, self.config, metrics["time/step_s"]))
        work = self.step_work(metrics["time/step_s"], first_update_rows, updates_policy)
        metrics.update(step_mfu(self.world, batch, work, train.peak_flops))
        if step == self.start_step + 1:
            metrics.update(self.policy.sizes)
        return metrics

    def step_work(self, seconds: float, first_update_rows: int, updates_policy: bool) -> StepWork:
        """What a step of `seconds` did, for `perf/mfu` (`StepWork`): this run's models and passes, the
        old log-probs of its first `first_update_rows` rows given by the first update, the policy
        updated or not (`updates_policy`)."""
        return StepWork(
            seconds=seconds,
            policy_parameters=self.policy.flop_parameters,
            critic_parameters=None if self.critic is None else self.critic.flop_parameters,
            reference_pass="ref_logprobs" in self.algorithm.needs,
            first_update_rows=first_update_rows,
            epochs=self.config.train.epochs,
            updates_policy=updates_policy,
        )

    def tool_use(self, times: PhaseTimes) -> dict[str, float]:
        """With rollout.tools, the step's tool use over every rank (`tool_metrics`), the seconds
        the tool ran counted as the phase "tool" rather than "generate"; {} without tools."""
        if not isinstance(self.engine, ToolCallingEngine):
            return {}
        stats = self.engine.take_stats()
        times.count_inside("tool", stats.tool_seconds, within="generate")
        return tool_metrics(stats, functools.partial(sum_over_ranks, self.world))

    def sampler_metrics(self, batch: PolicyBatch) -> dict[str, float]:
        """With a sampler of its own (vLLM), how far it is from the trainer (`sampler_mismatch`),
        and with `algorithm.rollout_is_cap` what the correction did (`sampler_correction`); the
        trainer's old log-probs are all known after the update, and with them the correction's
        weights (`Algorithm.rollout_is_terms`; step terms only when they were known before)."""
        if "sampler_logprobs" not in batch.row_terms:
            return {}
        sampler_logprobs, old_logprobs, mask = batch.row_terms["sampler_logprobs"], batch.old_logprobs, batch.loss_mask
        metrics = sampler_mismatch(self.world, sampler_logprobs, old_logprobs, mask)
        cap = self.config.algorithm.rollout_is_cap
        if cap is not None:
            weights = batch.row_terms.get("rollout_is_weight")
            if weights is None:
                weights = self.algorithm.rollout_is_terms(batch.tensors())["rollout_is_weight"]
            metrics.update(sampler_correction(self.world, weights, sampler_logprobs, old_logprobs, mask, cap))
        return metrics

    def scored_rollouts(self, step: int, times: PhaseTimes) -> tuple[Draw, dict[str, float]]:
        """The step's rollouts on this rank, scored: from the generator process with
        `rollout.max_staleness` (`take_async_batch`), else one `generate_and_score`, or with `rollout.dynamic_sampling`
        as many as it takes to fill the step with groups of mixed rewards
        (`pacs.train.dynamic_sampling`), and its metrics. The engine sleeps once, after the last
        round (`RolloutEngine.sleep`, timed with "generate"): vLLM's level-2 sleep drops the weights
        pushed for the step, which every round must generate with."""
        if self.pipeline is not None:
            return self.take_async_batch(step, times)
        rollout = self.config.rollout
        draw = functools.partial(self.generate_and_score, times)
        if not rollout.dynamic_sampling:
            sample, metrics = draw(), {}
        else:
            groups = self.config.train.batch_size // self.world.world_size
            sample, metrics = sample_mixed_groups(
                draw, self.world, group_size=rollout.n, groups=groups, max_rounds=rollout.max_sampling_rounds
            )
        with times.phase("generate"):
            self.engine.sleep()
        return sample, metrics

    def generate_and_score(self, times: PhaseTimes) -> Draw:
        """This rank's share of `train.batch_size` fresh prompts, sampled (`generate`) and scored,
        timed as the phases "generate" and "score"."""
        with times.phase("generate"):
            rows, rollouts = self.generate()
        with times.phase("score"):
            scored = self.scorer.score(rows, rollouts.scored_texts)
        return Draw(rows, rollouts, scored)

    def take_async_batch(self, step: int, times: PhaseTimes) -> tuple[Draw, dict[str, float]]:
        """The batch the generator process sampled for `step` (the phase "wait_rollout": how long
        the trainer waited for it), scored ("score"); its staleness (the same on every rank: the
        schedule is global) and the seconds the generator spent on it, beside the step."""
        with times.phase("wait_rollout"):
            generated = self.pipeline.take(step)
        rows = [self.train_prompts.rows[i] for i in generated.prompt_indices for _ in range(self.config.rollout.n)]
        with times.phase("score"):
            scored = self.scorer.score(rows, generated.rollouts.scored_texts)
        staleness = float(step - 1 - generated.version)
        metrics = {
            "rollout/staleness_mean": staleness,
            "rollout/staleness_max": staleness,
            "rollout/generator_s": generated.generate_s,
        }
        return Draw(rows, generated.rollouts, scored), metrics

    def next_prompt_shares(self) -> list[list[int]]:
        """The next `train.batch_size` prompts' indices, as each rank of this generation group
        takes its share (`next_prompt_shares`), in the group's order."""
        return next_prompt_shares(self.config, self.world, self.sampler, self.generation_group.ranks)

    def generate(self) -> tuple[list[dict], Rollouts]:
        """This rank's share of the step's prompts, each row repeated `rollout.n` times, and
        their sampled responses. The engine generates for its generation group's prompts (this
        rank's alone without tensor parallelism); it stays awake (`scored_rollouts` puts it to sleep
        after the step's last round)."""
        config, group = self.config, self.generation_group
        shares = self.next_prompt_shares()
        indices = shares[group.member]
        params = SamplingParams(
            n=config.rollout.n,
            temperature=config.rollout.temperature,
            top_p=config.rollout.top_p,
            max_new_tokens=config.data.max_response_length,
            return_logprobs=self.engine.holds_own_weights,
        )
        with self.generation():
            group_rollouts = self.engine.generate([self.train_prompts.token_ids[i] for share in shares for i in share], params)
        rows = [self.train_prompts.rows[i] for i in indices for _ in range(config.rollout.n)]
        return rows, group.own_rows(group_rollouts, len(rows))

    def sync_engine_weights(self) -> None:
        """Push the policy's weights into an engine that holds its own copy (vLLM) if they
        changed since it last got them or it dropped them asleep
        (`pacs.train.colocated_engine.policy_weights`)."""
        if not self.engine_has_policy_weights or not self.engine.has_weights:
            self.engine.load_weights(self.engine_weights())
            self.engine_has_policy_weights = True

    def engine_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights as an engine with its own copy takes them, in its dtype (`policy_weights`)."""
        return policy_weights(self.policy.model, DTYPES[Precision(self.config.model.dtype).engine])

    @contextlib.contextmanager
    def generation(self) -> Iterator[None]:
        """The context an engine generates in: for transformers' generate on the policy itself,
        the whole policy gathered (`unsharded_for_generation`) under the run's autocast; nothing
        for vLLM, which holds its own weights in the engine's dtype and runs its own kernels
        (torch's autocast, a thread-local mode, would otherwise reach any torch op vLLM runs in
        this thread)."""
        if self.engine.holds_own_weights:
            yield
            return
        with unsharded_for_generation(self.policy.model), self.settings.autocast():
            yield

    def rows_from_first_update(self, batch_rows: int, updates_policy: bool) -> int:
        """How many of the step's first rows take their old log-probs from the first update's own
        forward pass (`pacs.train.update.FirstUpdateOldLogprobs`): one update's, when the policy
        updates this step, `train.old_logprobs_from_first_update` is on and the algorithm can wait
        for them (`Algorithm.first_update_may_supply_old_logprobs`); else 0, the plain path."""
        shortcut = self.config.train.old_logprobs_from_first_update and self.algorithm.first_update_may_supply_old_logprobs
        return min(batch_rows, self.settings.mini_batch_size * self.config.rollout.n) if updates_policy and shortcut else 0

    def fill_old_logprobs(self, batch: PolicyBatch, rows: slice) -> None:
        """The rollout policy's log-probs and entropy at `rows` of `batch` (no gradient)."""
        with self.settings.autocast():
            fill_rollout_logprobs(
                self.policy.model,
                batch,
                rows,
                temperature=self.config.rollout.temperature,
                **self.no_grad_micro_batches(),
            )

    def no_grad_micro_batches(self) -> dict[str, Any]:
        """How the no-grad passes (old log-probs, the reference's, the critic's values) split and
        run a batch: as the updates do (`update_settings`)."""
        train = self.config.train
        return {
            "micro_batch_size": train.micro_batch_size,
            "micro_batch_tokens": train.micro_batch_tokens,
            "world": self.world,
            "padding_free": train.padding_free,
        }

    def fill_step_terms(self, batch: PolicyBatch, times: PhaseTimes, *, old_logprobs_known: bool) -> None:
        """The reference's log-probs and the critic's values the algorithm needs (the phases "ref"
        and "values"), then the algorithm's step terms (advantages), from every row's old log-probs
        if `old_logprobs_known` (else the first update gives some, and the algorithm sees none)."""
        micro_batches = self.no_grad_micro_batches()
        with self.settings.autocast():
            if "ref_logprobs" in self.algorithm.needs:
                with times.phase("ref"), self.reference_policy() as reference:
                    batch.row_terms["ref_logprobs"] = response_logprobs_no_grad(
                        reference, batch, temperature=self.config.rollout.temperature, **micro_batches
                    )
            if self.critic is not None:
                with times.phase("values"):
                    batch.row_terms["values"] = response_values_no_grad(self.critic.model, batch, **micro_batches)
        step_inputs = batch.tensors()
        if not old_logprobs_known:
            del step_inputs["old_logprobs"]
        batch.row_terms.update(
            self.algorithm.prepare_step(step_inputs, sum_over_ranks=functools.partial(sum_over_ranks, self.world))
        )

    def update(self, batch: PolicyBatch, updates_policy: bool, first_update_rows: int, times: PhaseTimes) -> dict[str, float]:
        """The critic's updates (PPO; the phase "update_critic"), then the policy's ("update_actor";
        none while the critic warms up)."""
        metrics: dict[str, float] = {}
        if self.critic is not None:
            critic_settings = replace(self.settings, grad_clip=self.config.critic.grad_clip or self.config.train.grad_clip)
            with times.phase("update_critic"):
                metrics.update(
                    update_critic(self.critic.model, self.critic.optimizer, self.world, batch, self.algorithm, critic_settings)
                )
        if not updates_policy:
            return {**metrics, "loss": 0.0, "updates/skipped": 0.0, "actor/critic_warmup": 1.0}
        policy = self.policy
        with times.phase("update_actor"):
            metrics.update(
                update_policy(
                    policy.model,
                    policy.optimizer,
                    self.world,
                    batch,
                    self.algorithm,
                    self.settings,
                    rows_without_old_logprobs=first_update_rows,
                )
            )
        self.engine_has_policy_weights = not pushes_weights(self.engine, self.config)
        return metrics

    def reset_reference(self, step: int) -> bool:
        """The hard reset of the PACS paper's text and ProRL: before every step s > 1 with s − 1 a
        multiple of `train.reference_reset_every`, the reference model takes the policy's current
        weights and (`train.reference_reset_optimizer`) the policy optimizer's state is cleared, so
        AdamW starts its moments and step count afresh. Whether it reset."""
        every = self.config.train.reference_reset_every
        if not every or step == 1 or (step - 1) % every:
            return False
        reference = dict(parameters_by_name(self.reference))
        with torch.no_grad():
            for name, parameter in parameters_by_name(self.policy.model):
                reference[name].copy_(parameter)
        if self.config.train.reference_reset_optimizer:
            self.policy.optimizer.state.clear()
        return True

    @contextlib.contextmanager
    def reference_policy(self) -> Iterator[torch.nn.Module]:
        """The frozen reference policy to compute reference log-probs with: with LoRA, the policy
        itself with its adapters disabled (run through its wrapper, so FSDP gathers its shards);
        otherwise the loaded reference model."""
        if self.reference is not None:
            yield self.reference
            return
        with unwrap(self.policy.model).disable_adapter():
            yield self.policy.model

    # ----- validation and checkpoints ----------------------------------------------------------

    def validates_at(self, step: int) -> bool:
        every = self.config.train.eval_every
        return self.val_prompts is not None and (step == self.config.train.steps or bool(every and step % every == 0))

    def validate(self) -> dict[str, float]:
        """The validation prompts evaluated with the current policy, each generation group (each
        rank without tensor parallelism) generating for its share of the problems, pass@k
        computed over all of them (the same on every rank)."""
        config, world, group = self.config, self.world, self.generation_group
        params = SamplingParams(
            n=config.eval.n,
            temperature=config.eval.temperature,
            top_p=config.eval.top_p,
            max_new_tokens=config.data.max_response_length,
        )
        devices = [] if world.device.type == "cpu" else [world.device]
        self.sync_engine_weights()
        with self.generation(), torch.random.fork_rng(devices=devices):
            share = evaluate(
                self.engine,
                self.policy.tokenizer,
                self.val_prompts.rows,
                params,
                self.scorer,
                problem_share=(group.index, group.count),
                sequences_per_call=config.rollout.generation_batch_size,
                show_progress=False,
            )
        if isinstance(self.engine, ToolCallingEngine):
            self.engine.take_stats()  # validation's tool use is not the next step's
        shares = gather_objects(world, share.without_records() if group.is_leader else None)
        result = EvalResult.merge([share for share in shares if share is not None])
        metrics = {f"val/{source}/{name}": value for source, metrics in result.metrics.items() for name, value in metrics.items()}
        return {**metrics, "val/reward_timeouts": float(result.timed_out)}

    def save_step(self, step: int, tracker_runs: dict[str, str]) -> None:
        """`checkpoints/step_N` (`save`), then, with `train.keep_checkpoints`, the older step
        checkpoints beyond that many removed."""
        checkpoint = self.save(f"step_{step}", step, tracker_runs)
        keep = self.config.train.keep_checkpoints
        if keep and self.world.is_writer:
            remove_older_checkpoints(checkpoint.parent, keep)
        if step == self.config.train.steps:
            self.last_step_checkpoint = checkpoint

    def save_final(self, tracker_runs: dict[str, str]) -> Path:
        """`checkpoints/final`: links to the last step's checkpoint when there is one (the same
        state: nothing draws between them), else written (`save`)."""
        if self.last_step_checkpoint is None:
            return self.save(FINAL, self.config.train.steps, tracker_runs)
        final = self.last_step_checkpoint.parent / FINAL
        if self.world.is_writer:
            with disk_faults(
                final.parent, f"checkpoint {FINAL} (links, or a copy where the disk has none)", self.checkpoint_bytes
            ):
                link_checkpoint(self.last_step_checkpoint, final)
        barrier(self.world)
        self.record(FINAL, self.config.train.steps)
        return final

    def save(self, name: str, step: int, tracker_runs: dict[str, str]) -> Path:
        """`checkpoints/<name>`: every rank gathers its part, rank 0 writes (with the trackers' run
        ids, which `resume=auto` continues, and every rank's batches in flight with
        `rollout.max_staleness`); the other nodes record it (`record`)."""
        in_flight = gather_objects_on_rank0(self.world, self.pipeline.state(step)) if self.pipeline is not None else None
        directory = Path(self.config.output_dir) / "checkpoints" / name
        with disk_faults(directory.parent, f"checkpoint {name}", self.checkpoint_bytes):  # a failed save leaves no part
            checkpoint = write_checkpoint(
                self.world,
                directory,
                self.policy.tokenizer,
                step=step,
                sampler=self.sampler,
                rollouts_in_flight=in_flight,
                policy=(self.policy.model, self.policy.optimizer),
                critic=self.critic and self.critic.trained(),
                tracker_runs=tracker_runs,
                reference=self.reference if self.config.train.reference_reset_every else None,
            )
        self.record(name, step)
        return checkpoint

    def record(self, name: str, step: int) -> None:
        """On each other node's first process, its record that rank 0 put `name` in place
        (`pacs.train.checkpointing.resume.record_checkpoint`)."""
        if records_checkpoints(self.world):
            record_checkpoint(Path(self.config.output_dir), name, step, self.writer_host)


def reward_scoring(config: Config) -> tuple[ScoringPool, ScoringWatch]:
    """The pool that scores responses with `reward.function`, and the watch that stops a run whose
    scoring keeps failing (`reward.stop_after_failing_steps`)."""
    scorer = ScoringPool(
        config.reward.function,
        num_workers=config.reward.num_workers,
        timeout_s=config.reward.timeout_s,
        memory_limit_mib=config.reward.memory_limit_mib,
    )
    scoring_watch = ScoringWatch(
        scorer.function_name,
        remedy=f"reward.timeout_s={config.reward.timeout_s:g}, reward.memory_limit_mib={config.reward.memory_limit_mib}",
        stop_after=config.reward.stop_after_failing_steps,
        stop_option="reward.stop_after_failing_steps",
        max_server_restarts=config.reward.max_server_restarts,
    )
    return scorer, scoring_watch


def update_settings(config: Config, world: World) -> UpdateSettings:
    """How this process updates: its share of each mini-batch, and the run's micro-batch, epochs,
    clipping, temperature, precision and packing."""
    return UpdateSettings(
        mini_batch_size=config.train.mini_batch_size // world.world_size,
        micro_batch_size=config.train.micro_batch_size,
        epochs=config.train.epochs,
        grad_clip=config.train.grad_clip,
        temperature=config.rollout.temperature,
        autocast=Precision(config.model.dtype).autocast(world.device),
        padding_free=config.train.padding_free,
        micro_batch_tokens=config.train.micro_batch_tokens,
    )


def next_prompt_shares(config: Config, world: World, sampler: PromptSampler, ranks: list[int]) -> list[list[int]]:
    """The next `train.batch_size` prompts' indices drawn by `sampler` (the same on every rank),
    cut into each of `ranks`' shares (`World.shard_prompts`), in the order of `ranks`."""
    prompts = sampler.next_batch(config.train.batch_size)
    return [world.shard_prompts(prompts, config.train.mini_batch_size, rank=rank) for rank in ranks]


def restore_progress(
    config: Config,
    world: World,
    resume_from: Path | None,
    policy: Policy,
    critic: Critic | None,
    num_prompts: int,
) -> tuple[PromptSampler, int, dict[str, str], dict | None]:
    """The prompt sampler, the last step done, the tracker runs to continue and this rank's
    batches in flight (`RolloutPipeline.state`; None without): from the checkpoint (with the
    optimizers' and every rank's random states), or fresh (each rank > 0 seeded apart, so ranks
    sample apart)."""
    if not resume_from:
        if world.rank > 0:
            torch.manual_seed(rank_seed(config.seed, world.rank))
        return PromptSampler(num_prompts, config.seed), 0, {}, None
    state = restore_training_state(world, resume_from, (policy.model, policy.optimizer), critic and critic.trained())
    in_flight = in_flight_to_resume(state.get("rollouts_in_flight"), world, config.rollout.max_staleness)
    return PromptSampler(**state["sampler"]), state["step"], state["trackers"], in_flight


def step_report(world: World, batch: PolicyBatch, scored: BatchScores, config: Config, step_seconds: float) -> dict[str, float]:
    """The step's rollouts over every rank (`rollout_metrics`), the scorer's timeouts, crashes and
    server restarts, and tokens per second."""
    per_row = torch.stack(
        [
            batch.rewards,
            batch.response_mask.sum(dim=1),
            (batch.entropy * batch.loss_mask).sum(dim=1),
            batch.prompt_mask.sum(dim=1).to(batch.rewards.dtype),
            batch.loss_mask.sum(dim=1),
        ],
        dim=1,
    )
    rewards, lengths, entropy, prompt_lengths, model_tokens = gather_rows(world, per_row.double()).unbind(dim=1)
    counts = torch.tensor([scored.timed_out, scored.crashed, scored.server_restarts], dtype=torch.float64)
    timeouts, crashes, server_restarts = sum_over_ranks(world, counts).tolist()
    return {
        **rollout_metrics(rewards, lengths, entropy, config.rollout.n, config.data.max_response_length, model_tokens),
        "reward/timeouts": timeouts,
        "reward/crashes": crashes,
        "reward/server_restarts": server_restarts,
        "throughput/tokens_per_s": float(lengths.sum() + prompt_lengths.sum()) / step_seconds,
    }
