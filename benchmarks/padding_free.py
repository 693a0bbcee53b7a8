"""What padding-free passes (`train.padding_free`) and micro-batches budgeted in tokens
(`train.micro_batch_tokens`) save, or cost, against padded passes over fixed micro-batches.

Times one step's policy update (PACS, one mini-batch, one epoch: `update_policy`) and its
old-log-prob pass (`fill_rollout_logprobs`) with the padded passes (each group's prompt run once,
responses in length buckets) and with the packed ones (rows end to end in bins of the longest row,
restarting position ids, a causal mask blocked per row), each over the shape's fixed micro-batches
and, with `--tokens N`, over micro-batches of at most N real tokens (and at most the shape's
`budgeted_rows` rows); median of `--repeats` rounds after a warm-up round, each round running
every variant in turn (so a machine whose load drifts slows them alike), in wall-clock seconds
and in this process's CPU seconds (which waiting for a busy core does not add to: the figure to
compare on a shared machine, with one thread), on shapes with random weights and random tokens:

- `demo`: the built-in tiny model, 32 prompts x 8 responses, prompts of 8-24 tokens, responses of
  1-16 (the demo's micro-batch of 256 rows);
- `100m`: the ~100M-parameter Qwen2 shape of `benchmarks/async_rollouts.py`, 4 prompts x 4
  responses, prompts of 16-32 tokens, responses of 1-128 tokens drawn log-uniformly, micro-batches of 8;
- `13m`: a 13M-parameter Qwen2 (6 layers of 384), 8 prompts x 4 responses, prompts of 16-32
  tokens, responses of 1-256 tokens drawn log-uniformly, micro-batches of 8 rows (of 32 with a
  token budget): a ragged shape that runs in a few minutes on one CPU thread.

Run: `.venv/bin/python benchmarks/padding_free.py [--shapes demo,100m,13m] [--repeats 3] [--tokens 512]`.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import torch
from async_rollouts import SHAPE_100M
from rich.console import Console
from rich.table import Table

from pacs.algos.pacs import PACS
from pacs.distributed.world import World
from pacs.models.loading import load_causal_lm
from pacs.models.tiny import save_builtin_tiny
from pacs.rollout.base import pad_rows
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import fill_rollout_logprobs
from pacs.train.update import UpdateSettings, update_policy

SHAPE_13M = {"hidden_size": 384, "num_layers": 6, "num_heads": 6, "num_kv_heads": 2, "intermediate_size": 1536}
"""`pacs.models.tiny.tiny_model_config`'s keywords for the `13m` shape."""
SHAPES = {
    "demo": {"model": {}, "prompts": 32, "n": 8, "prompt": (8, 24), "response": 16, "micro": 256, "budgeted_rows": 256},
    "100m": {"model": SHAPE_100M, "prompts": 4, "n": 4, "prompt": (16, 32), "response": 128, "micro": 8, "budgeted_rows": 16},
    "13m": {"model": SHAPE_13M, "prompts": 8, "n": 4, "prompt": (16, 32), "response": 256, "micro": 8, "budgeted_rows": 32},
}  # fmt: skip


def ragged_batch(shape: dict, vocab_size: int) -> PolicyBatch:
    """`shape`'s prompts x n rows: one prompt per group, uniform prompt lengths, response lengths
    log-uniform in [1, shape's longest], random tokens and rewards."""
    generator = torch.Generator().manual_seed(0)
    low, high = shape["prompt"]
    prompts, responses = [], []
    for _ in range(shape["prompts"]):
        prompt = torch.randint(
            1, vocab_size, (int(torch.randint(low, high + 1, (1,), generator=generator)),), generator=generator
        )
        for _ in range(shape["n"]):
            prompts.append(prompt)
            length = int(torch.exp(torch.rand(1, generator=generator) * torch.log(torch.tensor(float(shape["response"])))))
            responses.append(torch.randint(1, vocab_size, (max(1, length),), generator=generator))
    mask = pad_rows([torch.ones(len(response)) for response in responses], 0, left=False)
    return PolicyBatch(
        prompt_ids=pad_rows(prompts, 0, left=True),
        prompt_mask=pad_rows([torch.ones_like(prompt) for prompt in prompts], 0, left=True),
        response_ids=pad_rows(responses, 0, left=False),
        response_mask=mask,
        rewards=(torch.rand(len(responses), generator=generator) < 0.5).float(),
        old_logprobs=torch.zeros_like(mask),
        entropy=torch.zeros_like(mask),
    )


def settings_of(shape: dict, padding_free: bool, tokens: int | None) -> UpdateSettings:
    """One mini-batch of every row, one epoch; the shape's micro-batch rows, or its
    `budgeted_rows` and at most `tokens` tokens."""
    return UpdateSettings(
        mini_batch_size=shape["prompts"],
        micro_batch_size=shape["micro"] if tokens is None else shape["budgeted_rows"],
        epochs=1,
        grad_clip=1.0,
        padding_free=padding_free,
        micro_batch_tokens=tokens,
    )


def update_seconds(model, batch: PolicyBatch, shape: dict, settings: UpdateSettings) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one step's update."""
    trained = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-5)
    batch = copy.deepcopy(batch)
    start, cpu_start = time.perf_counter(), time.process_time()
    update_policy(trained, optimizer, World.single(), batch, PACS(shape["n"]), settings)
    return time.perf_counter() - start, time.process_time() - cpu_start


def old_logprob_seconds(model, batch: PolicyBatch, settings: UpdateSettings) -> tuple[float, float]:
    """Wall-clock and CPU seconds of the old-log-prob pass (no gradient) over every row."""
    filled = copy.deepcopy(batch)
    start, cpu_start = time.perf_counter(), time.process_time()
    fill_rollout_logprobs(
        model,
        filled,
        slice(None),
        micro_batch_size=settings.micro_batch_size,
        micro_batch_tokens=settings.micro_batch_tokens,
        padding_free=settings.padding_free,
        temperature=1.0,
    )
    return time.perf_counter() - start, time.process_time() - cpu_start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="demo,100m")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=None, help="also time micro-batches of at most this many tokens")
    args = parser.parse_args()
    table = Table(
        "shape", "rows", "tokens (real)", "passes", "micro-batches",
        "update s", "cpu s", "cpu / padded", "old log-probs s", "cpu s", "cpu / padded",
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.shapes.split(","):
            shape = SHAPES[name]
            model = load_causal_lm(str(save_builtin_tiny(Path(scratch) / name, seed=0, **shape["model"])), dtype="float32")
            batch = ragged_batch(shape, model.config.vocab_size)
            fill_rollout_logprobs(model, batch, slice(None), micro_batch_size=shape["micro"], temperature=1.0)
            tokens = str(int(batch.prompt_mask.sum() + batch.response_mask.sum()))
            variants = [
                (padding_free, budget, settings_of(shape, padding_free, budget))
                for budget in ((None, args.tokens) if args.tokens else (None,))
                for padding_free in (False, True)
            ]
            times: list[list[tuple[float, ...]]] = [[] for _ in variants]
            for _ in range(args.repeats + 1):  # the first round warms up; each round runs every variant in turn
                for timed, (_, _, settings) in zip(times, variants):
                    timed.append((*update_seconds(model, batch, shape, settings), *old_logprob_seconds(model, batch, settings)))
            medians = [[statistics.median(column) for column in zip(*timed[1:])] for timed in times]
            padded = medians[0]
            for (padding_free, budget, _), (update, update_cpu, old, old_cpu) in zip(variants, medians):
                table.add_row(
                    name,
                    str(len(batch)),
                    tokens,
                    "padding-free" if padding_free else "padded",
                    f"{shape['micro']} rows" if budget is None else f"<= {budget} tokens, <= {shape['budgeted_rows']} rows",
                    f"{update:.3f}",
                    f"{update_cpu:.3f}",
                    f"{update_cpu / padded[1]:.2f}x",
                    f"{old:.3f}",
                    f"{old_cpu:.3f}",
                    f"{old_cpu / padded[3]:.2f}x",
                )
    Console().print(table)


if __name__ == "__main__":
    main()
