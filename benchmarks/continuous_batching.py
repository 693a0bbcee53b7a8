"""Tokens per second of the transformers engine's two ways to generate: `generate` on left-padded
batches and transformers' continuous batching (`rollout.hf.continuous_batching`), on the same
prompts with the same sampling, one engine call as a training step makes it (the continuous one
builds its manager and cache in every call, as a step does).

- `demo`: the warm-started tiny model (`builtin:tiny-arithmetic`), 32 prompts of
  `builtin:arithmetic?max_operand=19` x 8 samples, at most 16 new tokens (the demo's step);
- `100m`: the ~100M-parameter Qwen2 shape of `benchmarks/async_rollouts.py` with random weights,
  its end token's logit raised (`vs_trl.end_token_bias`) so that lengths are near-geometric with
  mean 32, cut at 128; 8 prompts x 4 samples.

Each engine runs `--repeats` times in the order generate, continuous, continuous, generate, ...
(so that a machine's drift falls on both); the table gives the median seconds per call, the
response tokens of the median call, tokens per second and continuous batching's against
`generate`'s. Float32, the process's torch threads, on the CPU or with `--device cuda` on one GPU. Run:
`.venv/bin/python benchmarks/continuous_batching.py [--shapes demo,100m] [--repeats 2] [--device cuda]`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from async_rollouts import SHAPE_100M
from rich.console import Console
from rich.table import Table
from vs_trl import end_token_bias

from pacs.data.loading import load_rows
from pacs.data.prompts import encode_prompts
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.models.tiny import save_builtin_tiny
from pacs.rollout.base import SamplingParams
from pacs.rollout.hf import TransformersEngine
from pacs.train.builtin_models import warm_started_tiny

SHAPES = {"demo": {"prompts": 32, "n": 8, "max_new_tokens": 16}, "100m": {"prompts": 8, "n": 4, "max_new_tokens": 128}}
MEAN_LENGTH_100M = 32


def model_and_prompts(shape: str, scratch: Path, device: str):
    """(model on `device`, tokenizer, prompt token ids) of `shape`."""
    if shape == "demo":
        model_dir = warm_started_tiny(0, show_progress=False)
        model = load_causal_lm(str(model_dir), dtype="float32")
    else:
        model_dir = save_builtin_tiny(scratch / "qwen2-100m", seed=0, **SHAPE_100M)
        model = load_causal_lm(str(model_dir), dtype="float32")
        end_id = load_tokenizer(str(model_dir)).eos_token_id
        end_token_bias(model, end_id, 1 / MEAN_LENGTH_100M, torch.randint(model.config.vocab_size, (4, 48)))
    tokenizer = load_tokenizer(str(model_dir))
    rows = load_rows("builtin:arithmetic?max_operand=19", default_split="train")[: SHAPES[shape]["prompts"]]
    return model.to(device), tokenizer, encode_prompts(tokenizer, rows, None).token_ids


def timed_calls(engine: TransformersEngine, prompts, params: SamplingParams) -> tuple[float, int]:
    """Seconds and response tokens of one engine call (seeded, so both engines draw alike)."""
    torch.manual_seed(0)
    start = time.perf_counter()
    rollouts = engine.generate(prompts, params)
    return time.perf_counter() - start, int(rollouts.response_mask.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="demo,100m", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--repeats", type=int, default=2, help="calls of each engine (default 2)")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="where the model generates (default %(default)s)"
    )
    args = parser.parse_args()
    where = "one GPU" if args.device == "cuda" else f"{torch.get_num_threads()} threads"
    table = Table(title=f"generate against continuous batching, {where}, float32")
    for column in ("shape", "engine", "s/call", "response tokens", "tokens/s", "vs generate"):
        table.add_column(column, justify="left" if column in ("shape", "engine") else "right")
    with tempfile.TemporaryDirectory(prefix="continuous-batching-") as scratch:
        for shape in args.shapes.split(","):
            model, tokenizer, prompts = model_and_prompts(shape, Path(scratch), args.device)
            settings = SHAPES[shape]
            params = SamplingParams(n=settings["n"], max_new_tokens=settings["max_new_tokens"], return_logprobs=True)
            engines = {
                "generate": TransformersEngine(model, tokenizer),
                "continuous": TransformersEngine(model, tokenizer, continuous_batching=True),
            }
            calls: dict[str, list[tuple[float, int]]] = {name: [] for name in engines}
            for repeat in range(args.repeats):
                for name in ("generate", "continuous") if repeat % 2 == 0 else ("continuous", "generate"):
                    calls[name].append(timed_calls(engines[name], prompts, params))
            rates = {}
            for name, measured in calls.items():
                seconds, tokens = sorted(measured)[len(measured) // 2]
                rates[name] = statistics.median(count / time_s for time_s, count in measured)
                versus = f"{rates[name] / rates['generate']:.2f}x"
                table.add_row(shape, name, f"{seconds:.3f}", str(tokens), f"{rates[name]:.0f}", versus)
    Console().print(table)


if __name__ == "__main__":
    main()
