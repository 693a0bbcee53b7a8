"""Same config, same seed, same bits? `pacs train` of the demo recipe run twice per setting.

    python benchmarks/bitwise_reruns.py                          # 8 steps, default settings
    python benchmarks/bitwise_reruns.py --steps 4 --settings default,mkl-off,threads-1,threads-2

Each setting runs `pacs train --config builtin:demo train.steps=N data.val=null` twice, each run
its own process in its own output folder; the table gives, for every run, the largest weight
difference from the first run of the first setting, whether its metrics.jsonl holds the same
values (every key but time/ and throughput/), and its mean step time. Settings (environment):

    default     what the pacs command chooses (threads, MKL's strict reproducible mode)
    mkl-off     MKL_CBWR=OFF: MKL's fastest code path, not reproducible across thread counts
    threads-N   OMP_NUM_THREADS=N (MKL mode as default)

Runs alternate between settings (A B A B), so that a change in the machine's load falls on both.
Timings mean something only on a quiet machine: the table prints the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

SETTINGS = {"default": {}, "mkl-off": {"MKL_CBWR": "OFF"}}
UNTIMED = ("time/", "throughput/")


def environment(setting: str) -> dict[str, str]:
    if setting.startswith("threads-"):
        return {"OMP_NUM_THREADS": setting.removeprefix("threads-")}
    return SETTINGS[setting]


def train(setting: str, output_dir: Path, steps: int) -> Path:
    env = {**os.environ, **environment(setting)}
    command = [
        sys.executable,
        "-m",
        "pacs.cli",
        "train",
        "--config",
        "builtin:demo",
        f"train.steps={steps}",
        "data.val=null",
        f"output_dir={output_dir}",
    ]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return output_dir


def metrics(output_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return [{key: value for key, value in row.items() if not key.startswith(UNTIMED)} for row in rows]


def step_seconds(output_dir: Path) -> float:
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    return sum(row["time/step_s"] for row in rows) / len(rows)


def max_weight_difference(first: Path, second: Path) -> float:
    a = load_file(str(first / "checkpoints" / "final" / "model.safetensors"))
    b = load_file(str(second / "checkpoints" / "final" / "model.safetensors"))
    return max(float((a[key] - b[key]).abs().max()) for key in a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--settings", default="default", help="comma-separated: default, mkl-off, threads-N")
    parser.add_argument("--runs", type=int, default=2, help="runs per setting")
    args = parser.parse_args()
    settings = args.settings.split(",")
    print(f"{os.cpu_count()} CPU cores, torch {torch.__version__}; load average at start {os.getloadavg()[0]:.1f}", flush=True)
    print(
        "| setting | run | max abs weight difference from the first run | same metrics | mean step s |\n|---|---|---|---|---|",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="pacs-bitwise-") as scratch:
        first = None
        for run in range(args.runs):
            for setting in settings:
                output_dir = train(setting, Path(scratch) / f"{setting}-{run}", args.steps)
                first = first or output_dir
                same = metrics(output_dir) == metrics(first)
                print(
                    f"| {setting} | {run + 1} | {max_weight_difference(first, output_dir):.3g} | {'yes' if same else 'no'} "
                    f"| {step_seconds(output_dir):.2f} |",
                    flush=True,
                )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
