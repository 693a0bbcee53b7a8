"""Peak memory of log-probs and entropy with Qwen2.5's vocabulary: full logits against chunks.

"Today's way" (until chunking; reimplemented here as `full_logits_logprobs`) builds the (B, R, V)
logits of the response positions, divides them by the temperature, takes logsumexp and, for the
entropy, a full log-distribution and its exp: about five fp32 copies of B x R x 151,936 numbers.
"Chunked" is `pacs.train.logprobs.response_logprobs`, which projects `tokens_per_chunk` response
tokens at a time inside the model's forward and recomputes each chunk in backward.

Each row runs in a fresh subprocess and reports its peak resident set (`ru_maxrss`), the RSS
peak already reached once the model is built (imports and weights: the baseline), and the wall
time of the measured work. The model is a randomly initialised tiny Qwen2 with vocabulary
151,936 (hidden 64, 2 layers, tied embeddings: 39 MB of float32 weights) and a character-level
tokenizer whose vocabulary is padded with `<|extra_i|>` tokens to the same size.

Rows:
- `logprobs R=...`: forward and backward of sum(log-probs) + sum(entropy) for 2 responses of R
  tokens after a 32-token prompt (what a micro-batch of an algorithm with an entropy term does).
  A today's-way row whose estimated peak (scaled from the 1,024-token row) would not fit in 85%
  of the memory available is skipped and its estimate printed.
- `PACS step R=1024`: one whole `pacs train` step (builtin:demo's PACS settings, 1 prompt x
  n = 2 responses of up to 1,024 sampled tokens, reward in-process): rollout, the rollout-policy
  pass with entropy, PACS's update, and the final checkpoint. The random policy almost never
  samples its end token, so both responses have 1,024 tokens (printed). Today's way is the same
  trainer with `response_logprobs` replaced by `full_logits_logprobs`.

Run: `.venv/bin/python benchmarks/logprob_memory.py [--lengths 1024 4096] [--no-train-step]`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

VOCAB_SIZE = 151_936
RESPONSES = 2
PROMPT_LENGTH = 32
TEMPERATURE = 1.0
WAYS = ("today", "chunked")


def peak_rss_bytes() -> int:
    """This process's peak resident set so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def save_wide_tiny(directory: Path) -> Path:
    """A tiny Qwen2 with Qwen2.5's vocabulary size and a matching tokenizer, saved to `directory`."""
    import transformers

    from pacs.models.tiny import build_char_tokenizer, tiny_model_config

    tokenizer = build_char_tokenizer()
    config = tiny_model_config(
        VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=256,
        max_positions=8192,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    tokenizer_file = directory / "tokenizer.json"
    spec = json.loads(tokenizer_file.read_text())
    vocab = spec["model"]["vocab"]
    vocab.update({f"<|extra_{token_id}|>": token_id for token_id in range(len(vocab), VOCAB_SIZE)})
    tokenizer_file.write_text(json.dumps(spec))
    return directory


def full_logits_logprobs(model, batch, *, temperature: float = 1.0, with_entropy: bool = False):
    """Today's way: (B, R) log-probs (and entropy) from the full (B, R, V) logits."""
    from pacs.train.logprobs import _sequence_inputs

    response_width = batch.response_ids.shape[1]
    logits = model(**_sequence_inputs(batch), logits_to_keep=response_width + 1).logits[:, :-1]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logits = logits / temperature
    normaliser = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1) - normaliser
    if not with_entropy:
        return logprobs
    log_distribution = logits - normaliser.unsqueeze(-1)
    entropy = -(log_distribution.exp() * log_distribution).sum(dim=-1)
    return logprobs, entropy


def measure_logprobs(way: str, length: int, model_dir: Path) -> dict:
    """Forward and backward of log-probs and entropy of 2 responses of `length` tokens."""
    from pacs.models.loading import load_causal_lm
    from pacs.train.batch import PolicyBatch
    from pacs.train.logprobs import response_logprobs

    model = load_causal_lm(str(model_dir)).train()
    generator = torch.Generator().manual_seed(0)
    prompt_ids = torch.randint(0, VOCAB_SIZE, (RESPONSES, PROMPT_LENGTH), generator=generator)
    response_ids = torch.randint(0, VOCAB_SIZE, (RESPONSES, length), generator=generator)
    mask = torch.ones(RESPONSES, length)
    batch = PolicyBatch(
        prompt_ids,
        torch.ones_like(prompt_ids),
        response_ids,
        mask,
        torch.zeros(RESPONSES),
        torch.zeros_like(mask),
        torch.zeros_like(mask),
    )
    compute = full_logits_logprobs if way == "today" else response_logprobs
    baseline = peak_rss_bytes()
    start = time.perf_counter()
    logprobs, entropy = compute(model, batch, temperature=TEMPERATURE, with_entropy=True)
    ((logprobs * mask).sum() + (entropy * mask).sum()).backward()
    return {"baseline": baseline, "peak": peak_rss_bytes(), "seconds": time.perf_counter() - start}


def measure_train_step(way: str, length: int, model_dir: Path) -> dict:
    """One `pacs train` step with 1 prompt x 2 responses of up to `length` tokens."""
    from pacs.config import load_config
    from pacs.train import logprobs as logprobs_module
    from pacs.train import update as update_module
    from pacs.train.trainer import train

    if way == "today":
        for module in (logprobs_module, update_module):
            module.response_logprobs = full_logits_logprobs
    baseline = peak_rss_bytes()
    with tempfile.TemporaryDirectory() as output_dir:
        config = load_config(
            "builtin:demo",
            [
                f"output_dir={output_dir}",
                f"model.path={model_dir}",
                "data.train=builtin:arithmetic?size=8",
                "data.val=null",
                "data.max_prompt_length=256",
                f"data.max_response_length={length}",
                "rollout.n=2",
                "train.steps=1",
                "train.batch_size=1",
                "train.mini_batch_size=1",
                "train.micro_batch_size=2",
                "train.save_every=0",
                "reward.num_workers=0",
            ],
        )
        start = time.perf_counter()
        result = train(config, show_progress=False)
    return {
        "baseline": baseline,
        "peak": peak_rss_bytes(),
        "seconds": time.perf_counter() - start,
        "response_length": result.last_metrics["response_length/mean"],
    }


def run_child(task: str, way: str, length: int, model_dir: Path) -> dict:
    completed = subprocess.run(
        [sys.executable, __file__, "--measure", task, way, str(length), "--model-dir", str(model_dir)],
        capture_output=True,
        text=True,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"{task} {way} R={length} failed:\n{completed.stderr[-4000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def available_memory_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def gib(value: float) -> str:
    return f"{value / 2**30:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--no-train-step", action="store_true", help="skip the whole-step rows")
    parser.add_argument("--measure", nargs=3, metavar=("TASK", "WAY", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        task, way, length = args.measure
        measure = measure_logprobs if task == "logprobs" else measure_train_step
        print(json.dumps(measure(way, int(length), args.model_dir)))
        return

    from rich.console import Console
    from rich.table import Table

    from pacs.train.logprobs import tokens_per_chunk

    table = Table(
        title=f"log-probs + entropy, vocabulary {VOCAB_SIZE:,}, {RESPONSES} responses, chunks of "
        f"{tokens_per_chunk(VOCAB_SIZE)} tokens, {torch.get_num_threads()} CPU threads; RSS in GiB"
    )
    for column in ("work", "way", "peak RSS", "baseline RSS", "peak - baseline", "seconds", "note"):
        table.add_column(column, justify="left" if column in ("work", "way", "note") else "right")
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = save_wide_tiny(Path(scratch) / "wide-tiny")
        measured: dict[tuple[str, str, int], dict] = {}
        jobs = [("logprobs", length) for length in args.lengths] + ([] if args.no_train_step else [("train_step", 1024)])
        for task, length in jobs:
            work = f"logprobs R={length}" if task == "logprobs" else f"PACS step R={length}"
            for way in WAYS:
                if task == "logprobs" and way == "today" and length > 1024 and 1024 in args.lengths:
                    reference = measured[("logprobs", "today", 1024)]
                    estimate = reference["baseline"] + (reference["peak"] - reference["baseline"]) * length / 1024
                    if estimate > 0.85 * available_memory_bytes():
                        table.add_row(work, way, f"~{gib(estimate)}", "", "", "", "skipped: estimated from R=1024")
                        continue
                result = measured[(task, way, length)] = run_child(task, way, length, model_dir)
                note = f"responses of {result['response_length']:.0f} tokens" if "response_length" in result else ""
                table.add_row(
                    work,
                    way,
                    gib(result["peak"]),
                    gib(result["baseline"]),
                    gib(result["peak"] - result["baseline"]),
                    f"{result['seconds']:.1f}",
                    note,
                )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
