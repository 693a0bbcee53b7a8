"""pacs against TRL's GRPOTrainer on the same work: seconds per step and the reward they reach.

The work: the warm-started tiny model (`builtin:tiny-arithmetic`, seed 0) on
`builtin:arithmetic?max_operand=19`, 32 prompts x 8 responses per step, at most 16 new tokens,
temperature 1, top_p 1, one optimizer update per step (AdamW, lr 1e-4, constant, grad clip 1), no
KL term (beta 0), 20 steps, CPU, float32. The same arithmetic reward (`pacs.rewards.arithmetic_score`)
scores both. Three runs, one after the other, each in its own process:

- TRL `GRPOTrainer`: `num_generations=8`, `per_device_train_batch_size=256` (32 prompts x 8, one
  generation per update: `steps_per_generation=1`, `num_iterations=1`), `beta=0`,
  `loss_type="dr_grpo"` and `scale_rewards="group"` (the objective of pacs' grpo), no gradient
  checkpointing, bf16 off, `use_cpu=True`. A `TrainerCallback` takes each step's time (from
  `on_step_begin` to `on_step_end`: generation, reward, loss, backward, optimizer step) and the
  logged mean reward.
- `pacs train --config builtin:demo ... algorithm.name=grpo`, then `algorithm.name=pacs`, both with
  32 prompts per step and one mini-batch (one update), reading `time/step_s` and `reward/mean` from
  the run's `metrics.jsonl`.

Each row gives the median step time over steps 4-20 (the first steps warm up), its ratio to TRL's
and the mean reward over the last 5 steps. The runs draw their own prompt orders and samples, so
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
`.venv/bin/python benchmarks/vs_trl.py [--steps 20] [--trl-venv .peer-venvs/trl]`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from peer_venvs import PEER_VENVS, PEERS, peer_python

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TRL_VENV = PEER_VENVS / "trl"
REQUIREMENTS = REPO / "benchmarks" / PEERS["trl"][0]
DATA = "builtin:arithmetic?max_operand=19"
PROMPTS, N, MAX_NEW_TOKENS, LR = 32, 8, 16, 1e-4
FIRST_TIMED_STEP, LAST_STEPS = 4, 5
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


def trl_worker(model_dir: str, steps: int, out_path: str) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from pacs.data.loading import load_rows
    from pacs.rewards.arithmetic import arithmetic_score

    rows = load_rows(DATA, default_split="train")
    dataset = Dataset.from_list([{"prompt": row["prompt"], "ground_truth": row["reward_model"]["ground_truth"]} for row in rows])

    def arithmetic_reward(completions, ground_truth, **_) -> list[float]:
        return [arithmetic_score(completion[-1]["content"], truth) for completion, truth in zip(completions, ground_truth)]

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
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as output_dir:
        config = GRPOConfig(
            output_dir=output_dir,
            use_cpu=True,
            bf16=False,
            fp16=False,
            seed=0,
            max_steps=steps,
            per_device_train_batch_size=PROMPTS * N,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            num_generations=N,
            max_completion_length=MAX_NEW_TOKENS,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            beta=0.0,
            loss_type="dr_grpo",
            scale_rewards="group",
            learning_rate=LR,
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
            reward_funcs=arithmetic_reward,
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


# ---------------------------------------------------------------- driver (runs in pacs' venv)


def run_logged(command: list[str], log_path: Path, what: str) -> None:
    """Run `command` with its output in `log_path`; on failure print the log's tail and exit."""
    start = time.perf_counter()
    print(f"{what} ...", flush=True)
    with log_path.open("w") as log:
        code = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO).returncode
    if code != 0:
        tail = log_path.read_text().splitlines()[-40:]
        sys.exit(f"{what} failed (exit {code}); the end of its output:\n" + "\n".join(tail))
    print(f"{what}: {time.perf_counter() - start:.0f} s", flush=True)


def pacs_run(algorithm: str, model_dir: Path, steps: int, work: Path) -> tuple[list[float], list[float]]:
    pacs = Path(sys.executable).parent / "pacs"
    output_dir = work / f"pacs-{algorithm}"
    command = [
        str(pacs), "train", "--config", "builtin:demo", f"model.path={model_dir}", f"train.steps={steps}",
        f"train.batch_size={PROMPTS}", f"train.mini_batch_size={PROMPTS}", f"train.micro_batch_size={PROMPTS * N}",
        "train.eval_every=0", "train.save_every=0", "data.val=null", f"output_dir={output_dir}",
        f"algorithm.name={algorithm}",
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
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    parser.add_argument("--trl-venv", type=Path, default=DEFAULT_TRL_VENV, help="the TRL venv (default %(default)s)")
    parser.add_argument("--trl-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_worker:
        trl_worker(args.model_dir, args.steps, args.out)
        return
    if args.steps <= FIRST_TIMED_STEP:
        parser.error(f"--steps must be more than {FIRST_TIMED_STEP}")

    import torch
    from rich.console import Console
    from rich.table import Table

    from pacs.train.builtin_models import warm_started_tiny

    model_dir = warm_started_tiny(0, show_progress=False)
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        work = Path(tmp)
        python = peer_python(args.trl_venv.resolve(), REQUIREMENTS)
        trl_out = work / "trl.json"
        run_logged(
            [str(python), __file__, "--trl-worker", "--model-dir", str(model_dir), "--steps", str(args.steps),
             "--out", str(trl_out)],
            work / "trl.log",
            f"TRL GRPOTrainer, {args.steps} steps",
        )  # fmt: skip
        trl = json.loads(trl_out.read_text())
        results = {"TRL GRPOTrainer": (trl["step_s"], trl["reward"])}
        for algorithm in ("grpo", "pacs"):
            results[f"pacs {algorithm}"] = pacs_run(algorithm, model_dir, args.steps, work)

    def median_step(step_s: list[float]) -> float:
        return statistics.median(step_s[FIRST_TIMED_STEP - 1 :])

    trl_s = median_step(trl["step_s"])
    table = Table(title=f"{PROMPTS} prompts x {N} responses, {args.steps} steps, CPU")
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
        + f"\ns/step: median over steps {FIRST_TIMED_STEP}-{args.steps}; vs TRL: TRL's s/step / the row's (above 1: "
        f"faster); threads: {torch.get_num_threads()} (TRL worker: {trl['threads']}); python {sys.version.split()[0]}"
    )  # fmt: skip


if __name__ == "__main__":
    main()
