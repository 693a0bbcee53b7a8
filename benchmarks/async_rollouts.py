"""Asynchronous rollouts (`rollout.max_staleness`): a training step's time and its phases at each staleness.

    python benchmarks/async_rollouts.py                                  # both workloads, staleness 0,1,2
    python benchmarks/async_rollouts.py --workloads demo --staleness 0,1 --json async.json
    python benchmarks/async_rollouts.py --workloads demo --staleness 0,1,1,0 --steps 20  # each value a run of its own

Workloads, each the demo's task (`builtin:arithmetic?max_operand=19`, scored by its real verifier):
- `demo`: the demo's work, `pacs train --config builtin:demo data.val=null` (64 prompts x 8
  responses of at most 16 tokens, two updates a step, `builtin:tiny-arithmetic`);
- `100m`: a ~100M-parameter Qwen2 shape (hidden 768, 12 layers, 12 heads with 2 key/value heads,
  intermediate 3072, tied embeddings: 101.6M parameters) with the built-in character tokenizer,
  randomly initialised and saved in a temporary directory (`pacs.models.tiny.save_builtin_tiny`),
  4 prompts x 4 responses of 128 tokens at most, two updates a step;
- `100m-sampling`: the same model, 1 prompt x 4 responses of 128 tokens at most, one update a
  step: on a CPU sampling (each token reads every weight, whatever the rows) then outlasts the
  update, so a push of weights meets the generator in the middle of a batch.

Each (workload, staleness K) is one `pacs train` process, with `rollout.max_staleness=K` added only
for K > 0 (so staleness 0 is the synchronous loop, on any pacs) and pacs's own thread choice
(`pacs.threads`: the user's OMP_NUM_THREADS / OMP_WAIT_POLICY are removed from its environment).
A pacs that does not know `rollout.max_staleness` refuses the run, and a run past `--timeout` is
killed with the processes it started; the row says which. From the run's
metrics.jsonl, leaving out the first step (it warms up allocators and kernels): the median
`time/step_s`, steps/s (1 / that median), the median of every `time/*_s` phase the run logged
(and of `rollout/generator_s`, the generator process's seconds, where there is one), and the
largest `rollout/staleness_max`.

Below each table, the arithmetic of a split of devices from staleness 0's phases: generation on a
device of its own overlapping everything else, a step takes max(generate, rest) + weight_sync,
where rest = step - generate - weight_sync (medians). The hf engine samples with the trainer's own
model, so its weight_sync is about 0 and the weights' transfer to a separate sampler is not in the
figure: it is a bound, not a measurement. Timings mean something only on a quiet machine: each row
gives the 1-minute load average before and after its run, and the thread count pacs chose.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE_100M = {"hidden_size": 768, "num_layers": 12, "num_heads": 12, "num_kv_heads": 2, "intermediate_size": 3072}
"""`pacs.models.tiny.tiny_model_config`'s keywords for the `100m` workload (101,558,784 parameters
with the 101-token character vocabulary)."""
WORKLOADS = {
    "demo": {"steps": 12, "overrides": []},
    "100m": {
        "steps": 4,
        "overrides": ["data.max_response_length=128", "train.batch_size=4", "rollout.n=4",
                      "train.mini_batch_size=2", "train.micro_batch_size=8"],
    },
    "100m-sampling": {
        "steps": 10,
        "overrides": ["data.max_response_length=128", "train.batch_size=1", "rollout.n=4",
                      "train.mini_batch_size=1", "train.micro_batch_size=4"],
    },
}  # fmt: skip
"""Workload -> default steps and `pacs train` overrides of `builtin:demo` (the 100m ones also set model.path)."""
COMMON_OVERRIDES = ["data.val=null", "train.save_every=0"]
PHASES = ("generate", "weight_sync", "score", "old_logprobs", "ref", "values", "update_actor", "update_critic",
          "wait_rollout", "other")  # fmt: skip
"""The phases of `pacs.train.timing.PhaseTimes` in the order the tables show them; any other
`time/*_s` a run logs follows them."""
GENERATOR_KEY = "rollout/generator_s"
"""An asynchronous run's seconds of generation per batch, in its generator process (the training
process logs only its wait, `time/wait_rollout_s`); shown after the phases."""
STALENESS_KEY = "rollout.max_staleness"
NOT_AVAILABLE = f"not available ({STALENESS_KEY} unknown to this pacs)"


def refuses_unknown(key: str, stderr: str) -> bool:
    """Whether `pacs train`'s `stderr` is its configuration error for a `key` it does not have."""
    return f"{key}: unknown key" in stderr


def build_100m(scratch: Path) -> Path:
    """The `100m` workloads' model and tokenizer, saved under `scratch`."""
    from pacs.models.tiny import save_builtin_tiny

    return save_builtin_tiny(scratch / "qwen2-100m", seed=0, **SHAPE_100M)


def train_command(workload: str, staleness: int, steps: int, output_dir: Path, model_dir: Path | None) -> list[str]:
    """The `pacs train` command line of one run."""
    overrides = [*WORKLOADS[workload]["overrides"], *COMMON_OVERRIDES, f"train.steps={steps}", f"output_dir={output_dir}"]
    if model_dir is not None:
        overrides.append(f"model.path={model_dir}")
    if staleness > 0:
        overrides.append(f"{STALENESS_KEY}={staleness}")
    return [sys.executable, "-m", "pacs.cli", "train", "--config", "builtin:demo", *overrides]


def run_training(command: list[str], log: Path, timeout_s: float) -> tuple[int | None, str, dict]:
    """Run `command` with pacs choosing its threads, its output in `log`: its exit status (None:
    killed after `timeout_s`, with the processes it started), output, and the machine around it."""
    environment = {
        key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    }
    load_before, start = os.getloadavg()[0], time.perf_counter()
    with log.open("w") as output:
        # a session of its own, so that a run that hangs is killed with its generator and scoring processes
        process = subprocess.Popen(command, env=environment, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    machine = {"load_before": load_before, "load_after": os.getloadavg()[0], "wall_s": time.perf_counter() - start}
    text = log.read_text()
    chosen = re.search(r"computing with (\d+) thread", text)
    machine["threads"] = int(chosen.group(1)) if chosen else len(os.sched_getaffinity(0))
    return returncode, text, machine


def summarise(rows: list[dict]) -> dict:
    """Medians over the steps after the first of a run's metrics rows, and each of those steps' phases
    (None where a step did not log one): a push of weights happens only before a batch it samples, so
    at staleness k the last k + 1 steps push none, and a median over few steps mixes both kinds."""
    measured = rows[1:]
    step_s = [row["time/step_s"] for row in measured]
    keys = {
        key for row in measured for key in row
        if key.startswith("time/") and key.endswith("_s") and key != "time/step_s" or key == GENERATOR_KEY
    }  # fmt: skip
    phases = {key: statistics.median(row[key] for row in measured if key in row) for key in keys}
    staleness = [row["rollout/staleness_max"] for row in rows if "rollout/staleness_max" in row]
    return {
        "step_s": step_s,
        "median_step_s": statistics.median(step_s),
        "steps_per_s": 1 / statistics.median(step_s),
        "phases": phases,
        "phases_per_step": {key: [row.get(key) for row in measured] for key in sorted(keys)},
        "staleness_max": max(staleness) if staleness else None,
        "parameters": rows[0].get("model/total_parameters"),
    }


def measure(workload: str, staleness: int, steps: int, run_dir: Path, model_dir: Path | None, timeout_s: float) -> dict:
    """One run of `workload` at `staleness` into `run_dir`: its summary, or why there is none."""
    command = train_command(workload, staleness, steps, run_dir, model_dir)
    returncode, output, machine = run_training(command, run_dir.with_suffix(".log"), timeout_s)
    result = {"staleness": staleness, "command": command, **machine}
    if returncode is None:
        return {**result, "available": False, "why": f"timed out after {timeout_s:g} s"}
    if returncode != 0:
        if staleness > 0 and refuses_unknown(STALENESS_KEY, output):
            return {**result, "available": False, "why": NOT_AVAILABLE}
        raise RuntimeError(f"{' '.join(command)} failed ({returncode}):\n{output[-3000:]}")
    from pacs.train.metrics import read_metrics

    return {**result, "available": True, **summarise(read_metrics(run_dir))}


def phase_columns(runs: list[dict]) -> list[str]:
    """The `time/*_s` keys any run logged, in `PHASES`' order and then by name, and `GENERATOR_KEY`."""
    logged = {key for run in runs if run["available"] for key in run["phases"]}
    known = [f"time/{phase}_s" for phase in PHASES if f"time/{phase}_s" in logged]
    return known + sorted(logged - set(known) - {GENERATOR_KEY}) + [GENERATOR_KEY] * (GENERATOR_KEY in logged)


def synchronous_run(runs: list[dict]) -> dict | None:
    """The staleness-0 run among `runs`, if there is one."""
    return next((run for run in runs if run["staleness"] == 0 and run["available"]), None)


def table(runs: list[dict]) -> str:
    """The markdown table of one workload's runs."""
    columns = phase_columns(runs)
    names = [key.removeprefix("time/").removesuffix("_s") for key in columns]
    lines = [
        "| staleness | median step s | vs staleness 0 | steps/s | staleness max | threads | load before/after | "
        + " | ".join(f"{name} s" for name in names)
        + " |",
        "|---" * (7 + len(columns)) + "|",
    ]
    synchronous = synchronous_run(runs)
    for run in runs:
        load = f"{run['load_before']:.1f}/{run['load_after']:.1f}"
        if not run["available"]:
            lines.append(f"| {run['staleness']} | {run['why']} | - | - | - | {run['threads']} | {load} |" + " - |" * len(columns))
            continue
        ratio = f"{run['median_step_s'] / synchronous['median_step_s']:.2f}" if synchronous else "-"
        stale = "-" if run["staleness_max"] is None else f"{run['staleness_max']:g}"
        phases = " | ".join(f"{run['phases'][key]:.2f}" if key in run["phases"] else "-" for key in columns)
        lines.append(f"| {run['staleness']} | {run['median_step_s']:.2f} | {ratio} | {run['steps_per_s']:.3f} | {stale} | "
                     f"{run['threads']} | {load} | {phases} |")  # fmt: skip
    return "\n".join(lines)


def split_devices(run: dict) -> dict:
    """The step a split of devices would give, from a synchronous run's medians (module docstring)."""
    generate = run["phases"].get("time/generate_s", 0.0)
    weight_sync = run["phases"].get("time/weight_sync_s", 0.0)
    rest = run["median_step_s"] - generate - weight_sync
    predicted = max(generate, rest) + weight_sync
    return {"generate_s": generate, "weight_sync_s": weight_sync, "rest_s": rest, "predicted_step_s": predicted,
            "measured_step_s": run["median_step_s"], "speedup": run["median_step_s"] / predicted}  # fmt: skip


def split_arithmetic(split: dict) -> str:
    """`split_devices`' figures, written out."""
    return (
        f"split of devices, from staleness 0's medians: rest = step - generate - weight_sync = "
        f"{split['measured_step_s']:.2f} - {split['generate_s']:.2f} - {split['weight_sync_s']:.2f} = {split['rest_s']:.2f} s; "
        f"step = max(generate, rest) + weight_sync = max({split['generate_s']:.2f}, {split['rest_s']:.2f}) + "
        f"{split['weight_sync_s']:.2f} = {split['predicted_step_s']:.2f} s, against {split['measured_step_s']:.2f} s "
        f"synchronous: {split['speedup']:.2f}x (the weights' transfer to a separate sampler not included)"
    )


def measure_workload(workload: str, staleness_values: list[int], steps: int, scratch: Path, timeout_s: float) -> dict:
    """Every staleness's run of `workload`, and the split-of-devices arithmetic from staleness 0."""
    model_dir = build_100m(scratch) if workload.startswith("100m") else None
    runs = []
    for index, staleness in enumerate(staleness_values):
        # A folder per run, so that a value repeated in --staleness (0,1,1,0) is a run of its own.
        run_dir = scratch / f"{workload}-{index}-staleness{staleness}"
        runs.append(measure(workload, staleness, steps, run_dir, model_dir, timeout_s))
        shown = {key: value for key, value in runs[-1].items() if key not in ("command", "step_s", "phases_per_step")}
        print(f"{workload}, staleness {staleness}: {json.dumps(shown)}", flush=True)
    synchronous = synchronous_run(runs)
    return {"steps": steps, "runs": runs, **({"split": split_devices(synchronous)} if synchronous else {})}


def report(results: dict[str, dict]) -> None:
    """Each workload's table and split-of-devices arithmetic."""
    for workload, result in results.items():
        parameters = next((run["parameters"] for run in result["runs"] if run["available"]), None)
        size = f", {parameters / 1e6:.1f}M parameters" if parameters else ""
        print(f"\n{workload}{size}: {result['steps']} steps a run, medians over steps 2-{result['steps']}\n")
        print(table(result["runs"]))
        if "split" in result:
            print(f"\n{split_arithmetic(result['split'])}")


def comma_separated_staleness(text: str) -> list[int]:
    """`--staleness`'s values: whole numbers, 0 or more."""
    try:
        values = [int(value) for value in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected whole numbers >= 0 separated by commas, e.g. 0,1,2")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="demo,100m", help=f"comma-separated, of {', '.join(WORKLOADS)}")
    parser.add_argument(
        "--staleness", type=comma_separated_staleness, default="0,1,2", help="comma-separated values of rollout.max_staleness"
    )
    parser.add_argument(
        "--steps",
        type=int,
        help="training steps per run, at least 2: the first is left out (default: demo 12, 100m 4, 100m-sampling 10)",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds a run may take before it is killed and reported as timed out"
    )
    parser.add_argument("--json", type=Path, help="write the raw figures (every step's time and phases, every median) here")
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    unknown = [workload for workload in workloads if workload not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: {', '.join(unknown)} unknown; valid: {', '.join(WORKLOADS)}")
    if args.steps is not None and args.steps < 2:
        parser.error(f"--steps {args.steps}: at least 2 (the first step is left out of the medians)")
    print(f"{os.cpu_count()} CPU cores; load average at the start {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="pacs-async-rollouts-") as scratch:
        results = {
            workload: measure_workload(workload, args.staleness, args.steps or WORKLOADS[workload]["steps"], Path(scratch), args.timeout)
            for workload in workloads
        }  # fmt: skip
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    report(results)
    if args.json:
        args.json.write_text(json.dumps({"cores": os.cpu_count(), "workloads": results}, indent=1))


if __name__ == "__main__":
    main()
