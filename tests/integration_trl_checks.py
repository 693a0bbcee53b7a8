"""The TRL integration's checks, run in the TRL venv (.peer-venvs/trl) by tests/test_integration_trl.py,
which asserts on the JSON this writes: `python integration_trl_checks.py MODEL_DIR OUT_JSON`.

- exact: one optimizer step of `PACSTrainer` on 2 prompts x 4 completions, split by TRL into 2
  shuffled micro-batches of 4 (gradient_accumulation_steps = steps_per_generation = 2), against
  `pacs.algos.pacs_loss` on the same 8 rows held whole, at the same parameters: the gradients TRL
  accumulated (read before the optimizer step) and the loss.
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
  (tests/baselines_trl_checks.py).
"""

from __future__ import annotations

import json
import math
import re
import sys
import tempfile
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

import baselines_trl_checks
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
        self.logs.append(dict(logs or {}))


class RecordingTrainer(PACSTrainer):
    """PACSTrainer that keeps its generation batch in group order, with each row's index (which TRL
    shuffles with the rows, so the micro-batches' rows are known)."""

    batches: list[dict] = []
    micro_batch_rows: list[list[int]] = []

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        output["row"] = torch.arange(output["completion_ids"].shape[0])
        self.batches.append({**output, "rewards": self._rewards_per_func.sum(dim=1)})
        return output

    def _compute_loss(self, model, inputs):
        self.micro_batch_rows.append(inputs["row"].tolist())
        return super()._compute_loss(model, inputs)


def reference(model, batch: dict) -> tuple[float, dict[str, torch.Tensor]]:
    """pacs.algos.pacs_loss on the whole batch at the model's parameters: its value and gradients."""
    completion_ids, completion_mask = batch["completion_ids"], batch["completion_mask"]
    input_ids = torch.cat([batch["prompt_ids"], completion_ids], dim=1)
    attention_mask = torch.cat([batch["prompt_mask"], completion_mask], dim=1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -completion_ids.shape[1] - 1 : -1]
    logprobs = torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    loss = pacs_loss(logprobs, logprobs.detach(), completion_mask, batch["rewards"], GROUP_SIZE, beta=BETA)
    model.zero_grad()
    loss.backward()
    return loss.item(), {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def exact_check(model_dir: str, scratch: str) -> dict:
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    args = config(
        scratch, max_steps=1, per_device_train_batch_size=GROUP_SIZE, gradient_accumulation_steps=2,
        num_generations=GROUP_SIZE, pacs_beta=BETA, max_grad_norm=0.0,
    )  # fmt: skip
    recorder = Recorder(model)
    trainer = RecordingTrainer(
        model=model, reward_funcs=alternating_reward, args=args, train_dataset=arithmetic_dataset(8),
        processing_class=tokenizer, callbacks=[recorder],
    )  # fmt: skip
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.train()
    [batch] = trainer.batches
    trained = {name: p.detach().clone() for name, p in model.named_parameters()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(before[name])
    loss, gradients = reference(model, batch)
    groups = [set(range(g * GROUP_SIZE, (g + 1) * GROUP_SIZE)) for g in range(len(batch["rewards"]) // GROUP_SIZE)]
    return {
        "micro_batch_rows": trainer.micro_batch_rows,
        "groups_split": sum(1 for g in groups if not any(g <= set(rows) for rows in trainer.micro_batch_rows)),
        "rewards": batch["rewards"].tolist(),
        "max_abs_grad_diff": max((recorder.gradients[n] - g).abs().max().item() for n, g in gradients.items()),
        "max_abs_grad": max(g.abs().max().item() for g in gradients.values()),
        "gradient_names": sorted(gradients) == sorted(recorder.gradients),
        "trl_loss": [log["loss"] for log in recorder.logs if "loss" in log][0],
        "reference_loss": loss,
        "parameters_moved": any(not torch.equal(trained[n], before[n]) for n in before),
    }


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
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
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
    }
    messages = {}
    for case, overrides in cases.items():
        try:
            config(scratch, per_device_train_batch_size=8, num_generations=8, **overrides)
            messages[case] = None
        except ValueError as error:
            messages[case] = str(error)
    return messages


def main() -> None:
    model_dir, out_path = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory(prefix="pacs-trl-") as scratch:
        results["refusals"] = refusals(scratch)
        results["baselines"] = baselines_trl_checks.results()
        results["exact"] = exact_check(model_dir, scratch)
        results["train"] = train_check(model_dir, scratch)
    results["finite"] = all(math.isfinite(x) for x in results["train"]["loss"])
    out_path.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
