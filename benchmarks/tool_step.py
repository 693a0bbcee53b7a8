"""A multi-turn training step against a single-turn step of the same total tokens (issue 55's goal:
at most 1.3x on a CPU).

    OMP_NUM_THREADS=1 python benchmarks/tool_step.py                      # tiny and small shapes
    OMP_NUM_THREADS=1 python benchmarks/tool_step.py --shapes tiny --steps 8 --repeats 2

Each run is `pacs train --config builtin:demo` in this process (two updates a step as the demo's,
`data.val=null`, no checkpoint but the final one), on a randomly initialised model of the built-in
character tokenizer (`pacs.models.tiny.save_builtin_tiny`): `tiny`, the built-in tiny model's
shape, or `small` (`SHAPES`), with `--batch` prompts x `--n` responses of exactly `--tokens`
tokens a step; a pair of runs per shape that differ only in the tool:

- `single-turn`: every response one turn of `--tokens` sampled tokens;
- `multi-turn`: `rollout.tools=python`, `rollout.max_turns=3`, every turn but the last a call of
  ``print(1024)`` after its first `--call-after` tokens (a scripted call: the random model writes
  no python block, so `pacs.rollout.multiturn.tool_call_end` is replaced, as the tests do), the
  tool's output block appended, and the last turn filling the response to `--tokens` tokens.

No response ends early in either run: no token stops generation (`end_of_sequence_ids` gives
none), so both runs' steps hold the same prompts and the same number of response tokens, the
tool's among the multi-turn run's. From each run's metrics.jsonl, leaving out the first step (it
starts the tool's workers and warms the allocators): the median `time/step_s` and of its phases,
the tool calls per response, and the tokens the engine sampled per response (every turn's, those
dropped after a call included; counted around `TransformersEngine.generate`, over every step); the
ratio is the multi-turn step's median over the single-turn one's. With `--repeats` > 1 the pairs
alternate (single, multi, single, multi, ...) and each row is one run. Timings mean something only
on a quiet machine: the table gives the 1-minute load average before and after each run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

SHAPES = {
    "tiny": {},
    "small": {"hidden_size": 256, "num_layers": 4, "num_heads": 8, "num_kv_heads": 2, "intermediate_size": 1024},
}
"""`pacs.models.tiny.tiny_model_config`'s keywords per shape (`tiny`: the built-in one)."""
PHASES = ("generate", "tool", "score", "old_logprobs", "update_actor", "other")
TOOL_PROGRAM = "print(1024)"


def run_steps(model_dir: Path, output_dir: Path, args: argparse.Namespace, *, tools: bool) -> list[dict]:
    """One in-process training run; the lines of its metrics.jsonl."""
    from pacs.config import load_config
    from pacs.train.metrics import read_metrics
    from pacs.train.trainer import train

    overrides = [
        f"model.path={model_dir}",
        f"output_dir={output_dir}",
        f"train.steps={args.steps}",
        f"train.batch_size={args.batch}",
        f"train.mini_batch_size={args.batch // 2}",
        f"rollout.n={args.n}",
        f"data.max_response_length={args.tokens}",
        "data.val=null",
        "train.save_every=0",
        *(["rollout.tools=python", "rollout.max_turns=3", "rollout.tool_workers=1"] if tools else []),
    ]
    train(load_config("builtin:demo", overrides), show_progress=False)
    return read_metrics(output_dir)


def count_sampled_tokens(engine_class) -> list[int]:
    """A list that `engine_class.generate` appends each call's number of sampled tokens to (the
    tokens each turn generates, kept or dropped after its call)."""
    generate, counts = engine_class.generate, []

    def counted(self, prompt_token_ids, params):
        rollouts = generate(self, prompt_token_ids, params)
        counts.append(int(rollouts.response_mask.sum()))
        return rollouts

    engine_class.generate = counted
    return counts


def summary(lines: list[dict], tokens: int) -> dict[str, float]:
    """Medians of the step's time and phases over every step but the first; checks that every
    response had exactly `tokens` tokens."""
    assert all(line["response_length/mean"] == tokens for line in lines), [line["response_length/mean"] for line in lines]
    later = lines[1:]
    medians = {phase: statistics.median(line.get(f"time/{phase}_s", 0.0) for line in later) for phase in PHASES}
    medians["step"] = statistics.median(line["time/step_s"] for line in later)
    medians["calls"] = statistics.median(line.get("rollout/tool_calls_mean", 0.0) for line in later)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tiny,small")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8, help="prompts per step")
    parser.add_argument("--n", type=int, default=8, help="responses per prompt")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per response (model and tool together)")
    parser.add_argument("--call-after", type=int, default=8, help="model tokens of each turn before its call")
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs per shape")
    args = parser.parse_args()

    from pacs.models.tiny import save_builtin_tiny
    from pacs.rollout import hf, multiturn

    hf.end_of_sequence_ids = lambda generation_config, tokenizer: ()
    multiturn.tool_call_end = lambda ids, tokenizer: (args.call_after, TOOL_PROGRAM) if len(ids) >= args.call_after else None
    sampled = count_sampled_tokens(hf.TransformersEngine)

    print(
        f"{args.batch} prompts x {args.n} responses of {args.tokens} tokens a step; calls after {args.call_after} "
        f"tokens of a turn, 3 turns at most; medians of steps 2-{args.steps}"
    )
    print(
        "| shape | run | load before / after | step (s) | "
        + " | ".join(f"{phase} (s)" for phase in PHASES)
        + " | calls | sampled tokens | ratio |"
    )
    print("|---|---|---|---|" + "---|" * len(PHASES) + "---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for shape in args.shapes.split(","):
            model_dir = save_builtin_tiny(Path(scratch) / shape / "model", seed=0, **SHAPES[shape])
            for repeat in range(args.repeats):
                single_step = None
                for tools in (False, True):
                    load_before = os.getloadavg()[0]
                    sampled.clear()
                    lines = run_steps(model_dir, Path(scratch) / shape / f"run-{repeat}-{tools}", args, tools=tools)
                    medians = summary(lines, args.tokens)
                    single_step = single_step or medians["step"]
                    ratio = f"{medians['step'] / single_step:.2f}x" if tools else "1"
                    cells = " | ".join(f"{medians[phase]:.3f}" for phase in PHASES)
                    name = "multi-turn" if tools else "single-turn"
                    per_response = sum(sampled) / (args.steps * args.batch * args.n)
                    print(
                        f"| {shape} | {name} | {load_before:.1f} / {os.getloadavg()[0]:.1f} | {medians['step']:.3f} | "
                        f"{cells} | {medians['calls']:.1f} | {per_response:.1f} | {ratio} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
