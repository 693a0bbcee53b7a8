"""What the closed-form first update saves, and what the micro-batch size costs.

PACS needs dL/dr for the whole mini-batch before any micro-batch can back-propagate. On the first
update after a rollout the policy equals the rollout policy and r is known without a model pass;
on later (off-policy) updates a no-grad forward pass over the mini-batch computes it. This script
times one step's update (one mini-batch, one epoch) both ways, at several micro-batch sizes, and
prints a table. Run: `.venv/bin/python benchmarks/update_cost.py [--prompts 32] [--n 8]`.
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

from pacs.algos.pacs import PACS
from pacs.distributed.world import World
from pacs.models.loading import load_causal_lm
from pacs.models.tiny import save_builtin_tiny
from pacs.rollout.base import pad_rows
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import response_logprobs_no_grad
from pacs.train.update import UpdateSettings, update_policy


class ForcedPass(PACS):
    """PACS, but always computing the current log-probs with a no-grad pass."""

    def prepare_update(self, minibatch, current_logprobs, policy_is_rollout_policy, totals=None):
        return super().prepare_update(minibatch, current_logprobs, False, totals)


def make_batch(prompts: int, n: int, prompt_length: int, response_length: int, vocab: int) -> PolicyBatch:
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, vocab, (prompts * n, prompt_length), generator=generator)
    response_ids = torch.randint(0, vocab, (prompts * n, response_length), generator=generator)
    lengths = torch.randint(1, response_length + 1, (prompts * n,), generator=generator)
    mask = pad_rows([torch.ones(int(length)) for length in lengths], 0, left=False)
    rewards = (torch.rand(prompts * n, generator=generator) < 0.5).float()
    return PolicyBatch(
        prompt_ids, torch.ones_like(prompt_ids), response_ids, mask, rewards, torch.zeros_like(mask), torch.zeros_like(mask)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--prompt-length", type=int, default=48)
    parser.add_argument("--response-length", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = load_causal_lm(str(save_builtin_tiny(Path(scratch) / "tiny")))
    batch = make_batch(args.prompts, args.n, args.prompt_length, args.response_length, model.config.vocab_size)
    batch.old_logprobs = response_logprobs_no_grad(model, batch, micro_batch_size=64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    world = World.single()

    def seconds(algorithm, micro_batch_size: int) -> float:
        settings = UpdateSettings(mini_batch_size=args.prompts, micro_batch_size=micro_batch_size, epochs=1, grad_clip=1.0)
        times = []
        for _ in range(args.repeats + 1):
            start = time.perf_counter()
            update_policy(model, optimizer, world, batch, algorithm, settings)
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    rows = args.prompts * args.n
    table = Table(
        title=f"one PACS update of {rows} sequences ({args.prompts} prompts x n={args.n}), "
        f"prompt {args.prompt_length} + response {args.response_length} tokens, builtin:tiny, "
        f"{torch.get_num_threads()} CPU threads; median of {args.repeats}"
    )
    for column in ("micro-batch", "closed form (first update) s", "with no-grad pass s", "saved"):
        table.add_column(column, justify="right")
    for micro_batch_size in (args.n // 2 or 1, args.n * 4, rows):
        closed = seconds(PACS(args.n), micro_batch_size)
        forced = seconds(ForcedPass(args.n), micro_batch_size)
        table.add_row(str(micro_batch_size), f"{closed:.3f}", f"{forced:.3f}", f"{100 * (1 - closed / forced):.0f}%")
    Console().print(table)


if __name__ == "__main__":
    main()
