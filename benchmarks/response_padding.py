"""What running responses of different lengths in length buckets saves in log-prob passes.

A training pass pads every response of a micro-batch to the longest one. `length_buckets` sorts
the rows by length and runs a forward per bucket, each padded to its own longest row
(min(`MAX_BUCKETS`, rows) forwards: the count depends on the rows alone, as DDP and FSDP need).
This script times log-prob passes with buckets and with one bucket (`MAX_BUCKETS = 1`, the way
before), in one process, on the warm-started tiny model:

- "vs_trl work": 32 prompts x 8 responses sampled by the model (at most 16 tokens, ~11 on
  average), one micro-batch of 256 rows, as in `benchmarks/vs_trl.py`;
- "long tail": the same 256 rows with responses of 1 to 256 random tokens, lengths drawn
  log-uniformly (a reasoning model's mix of short and long answers), micro-batches of 64.

Each is timed as a no-grad pass and as forward + backward, median of `--repeats`. Timings on
shared machines are noisy: run it on a quiet machine and compare the ratios. Run:
`.venv/bin/python benchmarks/response_padding.py [--repeats 5]`.
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console
from rich.table import Table
from shared_prompts import median_seconds, warm_started_model_and_prompts

from pacs.rollout.base import SamplingParams
from pacs.rollout.hf import TransformersEngine
from pacs.train import logprobs as logprobs_module
from pacs.train.batch import PolicyBatch

PROMPTS, N, MAX_NEW_TOKENS, LONGEST = 32, 8, 16, 256


def long_tail(batch: PolicyBatch, vocab_size: int) -> PolicyBatch:
    """`batch` with its responses replaced by random tokens of log-uniform lengths in [1, LONGEST]."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.exp(torch.rand(len(batch), generator=generator) * torch.log(torch.tensor(float(LONGEST)))).long()
    mask = (torch.arange(LONGEST) < lengths.unsqueeze(1)).float()
    ids = torch.randint(0, vocab_size, (len(batch), LONGEST), generator=generator) * mask.long()
    return PolicyBatch(
        prompt_ids=batch.prompt_ids,
        prompt_mask=batch.prompt_mask,
        response_ids=ids,
        response_mask=mask,
        rewards=batch.rewards,
        old_logprobs=torch.zeros_like(mask),
        entropy=torch.zeros_like(mask),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer, model, prompts = warm_started_model_and_prompts(PROMPTS)
    engine = TransformersEngine(model, tokenizer, max_sequences_per_call=PROMPTS * N)
    rollouts = engine.generate(prompts.token_ids, SamplingParams(n=N, temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW_TOKENS))
    sampled = PolicyBatch.from_rollouts(rollouts, torch.zeros(PROMPTS * N), torch.float32)
    works = [("vs_trl work", sampled, PROMPTS * N), ("long tail", long_tail(sampled, model.config.vocab_size), 64)]

    def passes(batch: PolicyBatch, micro_batch_size: int, with_grad: bool, max_buckets: int):
        def run():
            logprobs_module.MAX_BUCKETS = max_buckets
            model.train(with_grad)
            with torch.set_grad_enabled(with_grad):
                for start in range(0, len(batch), micro_batch_size):
                    result = logprobs_module.response_logprobs(model, batch.rows(slice(start, start + micro_batch_size)))
                    if with_grad:
                        result.sum().backward()
            model.zero_grad(set_to_none=True)

        return run

    buckets = logprobs_module.MAX_BUCKETS
    table = Table(title=f"length buckets in log-prob passes: median of {args.repeats}, {torch.get_num_threads()} threads")
    for column in ("work", "pass", "padded: 1 bucket", "buckets", "1 bucket s", "buckets s", "ratio"):
        table.add_column(column, justify="right" if column not in ("work", "pass") else "left")
    for name, batch, micro_batch_size in works:
        lengths = batch.response_mask.sum(dim=1).long() - 1  # the response forward runs the tokens after the first
        one, many = 0, 0
        for start in range(0, len(batch), micro_batch_size):
            micro = lengths[start : start + micro_batch_size]
            one += len(micro) * int(micro.max())
            many += sum(len(rows) * int(micro[rows].max()) for rows in logprobs_module.length_buckets(micro))
        for label, with_grad in (("no grad", False), ("fwd+bwd", True)):
            single_s = median_seconds(passes(batch, micro_batch_size, with_grad, 1), args.repeats)
            bucketed_s = median_seconds(passes(batch, micro_batch_size, with_grad, buckets), args.repeats)
            table.add_row(
                name, label, str(one), str(many), f"{single_s:.3f}", f"{bucketed_s:.3f}", f"{bucketed_s / single_s:.2f}"
            )
    console = Console(width=100)
    console.print(table)
    real = [int(batch.response_mask.sum()) - len(batch) for _, batch, _ in works]
    console.print(
        f"padded: tokens the response forwards run (each row's tokens after the first; real ones: {real[0]} in the "
        f"vs_trl work, {real[1]} in the long tail); ratio: buckets s / 1 bucket s"
    )


if __name__ == "__main__":
    main()
