"""Thread count and OpenMP wait policy, quiet and beside a busy loop: the trade `pacs.threads` makes.

    python benchmarks/threads.py                          # 3 rounds of both workloads
    python benchmarks/threads.py --rounds 1 --steps 3     # a quick look

Workloads, each step timed in a fresh process (OpenMP reads its settings when torch is imported):
- `train`: the demo's training step (configs/demo.yaml: 64 prompts x 8 responses of at most 16
  tokens, two updates) on `builtin:tiny`, whose random answers always run to the cap, so every
  step does the same work; seconds per step from metrics.jsonl, the first step left out;
- `warm-start`: steps of the warm-start of `builtin:tiny-arithmetic` (`pacs sft`'s loop on its
  task, `pacs.train.builtin_models.WARM_START`: 64 rows a step).

Settings: torch's default (one thread per core, libgomp's spinning wait); `OMP_WAIT_POLICY=PASSIVE`
with as many threads; one thread; and pacs's own choice (`pacs.threads.choose_threads`, what the
`pacs` command does: a passive wait and one thread per core idle at the start). Conditions: the
machine as it is, and beside `python3 -c "while True: pass"` started here. Each round runs every
(condition, setting) once, in turn, so that a slow minute of a shared machine falls on all of them;
the table gives the median seconds per step over rounds and the median over rounds of each
setting's ratio to torch's default in the same condition and round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SETTINGS = {
    "torch default": {},
    "passive wait": {"OMP_WAIT_POLICY": "PASSIVE"},
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "pacs's choice": None,
}
"""Setting -> the environment a workload runs in (None: `choose_threads` decides, in the child)."""
CHILD = r"""
import json, statistics, sys, time
from pathlib import Path
workload, steps, scratch, choose = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "choose"
if choose:
    from pacs.threads import choose_threads
    choose_threads()
import torch
if workload == "train":
    from pacs.config import load_config
    from pacs.train.metrics import read_metrics
    from pacs.train.trainer import train
    overrides = ["model.path=builtin:tiny", f"train.steps={steps}", "data.val=null", "train.save_every=0",
                 "train.report_to=[]", f"output_dir={scratch / 'run'}"]
    train(load_config("builtin:demo", overrides), show_progress=False)
    seconds = [row["time/step_s"] for row in read_metrics(scratch / "run")][1:]
else:
    import pacs.train.sft as sft
    from pacs.data.arithmetic import answer_text
    from pacs.data.loading import load_rows
    from pacs.models.loading import resolve_model_path
    stamps = []
    class Timed:
        def __init__(self, iterable, **options):
            self.iterable = iterable
        def __iter__(self):
            for item in self.iterable:
                stamps.append(time.perf_counter())
                yield item
            stamps.append(time.perf_counter())
        def set_postfix(self, **values):
            pass
    sft.progress_bar = Timed
    from pacs.train.builtin_models import WARM_START
    rows = load_rows(WARM_START["task"], default_split="train")
    sft.supervised_warm_start(resolve_model_path("builtin:tiny"), rows, answer_text, scratch / "sft", steps=steps,
                              batch_size=WARM_START["batch_size"], lr=WARM_START["lr"], show_progress=False)
    seconds = [after - before for before, after in zip(stamps[1:], stamps[2:])]
print(json.dumps({"threads": torch.get_num_threads(), "seconds_per_step": statistics.median(seconds)}))
"""


def measure(workload: str, setting: str, steps: int, cache: Path) -> dict:
    """One fresh process of `workload` under `setting`: its thread count and median seconds per step."""
    chosen = SETTINGS[setting]
    environment = {
        key: value for key, value in os.environ.items() if key not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
    }
    environment.update(chosen or {}, PACS_CACHE_DIR=str(cache))
    with tempfile.TemporaryDirectory(prefix="pacs-threads-") as scratch:
        result = subprocess.run(
            [sys.executable, "-c", CHILD, workload, str(steps), scratch, "choose" if chosen is None else "keep"],
            env=environment, capture_output=True, text=True, check=True,
        )  # fmt: skip
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="training steps per measurement (the first is left out)")
    parser.add_argument("--warm-start-steps", type=int, default=30, help="warm-start steps per measurement")
    parser.add_argument("--workloads", default="train,warm-start")
    args = parser.parse_args()
    workloads = args.workloads.split(",")
    print(f"{os.cpu_count()} cores; load average at the start {os.getloadavg()[0]:.1f}", flush=True)
    results: dict[tuple[str, str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="pacs-threads-cache-") as cache:
        for round_number in range(1, args.rounds + 1):
            for condition in ("as it is", "beside a busy loop"):
                busy = subprocess.Popen(["python3", "-c", "while True: pass"]) if condition != "as it is" else None
                try:
                    time.sleep(2 if busy else 0)
                    for workload in workloads:
                        for setting in SETTINGS:
                            steps = args.steps if workload == "train" else args.warm_start_steps
                            result = measure(workload, setting, steps, Path(cache))
                            results.setdefault((workload, condition, setting), []).append(result)
                            print(f"round {round_number}, {workload}, {condition}, {setting}: {result}", flush=True)
                finally:
                    if busy:
                        busy.kill()
                        busy.wait()
    print(f"load average at the end {os.getloadavg()[0]:.1f}\n")
    print("| workload | machine | setting | threads | s/step (median of rounds) | vs torch's default (median of rounds) |")
    print("|---|---|---|---|---|---|")
    for (workload, condition, setting), runs in results.items():
        default = results[(workload, condition, "torch default")]
        ratios = [run["seconds_per_step"] / base["seconds_per_step"] for run, base in zip(runs, default)]
        threads = "/".join(sorted({str(run["threads"]) for run in runs}))
        seconds = statistics.median(run["seconds_per_step"] for run in runs)
        print(f"| {workload} | {condition} | {setting} | {threads} | {seconds:.2f} | {statistics.median(ratios):.2f} |")


if __name__ == "__main__":
    main()
