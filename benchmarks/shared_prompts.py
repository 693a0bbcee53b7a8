"""What running each prompt once per group saves, on the demo's work.

The demo's step: 64 prompts of ~42 tokens x 8 responses of at most 16 tokens, on the warm-started
tiny model. Prompt tokens are ~80% of every sequence, and each prompt is repeated for its 8
responses. This script times, the plain way and the shared way, in one process:

- generation: `generate(num_return_sequences=8)` (every prompt run 8 times) against the engine
  (each prompt's cache computed once and repeated);
- a no-grad log-prob pass and a forward + backward log-prob pass over the 512 sequences, in
  micro-batches of 128: one forward over [prompt | response] against a forward over the distinct
  prompts and one over the responses on the repeated cache.

It prints the median of `--repeats` timings of each and their ratio. Timings on shared machines are
noisy: run it on a quiet machine and compare the ratios. Run:
`.venv/bin/python benchmarks/shared_prompts.py [--repeats 5]`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from rich.console import Console
from rich.table import Table
from transformers import GenerationConfig

from pacs.data.loading import load_rows
from pacs.data.prompts import encode_prompts
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.rollout.base import SamplingParams, pad_rows
from pacs.rollout.hf import TransformersEngine
from pacs.train import logprobs as logprobs_module
from pacs.train.batch import PolicyBatch
from pacs.train.builtin_models import warm_started_tiny

PROMPTS, N, MAX_NEW_TOKENS, MICRO_BATCH = 64, 8, 16, 128


def median_seconds(run, repeats: int) -> float:
    run()  # warm-up
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        timings.append(time.perf_counter() - start)
    return statistics.median(timings)


def warm_started_model_and_prompts(num_prompts: int):
    """The demo's warm-started tiny model (seed 0), its tokenizer and the first `num_prompts`
    training prompts of the demo's task, encoded."""
    model_dir = warm_started_tiny(0, show_progress=False)
    tokenizer, model = load_tokenizer(str(model_dir)), load_causal_lm(str(model_dir))
    rows = load_rows("builtin:arithmetic?max_operand=19", default_split="train")[:num_prompts]
    return tokenizer, model, encode_prompts(tokenizer, rows, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer, model, prompts = warm_started_model_and_prompts(PROMPTS)
    engine = TransformersEngine(model, tokenizer, max_sequences_per_call=PROMPTS * N)
    params = SamplingParams(n=N, temperature=1.0, top_p=1.0, max_new_tokens=MAX_NEW_TOKENS)
    rollouts = engine.generate(prompts.token_ids, params)
    batch = PolicyBatch.from_rollouts(rollouts, torch.zeros(PROMPTS * N), torch.float32)

    chunk = [torch.tensor(ids) for ids in prompts.token_ids]
    input_ids = pad_rows(chunk, tokenizer.pad_token_id, left=True)
    attention_mask = pad_rows([torch.ones_like(ids) for ids in chunk], 0, left=True)
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        max_new_tokens=MAX_NEW_TOKENS,
        num_return_sequences=N,
        eos_token_id=list(engine.eos_ids),
        pad_token_id=tokenizer.pad_token_id,
    )

    def plain_generation():
        with torch.no_grad():
            model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)

    def passes(terms, with_grad: bool):
        def run():
            model.train(with_grad)
            with torch.set_grad_enabled(with_grad):
                for start in range(0, len(batch), MICRO_BATCH):
                    micro = batch.rows(slice(start, start + MICRO_BATCH))
                    result = terms(micro)
                    if with_grad:
                        result.sum().backward()
            model.zero_grad(set_to_none=True)

        return run

    plain_terms = lambda micro: logprobs_module._plain_terms(model, micro, 1.0, False)
    shared_terms = lambda micro: logprobs_module.response_logprobs(model, micro)
    rows = [
        ("generation (64 prompts x 8)", plain_generation, lambda: engine.generate(prompts.token_ids, params)),
        ("log-probs, no grad (512 sequences)", passes(plain_terms, False), passes(shared_terms, False)),
        ("log-probs, forward + backward", passes(plain_terms, True), passes(shared_terms, True)),
    ]
    table = Table(title=f"each prompt once per group: median of {args.repeats}, {torch.get_num_threads()} threads")
    for column in ("work", "plain s", "shared s", "shared / plain"):
        table.add_column(column, justify="right" if column != "work" else "left")
    for name, plain, shared in rows:
        plain_s, shared_s = median_seconds(plain, args.repeats), median_seconds(shared, args.repeats)
        table.add_row(name, f"{plain_s:.3f}", f"{shared_s:.3f}", f"{shared_s / plain_s:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
