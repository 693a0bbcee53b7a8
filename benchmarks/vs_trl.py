"""pacs against TRL's GRPOTrainer on the same work: seconds per step and the reward they reach.

The work (`--model`, `CPU_WORKS`): by default the warm-started tiny model (`builtin:tiny-arithmetic`,
seed 0) on `builtin:arithmetic?max_operand=19`, 32 prompts x 8 responses per step, at most 16 new
tokens, temperature 1, top_p 1, one optimizer update per step (AdamW, lr 1e-4, constant, grad clip
1), no KL term (beta 0), 20 steps, CPU, float32, scored by the built-in arithmetic reward; with
`--model smollm2` the real SmolLM2-135M-Instruct (docs/real-model.md) on operands up to 24, 8
prompts x 8 responses of up to 64 tokens, lr 2e-5, scored by the math verifier
(`pacs.rewards.math:math_compute_score`), 6 steps. The same reward function scores both sides;
TRL renders the prompts with the model's chat template as pacs does. Three runs, one after the
other, each in its own process:

- TRL `GRPOTrainer`: `num_generations=8`, `per_device_train_batch_size=256` (32 prompts x 8, one
  generation per update: `steps_per_generation=1`, `num_iterations=1`), `beta=0`,
  `loss_type="dr_grpo"` and `scale_rewards="group"` (the objective of pacs' grpo), no gradient
  checkpointing, bf16 off, `use_cpu=True`. A `TrainerCallback` takes each step's time (from
  `on_step_begin` to `on_step_end`: generation, reward, loss, backward, optimizer step) and the
  logged mean reward.
- `pacs train --config builtin:demo ... algorithm.name=grpo`, then `algorithm.name=pacs`, both with
  32 prompts per step and one mini-batch (one update), reading `time/step_s` and `reward/mean` from
  the run's `metrics.jsonl`.

Each row gives the median step time over steps 4-20 (2-6 with `--model smollm2`; the first steps
warm up), its ratio to TRL's and the mean reward over the last 5 steps. The runs draw their own prompt orders and samples, so
the rewards compare learning on the same distribution, not the same batches.

TRL is not a dependency of pacs. The TRL side runs in its own venv, `.peer-venvs/trl` by default
(`--trl-venv`), the one the TRL integration tests use: `benchmarks/peer_venvs.py` makes it on first
use from `benchmarks/requirements-trl.txt` (pinned trl, transformers, accelerate, datasets,
math-verify) with `--constraint constraints-cpu.txt`, so that pip keeps the local CPU torch wheel,
and then this repository with `--no-deps` (for the reward and data code), and reuses it while
those files are unchanged. The first run spends a few minutes installing. In that venv this same
file runs the TRL worker (`--trl-worker`, internal).

Timings on shared machines are noisy: run it on a quiet machine and compare the ratios within one
run, not seconds across runs. It takes a few minutes on 2 CPU cores. Run:
`.venv/bin/python benchmarks/vs_trl.py [--model tiny|smollm2] [--steps 20] [--trl-venv .peer-venvs/trl]`.

`--device cuda` runs other work, on one GPU: models shaped as Qwen2.5-0.5B and -1.5B
(`SHAPES`), built here with random bf16 weights (seed 0) and the real 151,936-token vocabulary
behind a local tokenizer (`synthetic_tokenizer`, no hub), on prompts of random letters. Their end
token's logit is raised (`end_token_bias`) until P(end) per token is 1 / mean_length, so that
response lengths are close to geometric with that mean, cut at `max_length`: the same
distribution for every run, since every run samples the same model. A reward that needs no
answer (the parity of a response's length in characters) scores both sides. Each run is its own process:
TRL's `GRPOTrainer` with its `generate` and with transformers' continuous batching
(`use_transformers_paged`), and `pacs train` with grpo and pacs, synchronous and
`rollout.max_staleness=1`, `generate` and `rollout.hf.continuous_batching`, padded and
`train.padding_free` (`RUNS`). Both train in mixed precision (float32 weights, bf16 autocast: TRL's
`bf16=True`, pacs's `model.dtype=bfloat16`), one optimizer update per step, micro-batches of
`micro_batch` sequences. The table gives each run's median step over the steps after the first,
the phases (generating: for TRL its `_generate_and_score_completions`, which scores too, for pacs
`time/generate_s`, or with staleness 1 the wait for rollouts; updating; the rest),
tokens per second (prompt and response tokens of the step over its time), the update's MFU
(6·N·tokens / (update seconds · --peak-flops), the same count for both) and pacs's `perf/mfu`,
and the step against TRL's with the same generation backend. `--smoke` runs the same code on
a CPU with a tiny shape and a 512-token vocabulary, four of the runs that cover every path
(`SMOKE_RUNS`), in a few minutes on 2 busy cores (the test suite runs it,
tests/integrations/test_vs_trl_smoke.py). Run:
`.venv/bin/python benchmarks/vs_trl.py --device cuda [--shapes 0.5b,1.5b] [--steps 3] [--trl-python PYTHON] [--results DIR]`.
Each run's figures are printed as it ends; a run that fails is a row saying so and the others go on
(the exit status says that one failed); `--results` keeps every run's log and rewrites `results.json`
after each run, so a benchmark stopped by a machine's time limit leaves the runs that had finished.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from peer_venvs import PEER_VENVS, PEERS, peer_python

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRL_VENV = PEER_VENVS / "trl"
REQUIREMENTS = REPO / "benchmarks" / PEERS["trl"][0]
LAST_STEPS = 5


@dataclass(frozen=True)
class CpuWork:
    """The CPU comparison's work (`--model`): `model` (a pacs model path) trained on `data` with
    `prompts` prompts x `n` responses a step, at most `max_new_tokens` new tokens, AdamW at `lr`;
    `reward` (`package.module:function`, the reward-function signature) scores both sides, and
    pacs's run takes `overrides` on top of `builtin:demo`. `steps` is `--steps`'s default; the
    table's step time is the median from `first_timed_step` on (earlier steps warm up)."""

    model: str
    data: str
    prompts: int
    n: int
    max_new_tokens: int
    lr: float
    reward: str
    steps: int
    first_timed_step: int
    overrides: tuple[str, ...] = ()


CPU_WORKS = {
    "tiny": CpuWork("builtin:tiny-arithmetic", "builtin:arithmetic?max_operand=19", 32, 8, 16, 1e-4,
                    "pacs.rewards.registry:default_compute_score", steps=20, first_timed_step=4),
    "smollm2": CpuWork("builtin:smollm2-135m-instruct", "builtin:arithmetic?max_operand=24", 8, 8, 64, 2e-5,
                       "pacs.rewards.math:math_compute_score", steps=6, first_timed_step=2,
                       overrides=("data.max_prompt_length=96",)),
}  # fmt: skip
"""`--model`'s works: the demo's warm-started tiny model, and the real model of docs/real-model.md
on the task of `builtin:real-demo` with its shapes (a step of 64 responses of up to 64 tokens)."""
VERSIONS = ("torch", "transformers", "trl", "accelerate", "datasets", "pacs")


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in VERSIONS:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


# ---------------------------------------------------------------- TRL worker (runs in the TRL venv)


def trl_worker(work: CpuWork, model_dir: str, steps: int, out_path: str) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pacs.data.loading import load_rows
    from pacs.rewards.registry import load_reward_function

    rows = load_rows(work.data, default_split="train")
    dataset = Dataset.from_list(
        [
            {"prompt": row["prompt"], "data_source": row["data_source"], "ground_truth": row["reward_model"]["ground_truth"]}
            for row in rows
        ]
    )
    compute_score = load_reward_function(work.reward)

    def reward(completions, data_source, ground_truth, **_) -> list[float]:
        return [
            float(compute_score(source, completion[-1]["content"], truth))
            for completion, source, truth in zip(completions, data_source, ground_truth)
        ]

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.step_s: list[float] = []
            self.reward: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_s.append(time.perf_counter() - self._start)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.reward.append(float(logs["reward"]))

    torch.manual_seed(0)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)  # as pacs loads the tiny tokenizer (pacs.models.loading)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            use_cpu=True,
            bf16=False,
            fp16=False,
            seed=0,
            max_steps=steps,
            per_device_train_batch_size=work.prompts * work.n,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            num_generations=work.n,
            max_completion_length=work.max_new_tokens,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            loss_type="dr_grpo",
            scale_rewards="group",
            learning_rate=work.lr,
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            optim="adamw_torch",
            gradient_checkpointing=False,
            logging_steps=1,
            eval_strategy="no",
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            log_completions=False,
        )
        callback = StepTimes()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[callback],
        )
        checkpointing = getattr(trainer.args, "activation_checkpointing", trainer.args.gradient_checkpointing)
        assert not checkpointing, "TRL's GRPOConfig turned activation checkpointing on; pacs runs without it"
        trainer.train()
    result = {
        "step_s": callback.step_s,
        "reward": callback.reward,
        "threads": torch.get_num_threads(),
        "versions": versions(),
    }
    Path(out_path).write_text(json.dumps(result))


# ---------------------------------------------------------------- synthetic work (--device cuda, --smoke)

SHAPES = {
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151_936},
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151_936},
    "smoke": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 512},
}  # fmt: skip
"""Qwen2.5-0.5B's and -1.5B's shapes (tied embeddings, as both ship), and the smoke test's."""


@dataclass(frozen=True)
class Work:
    """One shape's runs: `prompts` prompts of `prompt_length` random words, `n` responses each,
    lengths near-geometric with mean `mean_length` cut at `max_length`, `steps` steps, micro-batches
    of `micro_batch` sequences, on `device`."""

    shape: str
    device: str
    prompts: int
    n: int
    prompt_length: int
    mean_length: int
    max_length: int
    steps: int
    micro_batch: int


GPU_WORK = Work("0.5b", "cuda", prompts=16, n=8, prompt_length=128, mean_length=256, max_length=1024, steps=3, micro_batch=16)
SMOKE_WORK = Work("smoke", "cpu", prompts=2, n=4, prompt_length=8, mean_length=4, max_length=8, steps=2, micro_batch=8)


@dataclass(frozen=True)
class Run:
    """One row of the table: TRL (`backend` generate or paged) or pacs (`algorithm`, staleness,
    `backend` generate or continuous, `padding_free`)."""

    name: str
    framework: str
    backend: str
    algorithm: str = "grpo"
    staleness: int = 0
    padding_free: bool = False


RUNS = (
    Run("TRL GRPOTrainer, generate", "trl", "generate"),
    Run("TRL GRPOTrainer, paged", "trl", "paged"),
    Run("pacs grpo, generate", "pacs", "generate"),
    Run("pacs grpo, continuous", "pacs", "continuous"),
    Run("pacs grpo, continuous, padding-free", "pacs", "continuous", padding_free=True),
    Run("pacs pacs, continuous, padding-free", "pacs", "continuous", algorithm="pacs", padding_free=True),
    Run("pacs grpo, continuous, padding-free, staleness 1", "pacs", "continuous", staleness=1, padding_free=True),
)
"""The runs of each shape: both TRL backends, and pacs's settings one change at a time."""

SMOKE_RUNS = (RUNS[1], RUNS[2], RUNS[5], RUNS[6])
"""`--smoke`'s runs: every code path of `RUNS` (TRL's worker with continuous batching, pacs padded
with `generate`, pacs's continuous batching and padding-free, synchronous and asynchronous), in
fewer processes."""

END, PAD = "<|im_end|>", "<|endoftext|>"
SYNTHETIC_SOURCE = "vs_trl"


def parity_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """The synthetic work's reward (pacs's `reward.function`, TRL's reward through `parity_rewards`):
    1 for a response of an even number of characters, else 0; it needs no answer and splits
    groups."""
    return float(len(solution_str) % 2 == 0)


def synthetic_tokenizer(vocab_size: int):
    """A Qwen2 tokenizer (what transformers loads beside a Qwen2 model, whatever its files name)
    over `vocab_size` ids: the 256 byte-level characters with no merges (a prompt's letters are a
    token each), filler tokens `<wN>` for the ids up to the last two, which the model samples but
    no text encodes to, `<|endoftext|>` (padding) and `<|im_end|>` (the end token), and a chat
    template that writes a conversation's contents one after another."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {character: index for index, character in enumerate(bytes_to_unicode().values())}
    vocab |= {f"<w{index}>": index for index in range(len(vocab), vocab_size - 2)} | {PAD: vocab_size - 2, END: vocab_size - 1}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token=END, pad_token=PAD, unk_token=None, bos_token=None)
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    return tokenizer


def end_token_bias(model, end_id: int, target: float, probe: torch.Tensor) -> float:
    """Sets the model so that its end token's probability is about `target` at every position, and
    returns the final norm's weight it took in dimension 0. Every token's (tied) embedding gets the
    value c = 64 in dimension 0, the end token's 2c: that dimension then dominates every hidden
    state's norm, so after the final RMS norm it is near sqrt(hidden_size) at every position, and
    the end token's logit exceeds every other's by the near-constant weight · sqrt(hidden_size) · c
    (the others' differences shrink alike: near-uniform). The weight (exact powers of two for the
    embeddings, so bf16 loses nothing there) is bisected until the mean probability over `probe`
    (B, T) random token ids is `target`."""
    embeddings, norm = model.get_input_embeddings().weight, model.get_decoder().norm.weight
    base = 64.0
    with torch.no_grad():
        embeddings[:, 0] = base
        embeddings[end_id, 0] = 2 * base

        def mean_end_probability(weight: float) -> float:
            norm[0] = weight
            logits = model(input_ids=probe).logits.float()
            return float(torch.softmax(logits, dim=-1)[..., end_id].mean())

        low, high = 0.0, 1.0 / base
        while mean_end_probability(high) < target:
            low, high = high, 2 * high
        for _ in range(30):
            middle = (low + high) / 2
            low, high = (middle, high) if mean_end_probability(middle) < target else (low, middle)
        mean_end_probability(high)
    return high


def build_synthetic(work: Work, directory: Path) -> tuple[Path, Path, int]:
    """The model (random bf16 weights, seed 0, `end_token_bias` for `work.mean_length`), its
    tokenizer (`synthetic_tokenizer`) and `work.prompts * work.steps * 2` prompt rows (pacs's row format) under
    `directory`: (model dir, rows file, parameter count)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    shape = SHAPES[work.shape]
    tokenizer = synthetic_tokenizer(shape["vocab_size"])
    config = Qwen2Config(
        **shape,
        max_position_embeddings=32_768,
        tie_word_embeddings=True,
        rope_parameters={"rope_theta": 1_000_000.0, "rope_type": "default"},
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16",
    )
    with torch.device(work.device):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    words = shape["vocab_size"] - 2
    probe = torch.randint(words, (4, work.prompt_length + 64), device=work.device)
    bias = end_token_bias(model, tokenizer.eos_token_id, 1 / work.mean_length, probe)
    model_dir, rows_path = directory / f"model-{work.shape}", directory / f"rows-{work.shape}.jsonl"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rows = []
    for index in range(work.prompts * work.steps * 2):
        text = "".join(chr(ord("a") + letter) for letter in torch.randint(26, (work.prompt_length,)).tolist())
        rows.append({"data_source": SYNTHETIC_SOURCE, "prompt": [{"role": "user", "content": text}], "ability": "synthetic",
                     "reward_model": {"style": "rule", "ground_truth": "even"}, "extra_info": {"index": index}})  # fmt: skip
    rows_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    parameters = sum(tensor.numel() for tensor in model.parameters())
    print(f"{work.shape}: {parameters / 1e6:.1f}M parameters, final norm's weight in dimension 0: {bias:.4g}", flush=True)
    return model_dir, rows_path, parameters


def synthetic_trl_worker(work: Work, run: Run, model_dir: str, rows_path: str, out_path: str) -> None:
    """TRL's `GRPOTrainer` on the synthetic work (runs in the TRL venv): each step's time, the time
    in `_generate_and_score_completions`, its tokens and mean response length."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = [json.loads(line) for line in Path(rows_path).read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": row["prompt"]} for row in rows])

    def parity_rewards(completions, **_) -> list[float]:
        return [parity_score(SYNTHETIC_SOURCE, completion[-1]["content"], "") for completion in completions]

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.step_s: list[float] = []
            self.logs: list[dict] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            synchronize(work.device)
            self.step_s.append(time.perf_counter() - self._start)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "num_tokens" in logs:
                self.logs.append(dict(logs))

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(work.device)
    sequences = work.prompts * work.n
    micro = min(work.micro_batch, sequences)
    paged_settings = None
    if run.backend == "paged" and work.device == "cpu":  # its default sizes the cache from 60% of the host's memory
        paged_settings = {"num_blocks": sequences, "max_batch_tokens": 256}
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as output_dir:
        config = GRPOConfig(
            output_dir=output_dir, use_cpu=work.device == "cpu", bf16=work.device == "cuda", fp16=False, seed=0,
            max_steps=work.steps, per_device_train_batch_size=micro, gradient_accumulation_steps=sequences // micro,
            num_iterations=1, num_generations=work.n, max_completion_length=work.max_length, temperature=1.0, top_p=1.0,
            top_k=0, beta=0.0, loss_type="dr_grpo", scale_rewards="group", learning_rate=1e-6, lr_scheduler_type="constant",
            warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, optim="adamw_torch", gradient_checkpointing=False,
            logging_steps=1, eval_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True,
            dataloader_num_workers=0, log_completions=False, use_transformers_paged=run.backend == "paged",
            transformers_continuous_batching_config=paged_settings,
        )  # fmt: skip
        callback = StepTimes()
        trainer = GRPOTrainer(
            model=model, reward_funcs=parity_rewards, args=config, train_dataset=dataset, processing_class=tokenizer,
            callbacks=[callback],
        )  # fmt: skip
        generate_s: list[float] = []
        generate_and_score = trainer._generate_and_score_completions

        def timed(*args, **kwargs):
            start = time.perf_counter()
            result = generate_and_score(*args, **kwargs)
            synchronize(work.device)
            generate_s.append(time.perf_counter() - start)
            return result

        trainer._generate_and_score_completions = timed
        trainer.train()
    tokens = [callback.logs[0]["num_tokens"]] + [
        b["num_tokens"] - a["num_tokens"] for a, b in zip(callback.logs, callback.logs[1:])
    ]
    steps = [
        {
            "step_s": step_s,
            "generate_s": generate,
            "tokens": count,
            "response_length": log.get("completions/mean_length", math.nan),
        }
        for step_s, generate, count, log in zip(callback.step_s, generate_s, tokens, callback.logs)
    ]
    Path(out_path).write_text(json.dumps({"steps": steps, "versions": versions()}))


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def pacs_synthetic_run(
    work: Work, run: Run, model_dir: Path, rows_path: Path, output_dir: Path, log_path: Path, peak_flops: float | None
) -> list[dict]:
    """`pacs train` on the synthetic work with `run`'s settings, its output in `log_path`: each step's
    time, phases, tokens and lengths."""
    sequences = work.prompts * work.n
    command = [
        sys.executable, "-m", "pacs.cli", "train", "--config", "builtin:demo", f"model.path={model_dir}",
        f"model.dtype={'bfloat16' if work.device == 'cuda' else 'float32'}", f"data.train={rows_path}", "data.val=null",
        f"data.max_prompt_length={work.prompt_length + 8}", f"data.max_response_length={work.max_length}",
        f"train.steps={work.steps}", f"train.batch_size={work.prompts}", f"train.mini_batch_size={work.prompts}",
        f"train.micro_batch_size={min(work.micro_batch, sequences)}", "train.lr=1e-6", "train.lr_schedule=constant",
        "train.eval_every=0", "train.save_every=0", "train.report_to=[]", f"rollout.n={work.n}",
        f"rollout.generation_batch_size={sequences}", f"algorithm.name={run.algorithm}",
        f"rollout.max_staleness={run.staleness}", f"rollout.hf.continuous_batching={str(run.backend == 'continuous').lower()}",
        f"train.padding_free={str(run.padding_free).lower()}", f"reward.function={Path(__file__).stem}:parity_score",
        "reward.num_workers=0", f"output_dir={output_dir}",
        *([f"train.peak_flops={peak_flops}"] if peak_flops else []),
    ]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    run_logged(command, log_path, f"{run.name} ({work.shape})", environment)
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [
        {"step_s": row["time/step_s"], "generate_s": row.get("time/generate_s", row.get("time/wait_rollout_s", 0.0)),
         "update_s": row["time/update_actor_s"],
         "tokens": row["throughput/tokens_per_s"] * row["time/step_s"], "response_length": row["response_length/mean"],
         "mfu": row.get("perf/mfu", math.nan)}
        for row in records if "time/step_s" in row
    ]  # fmt: skip


def trl_synthetic_run(
    work: Work, run: Run, model_dir: Path, rows_path: Path, work_dir: Path, log_path: Path, trl_python: Path
) -> list[dict]:
    out = work_dir / f"trl-{run.backend}-{work.shape}.json"
    command = [str(trl_python), __file__, "--trl-worker", "--work", json.dumps(asdict(work)), "--run", json.dumps(asdict(run)),
               "--model-dir", str(model_dir), "--rows", str(rows_path), "--out", str(out)]  # fmt: skip
    run_logged(command, log_path, f"{run.name} ({work.shape})")
    steps = json.loads(out.read_text())["steps"]
    return [{**step, "update_s": step["step_s"] - step["generate_s"], "mfu": math.nan} for step in steps]


def summarise(steps: list[dict], parameters: int, peak_flops: float | None) -> dict[str, float]:
    """The median over the steps after the first of each figure of a run (`steps`: one dict a step),
    tokens/s from the median step's tokens, and the update's MFU (6·N·tokens / (update_s · peak))."""
    timed = steps[1:] or steps
    median = {key: statistics.median(step[key] for step in timed) for key in ("step_s", "generate_s", "update_s", "tokens")}
    median["response_length"] = statistics.mean(step["response_length"] for step in timed)
    median["tokens_per_s"] = median["tokens"] / median["step_s"]
    median["update_mfu"] = 6 * parameters * median["tokens"] / (median["update_s"] * peak_flops) if peak_flops else math.nan
    median["mfu"] = statistics.median(step["mfu"] for step in timed)
    return median


def synthetic_table(work: Work, results: dict[Run, dict[str, float]], failed: dict[Run, str]):
    """The table of one shape's runs; each pacs row against TRL's row with its generation backend
    (`generate` against `generate`, continuous batching against paged); a run in `failed` is a row
    saying why."""
    from rich.table import Table

    trl = {run.backend: figures for run, figures in results.items() if run.framework == "trl"}
    table = Table(title=f"{work.shape}, {work.device}: {work.prompts} prompts x {work.n}, lengths mean {work.mean_length} "
                        f"cut {work.max_length}, {work.steps} steps")  # fmt: skip
    columns = ("", "s/step", "generate s", "update s", "other s", "tokens/s", "mean length", "update MFU", "perf/mfu", "vs TRL")
    for column in columns:
        table.add_column(column, justify="right" if column else "left")
    for run, figures in results.items():
        peer = trl.get("paged" if run.backend == "continuous" else run.backend)
        other = figures["step_s"] - figures["generate_s"] - figures["update_s"]
        versus = f"{figures['step_s'] / peer['step_s']:.2f}x" if peer and run.framework == "pacs" else ""
        table.add_row(
            run.name, f"{figures['step_s']:.3f}", f"{figures['generate_s']:.3f}", f"{figures['update_s']:.3f}", f"{other:.3f}",
            f"{figures['tokens_per_s']:.0f}", f"{figures['response_length']:.1f}", percent(figures["update_mfu"]),
            percent(figures["mfu"]), versus,
        )  # fmt: skip
    for run, why in failed.items():
        table.add_row(run.name, f"failed: {why}")
    return table


def percent(value: float) -> str:
    return "" if math.isnan(value) else f"{100 * value:.1f}%"


def synthetic_run(
    work: Work,
    run: Run,
    model_dir: Path,
    rows_path: Path,
    directory: Path,
    log_path: Path,
    trl_python: Path,
    peak_flops: float | None,
) -> list[dict]:
    """`run`'s steps on `work` (TRL's or pacs's process, scratch files under `directory`); RunFailed
    if its process failed or recorded another number of steps."""
    if run.framework == "trl":
        steps = trl_synthetic_run(work, run, model_dir, rows_path, directory, log_path, trl_python)
    else:
        output_dir = directory / f"pacs-{work.shape}-{RUNS.index(run)}"
        steps = pacs_synthetic_run(work, run, model_dir, rows_path, output_dir, log_path, peak_flops)
    if len(steps) != work.steps:
        raise RunFailed(f"{run.name} ({work.shape}): {len(steps)} steps recorded for {work.steps}")
    return steps


def synthetic_main(
    works: list[Work], trl_python: Path, peak_flops: float | None, runs: tuple[Run, ...] = RUNS, out: Path | None = None
) -> bool:
    """Every run of every shape in `works`, one table per shape; each run's figures printed as it
    ends, and with `out`, every run's log kept there and `results.json` rewritten after each run (so
    that a machine's time limit that stops the benchmark leaves what had finished). A run that fails
    is a row saying so and the others go on; returns whether every run succeeded."""
    from rich.console import Console

    console = Console()
    start = time.perf_counter()
    record: dict[str, Any] = {"versions": versions(), "peak_flops": peak_flops, "shapes": {}}
    any_failed = False
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        directory = Path(tmp)
        logs = out or directory
        for work in works:
            model_dir, rows_path, parameters = build_synthetic(work, directory)
            results: dict[Run, dict[str, float]] = {}
            failed: dict[Run, str] = {}
            shape = record["shapes"][work.shape] = {"work": asdict(work), "parameters": parameters, "runs": []}
            for run in runs:
                # Named by its number in the full table, whichever runs this call makes.
                log_path = logs / f"{work.shape}-{RUNS.index(run)}-{run.framework}.log"
                try:
                    steps = synthetic_run(work, run, model_dir, rows_path, directory, log_path, trl_python, peak_flops)
                except RunFailed as error:
                    failed[run] = str(error).splitlines()[0]
                    console.print(f"{run.name} ({work.shape}) FAILED: {error}", highlight=False)
                    shape["runs"].append({"run": asdict(run), "failed": str(error), "log": log_path.name})
                else:
                    results[run] = summarise(steps, parameters, peak_flops)
                    console.print(f"{run.name} ({work.shape}): " + ", ".join(
                        f"{key} {value:.4g}" for key, value in results[run].items()), highlight=False)  # fmt: skip
                    shape["runs"].append({"run": asdict(run), "figures": results[run], "steps": steps, "log": log_path.name})
                if out is not None:
                    (out / "results.json").write_text(json.dumps(record, indent=1))
            console.print(synthetic_table(work, results, failed))
            any_failed = any_failed or bool(failed)
            shutil.rmtree(model_dir)
    console.print(
        "s/step, phases, tokens: medians over the steps after the first; vs TRL: the row's s/step over TRL's with the "
        "same generation backend (below 1: faster); update MFU: 6·N·tokens / (update s · peak), N = "
        f"every parameter, peak {peak_flops or 'not given'}; perf/mfu: pacs's own (every pass counted).\n"
        f"pacs venv: {', '.join(f'{k} {v}' for k, v in versions().items())}; {time.perf_counter() - start:.0f} s in all"
        + (f"; logs and results.json in {out}" if out is not None else "")
    )
    return not any_failed


# ---------------------------------------------------------------- driver (runs in pacs' venv)


def chosen_runs(numbers: str | None, parser: argparse.ArgumentParser) -> tuple[Run, ...]:
    """The runs of `RUNS` that `--runs` names by number ("0,2,3"; None: every one), in `RUNS`'s order."""
    if numbers is None:
        return RUNS
    try:
        picked = {int(number) for number in numbers.split(",")}
    except ValueError:
        parser.error(f"--runs: {numbers!r} is not comma-separated run numbers, e.g. 0,2,3")
    outside = sorted(picked - set(range(len(RUNS))))
    if outside:
        valid = "; ".join(f"{index}: {run.name}" for index, run in enumerate(RUNS))
        parser.error(f"--runs: {outside} are not run numbers; valid: {valid}")
    return tuple(run for index, run in enumerate(RUNS) if index in picked)


class RunFailed(Exception):
    """A run's process failed: the first line says how, the rest is the end of its output."""


def run_logged(command: list[str], log_path: Path, what: str, environment: dict[str, str] | None = None) -> None:
    """Run `command` with its output in `log_path`; RunFailed, with the log's tail, if it fails."""
    start = time.perf_counter()
    print(f"{what} ...", flush=True)
    with log_path.open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=environment).returncode
    if code != 0:
        tail = log_path.read_text().splitlines()[-40:]
        raise RunFailed(f"{what} exited with {code}; the end of its output ({log_path.name}):\n" + "\n".join(tail))
    print(f"{what}: {time.perf_counter() - start:.0f} s", flush=True)


def pacs_run(cpu_work: CpuWork, algorithm: str, model_dir: Path, steps: int, work: Path) -> tuple[list[float], list[float]]:
    output_dir = work / f"pacs-{algorithm}"
    command = [
        sys.executable, "-m", "pacs.cli", "train", "--config", "builtin:demo", f"model.path={model_dir}", f"train.steps={steps}",
        f"data.train={cpu_work.data}", f"reward.function={cpu_work.reward}", f"rollout.n={cpu_work.n}",
        f"data.max_response_length={cpu_work.max_new_tokens}", f"train.lr={cpu_work.lr}", "train.lr_schedule=constant",
        f"train.batch_size={cpu_work.prompts}", f"train.mini_batch_size={cpu_work.prompts}",
        f"train.micro_batch_size={cpu_work.prompts * cpu_work.n}", "train.eval_every=0", "train.save_every=0",
        "data.val=null", f"output_dir={output_dir}", f"algorithm.name={algorithm}", *cpu_work.overrides,
    ]  # fmt: skip
    run_logged(command, work / f"pacs-{algorithm}.log", f"pacs train, algorithm.name={algorithm}, {steps} steps")
    records = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    records = [record for record in records if "time/step_s" in record]
    return [record["time/step_s"] for record in records], [record["reward/mean"] for record in records]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        epilog="The TRL side runs in its own venv (--trl-venv), made on first use with `python -m venv` and "
        f"`pip install --constraint constraints-cpu.txt -r {REQUIREMENTS.name}` plus `pip install --no-deps -e .` "
        "(this repository) for the reward and data code; see benchmarks/peer_venvs.py.",
    )
    parser.add_argument("--steps", type=int, help="training steps per run (default 20; --device cuda: 3, --smoke: 2)")
    parser.add_argument("--trl-venv", type=Path, default=DEFAULT_TRL_VENV, help="the TRL venv (default %(default)s)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cpu: --model's work; cuda: SHAPES on one GPU")
    parser.add_argument(
        "--model", choices=sorted(CPU_WORKS), default="tiny",
        help="--device cpu: the demo's tiny model, or the real SmolLM2-135M-Instruct on builtin:real-demo's task (default %(default)s)",
    )  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="--device cuda's code on a CPU with a tiny shape")
    parser.add_argument("--shapes", default="0.5b,1.5b", help="--device cuda: the shapes to run (default %(default)s)")
    parser.add_argument(
        "--trl-python", type=Path, help="a python with TRL installed, instead of --trl-venv (a GPU machine's own environment)"
    )
    parser.add_argument(
        "--peak-flops", type=float, default=989e12, help="--device cuda: one GPU's peak (default: H100/H200 bf16)"
    )
    parser.add_argument(
        "--runs",
        help="--device cuda: the runs to make, as their numbers in the table's order from 0 (default: all "
        f"{len(RUNS)}); a later call can make the ones a time limit cut",
    )
    parser.add_argument(
        "--results",
        type=Path,
        help="--device cuda, --smoke: keep every run's log here, and results.json rewritten after each run",
    )
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--rows", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker and args.work:
        synthetic_trl_worker(Work(**json.loads(args.work)), Run(**json.loads(args.run)), args.model_dir, args.rows, args.out)
        return
    if args.trl_worker:
        trl_worker(CPU_WORKS[args.model], args.model_dir, args.steps, args.out)
        return
    if args.smoke or args.device == "cuda":
        trl_python = args.trl_python or peer_python(args.trl_venv.resolve(), REQUIREMENTS)
        if args.smoke:
            works = [replace(SMOKE_WORK, steps=args.steps or SMOKE_WORK.steps)]
        else:
            unknown = set(args.shapes.split(",")) - {"0.5b", "1.5b"}
            if unknown:
                parser.error(f"--shapes: {sorted(unknown)} unknown; choose from 0.5b, 1.5b")
            works = [replace(GPU_WORK, shape=shape, steps=args.steps or GPU_WORK.steps) for shape in args.shapes.split(",")]
        if works[0].steps < 2:
            parser.error("--steps must be at least 2 (the first step is not timed)")
        runs = SMOKE_RUNS if args.smoke else chosen_runs(args.runs, parser)
        if not synthetic_main(works, trl_python, None if args.smoke else args.peak_flops, runs, args.results):
            sys.exit("vs_trl.py: a run failed (its row in the table says which)")
        return
    cpu_work = CPU_WORKS[args.model]
    args.steps = args.steps or cpu_work.steps
    if args.steps <= cpu_work.first_timed_step:
        parser.error(f"--steps must be more than {cpu_work.first_timed_step} with --model {args.model}")

    from rich.console import Console
    from rich.table import Table

    from pacs.models.loading import resolve_model_path

    model_dir = Path(resolve_model_path(cpu_work.model))
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        work = Path(tmp)
        python = peer_python(args.trl_venv.resolve(), REQUIREMENTS)
        trl_out = work / "trl.json"
        run_logged(
            [str(python), __file__, "--trl-worker", "--model", args.model, "--model-dir", str(model_dir), "--steps",
             str(args.steps), "--out", str(trl_out)],
            work / "trl.log",
            f"TRL GRPOTrainer, {args.steps} steps",
        )  # fmt: skip
        trl = json.loads(trl_out.read_text())
        results = {"TRL GRPOTrainer": (trl["step_s"], trl["reward"])}
        for algorithm in ("grpo", "pacs"):
            results[f"pacs {algorithm}"] = pacs_run(cpu_work, algorithm, model_dir, args.steps, work)

    def median_step(step_s: list[float]) -> float:
        return statistics.median(step_s[cpu_work.first_timed_step - 1 :])

    trl_s = median_step(trl["step_s"])
    table = Table(title=f"{cpu_work.model}: {cpu_work.prompts} prompts x {cpu_work.n} responses, {args.steps} steps, CPU")
    for column in ("", "s/step", "vs TRL", f"mean reward last {LAST_STEPS}"):
        table.add_column(column, justify="right" if column else "left")
    for name, (step_s, reward) in results.items():
        if len(step_s) != args.steps or len(reward) != args.steps:
            sys.exit(f"{name}: {len(step_s)} step times and {len(reward)} rewards for {args.steps} steps")
        seconds = median_step(step_s)
        table.add_row(name, f"{seconds:.3f}", f"{trl_s / seconds:.2f}x", f"{statistics.mean(reward[-LAST_STEPS:]):.3f}")
    console = Console()
    console.print(table)
    pacs_versions = versions()
    console.print(
        "pacs venv: " + ", ".join(f"{name} {value}" for name, value in pacs_versions.items())
        + "\nTRL venv: " + ", ".join(f"{name} {value}" for name, value in trl["versions"].items())
        + f"\ns/step: median over steps {cpu_work.first_timed_step}-{args.steps}; vs TRL: TRL's s/step / the row's (above 1: "
        f"faster); threads: {torch.get_num_threads()} (TRL worker: {trl['threads']}); python {sys.version.split()[0]}"
    )  # fmt: skip


if __name__ == "__main__":
    try:
        main()
    except RunFailed as failure:  # the CPU comparison: one failed run leaves nothing to compare
        sys.exit(f"vs_trl.py: {failure}")
