"""What padding-free update passes (`train.padding_free`) save, or cost, against the padded ones.

Times one step's policy update (PACS, one mini-batch, one epoch: `update_policy`) with the padded
passes (each group's prompt run once, responses in length buckets) and with the packed ones (rows
end to end in bins of the longest row, restarting position ids, a causal mask blocked per row),
median of `--repeats`, on two shapes with random weights and random tokens:

- `demo`: the built-in tiny model, 32 prompts x 8 responses, prompts of 8-24 tokens, responses of
  1-16 (the demo's micro-batch of 256 rows);
- `100m`: the ~100M-parameter Qwen2 shape of `benchmarks/async_rollouts.py`, 4 prompts x 4
  responses, prompts of 16-32 tokens, responses of 1-128 tokens drawn log-uniformly, micro-batches of 8.

Run: `.venv/bin/python benchmarks/padding_free.py [--shapes demo,100m] [--repeats 3]`.
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

SHAPES = {
    "demo": {"model": {}, "prompts": 32, "n": 8, "prompt": (8, 24), "response": 16, "micro": 256},
    "100m": {"model": SHAPE_100M, "prompts": 4, "n": 4, "prompt": (16, 32), "response": 128, "micro": 8},
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


def update_seconds(model, batch: PolicyBatch, shape: dict, padding_free: bool, repeats: int) -> float:
    """Median seconds of one step's update (one mini-batch of every row, one epoch)."""
    algorithm = PACS(shape["n"])
    settings = UpdateSettings(
        mini_batch_size=shape["prompts"], micro_batch_size=shape["micro"], epochs=1, grad_clip=1.0, padding_free=padding_free
    )
    times = []
    for _ in range(repeats + 1):  # the first warms up
        trained = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-5)
        start = time.perf_counter()
        update_policy(trained, optimizer, World.single(), copy.deepcopy(batch), algorithm, settings)
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="demo,100m")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    table = Table("shape", "rows", "tokens (real)", "padded s", "padding-free s", "padding-free / padded")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.shapes.split(","):
            shape = SHAPES[name]
            model = load_causal_lm(str(save_builtin_tiny(Path(scratch) / name, seed=0, **shape["model"])), dtype="float32")
            batch = ragged_batch(shape, model.config.vocab_size)
            fill_rollout_logprobs(model, batch, slice(None), micro_batch_size=shape["micro"], temperature=1.0)
            padded = update_seconds(model, batch, shape, False, args.repeats)
            packed = update_seconds(model, batch, shape, True, args.repeats)
            tokens = int(batch.prompt_mask.sum() + batch.response_mask.sum())
            table.add_row(name, str(len(batch)), str(tokens), f"{padded:.3f}", f"{packed:.3f}", f"{packed / padded:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
