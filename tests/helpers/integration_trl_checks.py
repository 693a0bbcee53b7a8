"""The TRL integration's checks, run in the TRL venv (.peer-venvs/trl) by tests/integrations/test_integration_trl.py,
which asserts on the JSON this writes: `python integration_trl_checks.py MODEL_DIR OUT_JSON`.

- exact: one optimizer step of `PACSTrainer` on 2 prompts x 4 completions, split by TRL into 2
  shuffled micro-batches of 4 (gradient_accumulation_steps = steps_per_generation = 2), against
  `pacs.algos.pacs_loss` on the same 8 rows held whole, at the same parameters: the gradients TRL
  accumulated (read before the optimizer step) and the loss.
- sampler_correction: the same step with TRL's vLLM mismatch correction on (sequence_mask, clip
  [0.5, 3]) and its off-policy mask. vLLM is not installable beside TRL on this CPU, so the sampler is
  a `rollout_func` (TRL's hook for custom generation) that samples with the model and reports log-probs
  shifted by a known amount per completion, with TRL's vLLM flags turned on after construction: TRL's
  own code computes the ratios; the gradient must be pacs_loss's per-completion gradient times each
  completion's weight.
- unscored_rewards: the same step with reward functions that return None (TRL's "no score"),
  against pacs_loss on each prompt's scored completions.
- checkpoints: 3 steps with save_steps=1 (checkpoint-1..3), then a new trainer resumed from
  checkpoint-2 runs step 3: the weights it ends with against the first run's.
- two_processes: the exact step on 2 processes (`accelerate launch --multi_gpu --num_processes 2`,
  which on a CPU runs torch.distributed's gloo), 3 prompts x 4 completions in micro-batches of 3, so
  a prompt's completions are split across the processes: both processes' gradients against
  pacs_loss on the 12 rows of both.
- train: 16 steps of 16 prompts x 8 completions on builtin:arithmetic prompts from the warm-started
  tiny model, rewarded for answers that begin with an odd digit (`odd_first_digit_reward`): the
  logged rewards and losses, and the probability that the model's answer begins with an odd digit
  on 64 of the training prompts before and after (`odd_first_digit_probability`, read exactly from
  the next-character distribution after `\\boxed{`, not sampled). A reward this easy to earn moves
  that probability far beyond what sampling varies; correctness would not: the log-probability of
  the correct answers moved by -0.12 to +0.15 nats over 16 steps on warm models built on different
  machines, since every machine builds its own.
- refusals: the messages of the errors `PACSConfig` raises for settings it cannot compute exactly.
- baselines: pacs's Dr. GRPO, DAPO, GSPO and CISPO against TRL's own loss code
  (tests/helpers/baselines_trl_checks.py).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from types import SimpleNamespace

import baselines_trl_checks
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback

from pacs.algos import pacs_loss
from pacs.data.loading import load_rows
from pacs.integrations.trl import PACSConfig, PACSTrainer

TASK = "builtin:arithmetic?max_operand=19"
GROUP_SIZE, BETA = 4, 2.0


def arithmetic_dataset(size: int) -> Dataset:
    rows = load_rows(TASK, default_split="train")[:size]
    return Dataset.from_list([{"prompt": row["prompt"], "ground_truth": row["reward_model"]["ground_truth"]} for row in rows])


ODD_DIGITS = "13579"
ANSWER_OPENING = "\\boxed{"
ODD_ANSWER = re.compile(re.escape(ANSWER_OPENING) + f"[{ODD_DIGITS}]")


def odd_first_digit_reward(completions, **_) -> list[float]:
    """1.0 for a completion whose boxed answer begins with an odd digit: about half of the warm
    model's answers, on every prompt, so every step carries signal whatever it samples."""
    return [float(bool(ODD_ANSWER.match(completion[-1]["content"]))) for completion in completions]


def alternating_reward(completions, **_) -> list[float]:
    """1, 0, 1, 0, ... in generation order, where a group's completions are adjacent: every group
    gets both outcomes whatever the model samples (a group of one outcome has no PACS gradient)."""
    return [float(index % 2 == 0) for index in range(len(completions))]


def config(output_dir: str, **overrides) -> PACSConfig:
    settings = dict(
        output_dir=output_dir, use_cpu=True, bf16=False, fp16=False, seed=0, temperature=1.0, top_p=1.0, top_k=0,
        max_completion_length=12, beta=0.0, learning_rate=1e-4, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, optim="adamw_torch", gradient_checkpointing=False, logging_steps=1, eval_strategy="no",
        save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )  # fmt: skip
    return PACSConfig(**{**settings, **overrides})


class Recorder(TrainerCallback):
    """The gradients just before the first optimizer step, and the logged metrics."""

    def __init__(self, model):
        self.model, self.gradients, self.logs = model, None, []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.gradients is None:
            self.gradients = {name: p.grad.detach().clone() for name, p in self.model.named_parameters() if p.grad is not None}

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append({**(logs or {}), "global_step": state.global_step})


class RecordingTrainer(PACSTrainer):
    """PACSTrainer that keeps its generation batch in group order, with each row's index in the
    generation batch of every process (TRL shuffles it with the rows, so the micro-batches' rows are
    known) and each row's reward as TRL sums its functions (None: NaN, left out by nansum)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches, self.micro_batch_rows = [], []

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        local_rows = output["completion_ids"].shape[0]
        local = slice(self.accelerator.process_index * local_rows, (self.accelerator.process_index + 1) * local_rows)
        output["row"] = torch.arange(local.start, local.stop)
        rewards_per_func = self._rewards_per_func[local]
        rewards = (rewards_per_func * self.reward_weights.unsqueeze(0)).nansum(dim=1)
        self.batches.append({**output, "rewards": rewards, "scored": ~rewards_per_func.isnan().all(dim=1)})
        return output

    def _compute_loss(self, model, inputs):
        self.micro_batch_rows.append(inputs["row"].tolist())
        return super()._compute_loss(model, inputs)


def completion_logprobs(model, batch: dict) -> torch.Tensor:
    """(B, T) log-probs of the batch's completion tokens under the model, with gradient."""
    completion_ids = batch["completion_ids"]
    input_ids = torch.cat([batch["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -completion_ids.shape[1] - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def reference(model, logprobs, mask, rewards, groups, weights=None) -> tuple[float, dict[str, torch.Tensor]]:
    """pacs.algos.pacs_loss at the model's parameters, each of `groups` (lists of rows) held whole and
    the loss a mean over all their rows: its value, and the gradients of the loss or, with per-row
    `weights` ρ, of Σ_k ρ_k · (row k's part of it) (the sampler correction's definition)."""
    rows = sum(len(group) for group in groups)
    loss = sum(
        pacs_loss(logprobs[group], logprobs[group].detach(), mask[group], rewards[group], len(group), beta=BETA) * len(group)
        for group in groups
    ) / rows  # fmt: skip
    model.zero_grad()
    if weights is None:
        loss.backward()
    else:
        (per_token,) = torch.autograd.grad(loss, logprobs, retain_graph=True)
        (weights.unsqueeze(-1) * per_token * logprobs).sum().backward()
    return loss.item(), {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def consecutive_groups(num_rows: int) -> list[list[int]]:
    return [list(range(start, start + GROUP_SIZE)) for start in range(0, num_rows, GROUP_SIZE)]


def compared(recorded: dict[str, torch.Tensor], gradients: dict[str, torch.Tensor]) -> dict:
    return {
        "max_abs_grad_diff": max((recorded[name] - gradient).abs().max().item() for name, gradient in gradients.items()),
        "max_abs_grad": max(gradient.abs().max().item() for gradient in gradients.values()),
        "gradient_names": sorted(gradients) == sorted(recorded),
    }


def one_step(model_dir: str, scratch: str, reward_funcs, rollout_func=None, **overrides):
    """One optimizer step of RecordingTrainer on 2 prompts x GROUP_SIZE completions in float64 (2
    micro-batches; `overrides` of the config): the trainer, its Recorder, and the parameters before the step."""
    torch.manual_seed(0)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    settings = dict(
        max_steps=1, per_device_train_batch_size=GROUP_SIZE, gradient_accumulation_steps=2, num_generations=GROUP_SIZE,
        pacs_beta=BETA, max_grad_norm=0.0,
    )  # fmt: skip
    recorder = Recorder(model)
    trainer = RecordingTrainer(
        model=model, reward_funcs=reward_funcs, args=config(scratch, **{**settings, **overrides}),
        train_dataset=arithmetic_dataset(8), processing_class=tokenizer, callbacks=[recorder], rollout_func=rollout_func,
    )  # fmt: skip
    return trainer, recorder, {name: p.detach().clone() for name, p in model.named_parameters()}


def restored(model, parameters: dict[str, torch.Tensor]):
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(parameters[name])
    return model


def exact_check(model_dir: str, scratch: str) -> dict:
    trainer, recorder, before = one_step(model_dir, scratch, alternating_reward)
    trainer.train()
    [batch] = trainer.batches
    trained = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    model = restored(trainer.model, before)
    rows = len(batch["rewards"])
    loss, gradients = reference(
        model, completion_logprobs(model, batch), batch["completion_mask"], batch["rewards"], consecutive_groups(rows)
    )
    groups = [set(group) for group in consecutive_groups(rows)]
    return {
        "micro_batch_rows": trainer.micro_batch_rows,
        "groups_split": sum(1 for g in groups if not any(g <= set(rows) for rows in trainer.micro_batch_rows)),
        "rewards": batch["rewards"].tolist(),
        **compared(recorder.gradients, gradients),
        "trl_loss": [log["loss"] for log in recorder.logs if "loss" in log][0],
        "reference_loss": loss,
        "parameters_moved": any(not torch.equal(trained[n], before[n]) for n in before),
    }


SAMPLER_SHIFTS = [0.02, 0.2, -0.5, -0.03]
"""Per completion (in generation order, cycled), what the stand-in sampler adds to each token's
log-prob: the sequence ratio π_old/μ is exp(−T·shift) and the mean sampler-vs-trainer KL is the
shift, so the 2nd (reward 0) is masked by the off-policy mask and, when long, by the ratio's lower
bound, the 3rd (reward 1) by the ratio's upper bound when longer than 2 tokens."""
IS_CLIP, OFF_POLICY_THRESHOLD = (0.5, 3.0), 0.1


def shifted_sampler(prompts, trainer) -> dict:
    """A `rollout_func` standing in for vLLM: samples each completion with the model (temperature 1,
    at most 12 tokens) and reports its tokens' log-probs under the model plus SAMPLER_SHIFTS."""
    tokenizer, model = trainer.processing_class, trainer.model
    prompt_ids, completion_ids, logprobs = [], [], []
    for index, prompt in enumerate(prompts):
        ids = tokenizer(
            tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True), add_special_tokens=False
        )["input_ids"]
        with torch.no_grad():
            sampled = model.generate(
                torch.tensor([ids]), do_sample=True, max_new_tokens=12, temperature=1.0, top_k=0, top_p=1.0,
                pad_token_id=tokenizer.pad_token_id,
            )[0, len(ids) :].tolist()  # fmt: skip
            completion = sampled[: sampled.index(tokenizer.eos_token_id) + 1] if tokenizer.eos_token_id in sampled else sampled
            token_logprobs = torch.log_softmax(model(torch.tensor([ids + completion])).logits[0, len(ids) - 1 : -1], dim=-1)
            token_logprobs = token_logprobs.gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)
        prompt_ids.append(ids)
        completion_ids.append(completion)
        logprobs.append((token_logprobs + SAMPLER_SHIFTS[index % len(SAMPLER_SHIFTS)]).tolist())
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}


def expected_sampler_weights(batch: dict) -> torch.Tensor:
    """(B,) ρ_k as TRL's sequence_mask mode defines it (exp(Σ_t m (old − sampler)), 0 outside
    IS_CLIP) times its off-policy mask (kept if the advantage is ≥ 0 — reward 1 in these mixed groups —
    or the mean KL ≤ OFF_POLICY_THRESHOLD), from the logged log-probs."""
    mask = batch["completion_mask"].double()
    log_ratio = (batch["old_per_token_logps"] - batch["sampling_per_token_logps"]) * mask
    ratio = log_ratio.sum(dim=-1).exp()
    weights = torch.where((ratio >= IS_CLIP[0]) & (ratio <= IS_CLIP[1]), ratio, torch.zeros_like(ratio))
    mean_kl = -log_ratio.sum(dim=-1) / mask.sum(dim=-1)
    return weights * ((batch["rewards"] == 1) | (mean_kl <= OFF_POLICY_THRESHOLD)).double()


def sampler_correction_check(model_dir: str, scratch: str) -> dict:
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # rollout_func's "experimental" warning
    trainer, recorder, before = one_step(
        model_dir, scratch, alternating_reward, rollout_func=shifted_sampler, off_policy_mask_threshold=OFF_POLICY_THRESHOLD
    )
    # TRL's vLLM path, minus vLLM: its flags on, weight sync a no-op (the sampler is the model itself).
    trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer.vllm_importance_sampling_mode = "sequence_mask"
    trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max = IS_CLIP
    trainer.vllm_generation, trainer._last_loaded_step = SimpleNamespace(sync_weights=lambda: None), -1
    trainer.train()
    [batch] = trainer.batches
    weights = expected_sampler_weights(batch)
    model = restored(trainer.model, before)
    _, gradients = reference(
        model, completion_logprobs(model, batch), batch["completion_mask"], batch["rewards"],
        consecutive_groups(len(weights)), weights,
    )  # fmt: skip
    logs = [log for log in recorder.logs if "sampling/importance_sampling_ratio/mean" in log]
    return {"weights": weights.tolist(), "trl_logged_ratio": bool(logs), **compared(recorder.gradients, gradients)}


def reward_with_gaps(completions, **_) -> list[float | None]:
    """alternating_reward, but None (no score) for the 2nd completion of each prompt (rows 1 and 5)."""
    return [None if index % 4 == 1 else float(index % 2 == 0) for index in range(len(completions))]


def bonus_for_the_sixth(completions, **_) -> list[float | None]:
    """None everywhere but the 6th completion, which it scores 0.25 (TRL sums with nansum)."""
    return [0.25 if index == 5 else None for index in range(len(completions))]


def unscored_rewards_check(model_dir: str, scratch: str) -> dict:
    """Completions 2 and 6 of the 8: the first no function scores (left out of its prompt's group),
    the second one function scores (its None counts as 0): groups of 3 and 4 rows."""
    trainer, recorder, before = one_step(model_dir, scratch, [reward_with_gaps, bonus_for_the_sixth])
    trainer.train()
    [batch] = trainer.batches
    model = restored(trainer.model, before)
    scored = batch["scored"].tolist()
    groups = [[row for row in group if scored[row]] for group in consecutive_groups(len(scored))]
    loss, gradients = reference(model, completion_logprobs(model, batch), batch["completion_mask"], batch["rewards"], groups)
    return {
        "rewards": [reward if keep else None for reward, keep in zip(batch["rewards"].tolist(), scored)],
        "group_sizes": [len(group) for group in groups],
        "trl_loss": [log["loss"] for log in recorder.logs if "loss" in log][0],
        "reference_loss": loss,
        **compared(recorder.gradients, gradients),
    }


def checkpoint_check(model_dir: str, scratch: str) -> dict:
    """3 steps saving every step, then a new trainer resumed from checkpoint-2 (step 3 again)."""

    def run(output_dir: Path, resume_from: Path | None = None) -> tuple[PACSTrainer, Recorder]:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        args = config(
            str(output_dir), max_steps=3, save_strategy="steps", save_steps=1, per_device_train_batch_size=GROUP_SIZE,
            gradient_accumulation_steps=2, num_generations=GROUP_SIZE, pacs_beta=BETA,
        )  # fmt: skip
        recorder = Recorder(model)
        trainer = PACSTrainer(
            model=model, reward_funcs=alternating_reward, args=args, train_dataset=arithmetic_dataset(16),
            processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir), callbacks=[recorder],
        )  # fmt: skip
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
        return trainer, recorder

    first, _ = run(Path(scratch) / "first")
    first.save_model(str(Path(scratch) / "saved"))
    resumed, recorder = run(Path(scratch) / "resumed", resume_from=Path(scratch) / "first" / "checkpoint-2")
    trained = dict(first.model.named_parameters())
    saved_args = torch.load(Path(scratch) / "first" / "checkpoint-1" / "training_args.bin", weights_only=False)
    return {
        "checkpoints": sorted(path.name for path in (Path(scratch) / "first").glob("checkpoint-*")),
        "saved_model": (Path(scratch) / "saved" / "model.safetensors").exists(),
        "saved_args_class": type(saved_args).__module__ + "." + type(saved_args).__qualname__,
        "resumed_steps": [log["global_step"] for log in recorder.logs if "loss" in log],
        "resumed_global_step": resumed.state.global_step,
        "max_abs_param_diff": max((p - trained[name]).abs().max().item() for name, p in resumed.model.named_parameters()),
        "parameters_moved_in_step_3": not all(
            torch.equal(p, restored_value)
            for (_, p), restored_value in zip(
                resumed.model.named_parameters(), checkpoint_parameters(Path(scratch) / "first" / "checkpoint-2")
            )
        ),
    }


def checkpoint_parameters(checkpoint: Path) -> list[torch.Tensor]:
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    return [p.detach() for _, p in model.named_parameters()]


def two_process_check(model_dir: str, scratch: str) -> dict:
    """The exact step on 2 processes, launched as TRL users launch it: each writes its batch and its
    (data-parallel averaged) gradients; they are compared here with pacs_loss on both batches' rows."""
    out = Path(scratch) / "two-processes"
    out.mkdir()
    launcher = Path(sys.executable).parent / "accelerate"
    command = [
        str(launcher), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", __file__, "--worker", model_dir, str(out),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    ranks = [torch.load(out / f"rank{rank}.pt", weights_only=False) for rank in range(2)]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    logprobs, masks, rewards, rows = [], [], [], []
    for rank in ranks:
        logprobs.append(completion_logprobs(model, rank["batch"]))
        masks.append(rank["batch"]["completion_mask"])
        rewards.append(rank["batch"]["rewards"])
        rows.append(rank["batch"]["row"])
    width = max(lp.shape[1] for lp in logprobs)
    order = torch.argsort(torch.cat(rows))
    logprobs = torch.cat([torch.nn.functional.pad(lp, (0, width - lp.shape[1])) for lp in logprobs])[order]
    mask = torch.cat([torch.nn.functional.pad(m, (0, width - m.shape[1])) for m in masks])[order]
    _, gradients = reference(model, logprobs, mask, torch.cat(rewards)[order], consecutive_groups(len(order)))
    per_rank = [compared(rank["gradients"], gradients) for rank in ranks]
    prompts_of_rank = [set((rank["batch"]["row"] // GROUP_SIZE).tolist()) for rank in ranks]
    return {
        "num_processes": [rank["num_processes"] for rank in ranks],
        "rows": [rank["batch"]["row"].tolist() for rank in ranks],
        "rewards": torch.cat([rank["batch"]["rewards"] for rank in ranks])[order].tolist(),
        "prompts_split_across_processes": len(prompts_of_rank[0] & prompts_of_rank[1]),
        "max_abs_grad_diff": max(result["max_abs_grad_diff"] for result in per_rank),
        "max_abs_grad": per_rank[0]["max_abs_grad"],
        "gradient_names": all(result["gradient_names"] for result in per_rank),
    }


def two_process_worker(model_dir: str, out: Path) -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pacs-trl-rank-") as scratch:
        # 3 rows a micro-batch, 6 a process, 12 in all: the 2nd prompt's 4 completions are split across the processes
        trainer, recorder, _ = one_step(model_dir, scratch, alternating_reward, per_device_train_batch_size=3)
        trainer.train()
    [batch] = trainer.batches
    keep = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "rewards", "row")
    torch.save(
        {
            "batch": {key: batch[key] for key in keep},
            "gradients": recorder.gradients,
            "num_processes": trainer.accelerator.num_processes,
        },
        out / f"rank{trainer.accelerator.process_index}.pt",
    )


@torch.no_grad()
def odd_first_digit_probability(model, tokenizer, rows: list[dict]) -> float:
    """Mean over `rows` of π(the answer's first character is an odd digit | prompt, `\\boxed{`),
    the expected reward of `odd_first_digit_reward` given the opening the model writes first."""
    odd_ids = tokenizer.convert_tokens_to_ids(list(ODD_DIGITS))
    total = 0.0
    for row in rows:
        prompt = tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        ids = tokenizer(prompt + ANSWER_OPENING, add_special_tokens=False)["input_ids"]
        total += torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], dim=-1)[odd_ids].sum().item()
    return total / len(rows)


def train_check(model_dir: str, scratch: str) -> dict:
    torch.manual_seed(0)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    args = config(
        scratch, max_steps=16, per_device_train_batch_size=64, gradient_accumulation_steps=2, num_generations=8,
        max_grad_norm=1.0, learning_rate=1e-4,
    )  # fmt: skip
    recorder = Recorder(model)
    trainer = PACSTrainer(
        model=model, reward_funcs=odd_first_digit_reward, args=args, train_dataset=arithmetic_dataset(512),
        processing_class=tokenizer, callbacks=[recorder],
    )  # fmt: skip
    probe = load_rows(TASK, default_split="train")[:64]
    model.eval()
    before = odd_first_digit_probability(model, tokenizer, probe)
    trainer.train()
    model.eval()
    after = odd_first_digit_probability(model, tokenizer, probe)
    steps = [log for log in recorder.logs if "reward" in log]
    return {
        "odd_first_digit_before": before,
        "odd_first_digit_after": after,
        "reward": [log["reward"] for log in steps],
        "loss": [log["loss"] for log in steps],
        "pacs_loss": [log.get("pacs/loss") for log in steps],
    }


def refusals(scratch: str) -> dict:
    cases = {
        "kl": {"beta": 0.04},
        "num_iterations": {"num_iterations": 2},
        "steps_per_generation": {"gradient_accumulation_steps": 2, "steps_per_generation": 4},
        "estimator": {"pacs_estimator": "mean"},
        "token_level_sampler_correction": {"use_vllm": True, "vllm_importance_sampling_mode": "token_truncate"},
        "one_generation_in_eval": {"num_generations_eval": 1},
    }
    messages = {}
    for case, overrides in cases.items():
        try:
            config(scratch, per_device_train_batch_size=8, num_generations=8, **overrides)
            messages[case] = None
        except ValueError as error:
            messages[case] = str(error)
    config(scratch, per_device_train_batch_size=8, num_generations=8, num_generations_eval=1, pacs_estimator="naive")
    return messages


def main() -> None:
    if sys.argv[1] == "--worker":
        two_process_worker(sys.argv[2], Path(sys.argv[3]))
        return
    model_dir, out_path = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    results = {}
    checks = {
        "refusals": lambda scratch: refusals(scratch),
        "baselines": lambda scratch: baselines_trl_checks.results(),
        "exact": lambda scratch: exact_check(model_dir, scratch),
        "sampler_correction": lambda scratch: sampler_correction_check(model_dir, scratch),
        "unscored_rewards": lambda scratch: unscored_rewards_check(model_dir, scratch),
        "checkpoints": lambda scratch: checkpoint_check(model_dir, scratch),
        "two_processes": lambda scratch: two_process_check(model_dir, scratch),
        "train": lambda scratch: train_check(model_dir, scratch),
    }
    only = sys.argv[3:]  # names of checks to run (all by default), for running a few by hand
    for name, check in checks.items():
        if not only or name in only:
            with tempfile.TemporaryDirectory(prefix=f"pacs-trl-{name}-") as scratch:
                try:
                    results[name] = check(scratch)
                except Exception:
                    results[name] = {"error": traceback.format_exc()}
    if "loss" in results.get("train", {}):
        results["finite"] = all(math.isfinite(x) for x in results["train"]["loss"])
    out_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
