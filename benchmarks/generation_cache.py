"""The transformers engine's preallocated key/value cache against a growing one, at several
`max_new_tokens` (`pacs.rollout.hf.TransformersEngine._generate_samples`).

The engine copies each prompt's cache into a `StaticCache` of P + max_new_tokens positions, so that
a new token is written in place instead of the cache copying itself once per token; but every
decoding step then attends over all P + max_new_tokens positions (masked), where a growing cache
attends over the tokens so far. Which costs less depends on how far the batch's longest response
gets towards `max_new_tokens`, so two models:

- `warm`: the warm-started tiny model (`builtin:tiny-arithmetic`) on `builtin:arithmetic`, whose
  answers end within 16 tokens whatever `max_new_tokens` allows;
- `random`: the tiny shape with random weights, whose end token comes about once in 100 tokens, so
  that of 256 responses some run to `max_new_tokens`.

32 prompts x 8 samples, float32, the process's threads; each cache in turn (static, growing,
growing, static, ...), the same seed for both; the table gives the median seconds of a call,
growing's against static's, and the responses' mean and longest length. Run:
`.venv/bin/python benchmarks/generation_cache.py [--max-new-tokens 16,128,512] [--repeats 2]`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import pacs.rollout.hf as hf
from pacs.data.loading import load_rows
from pacs.data.prompts import encode_prompts
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.models.tiny import save_builtin_tiny
from pacs.rollout.base import SamplingParams
from pacs.train.builtin_models import warm_started_tiny

PROMPTS, N = 32, 8


def timed_call(engine: hf.TransformersEngine, prompts: list[list[int]], params: SamplingParams, static: bool):
    """(seconds, response lengths) of one seeded call with the preallocated cache or the growing one."""
    preallocate = hf._preallocated
    if not static:
        hf._preallocated = lambda cache, config, max_length: cache
    try:
        torch.manual_seed(0)
        start = time.perf_counter()
        rollouts = engine.generate(prompts, params)
        return time.perf_counter() - start, rollouts.response_mask.sum(dim=1)
    finally:
        hf._preallocated = preallocate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", default="16,128,512", help="comma-separated (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=2, help="calls of each cache per row (default %(default)s)")
    args = parser.parse_args()
    table = Table(
        title=f"preallocated (static) against growing cache, {PROMPTS} prompts x {N}, {torch.get_num_threads()} threads"
    )
    for column in ("model", "max_new_tokens", "static s", "growing s", "growing / static", "mean length", "longest"):
        table.add_column(column, justify="left" if column == "model" else "right")
    rows = load_rows("builtin:arithmetic?max_operand=19", default_split="train")[:PROMPTS]
    with tempfile.TemporaryDirectory(prefix="generation-cache-") as scratch:
        for name, directory in (("warm", warm_started_tiny(0, show_progress=False)),
                                ("random", save_builtin_tiny(Path(scratch) / "random", seed=0))):  # fmt: skip
            model, tokenizer = load_causal_lm(str(directory), dtype="float32"), load_tokenizer(str(directory))
            engine, prompts = hf.TransformersEngine(model, tokenizer), encode_prompts(tokenizer, rows, None).token_ids
            for max_new_tokens in (int(value) for value in args.max_new_tokens.split(",")):
                params = SamplingParams(n=N, max_new_tokens=max_new_tokens, return_logprobs=True)
                seconds: dict[bool, list[float]] = {True: [], False: []}
                for repeat in range(args.repeats):
                    for static in (True, False) if repeat % 2 == 0 else (False, True):
                        elapsed, lengths = timed_call(engine, prompts, params, static)
                        seconds[static].append(elapsed)
                static_s, growing_s = statistics.median(seconds[True]), statistics.median(seconds[False])
                table.add_row(name, str(max_new_tokens), f"{static_s:.3f}", f"{growing_s:.3f}", f"{growing_s / static_s:.2f}x",
                              f"{lengths.float().mean():.1f}", str(int(lengths.max())))  # fmt: skip
    Console().print(table)


if __name__ == "__main__":
    main()
