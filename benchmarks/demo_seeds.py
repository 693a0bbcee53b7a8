"""The demo's promise over seeds: `pacs demo --seed S` for each seed, from an empty model cache.

    python benchmarks/demo_seeds.py                 # seeds 0-9
    python benchmarks/demo_seeds.py --seeds 0,1     # a few

Each seed runs as its own `pacs demo` process with a fresh `PACS_CACHE_DIR`, so its time includes
the warm-start of the base model, as on a fresh clone. Prints one row per seed (held-out pass@1
in %, before and after training, the gain, and wall-clock seconds of the whole command) and the
smallest gain and the slowest seed. Timings mean something only on a quiet machine; the table
says how many CPU cores this one has and its load average at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_seed(seed: int, scratch: Path, overrides: list[str]) -> dict:
    """One `pacs demo --seed seed` from an empty cache in `scratch`; its report plus wall seconds."""
    environment = {**os.environ, "PACS_CACHE_DIR": str(scratch / f"cache-{seed}")}
    out = scratch / f"demo-{seed}"
    command = [sys.executable, "-m", "pacs.cli", "demo", "--seed", str(seed), "--out", str(out), *overrides]
    start = time.perf_counter()
    subprocess.run(command, env=environment, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    report = json.loads((out / "report.json").read_text())
    return {"seed": seed, "base": report["base"]["pass@1"], "final": report["final"]["pass@1"], "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7,8,9", help="comma-separated seeds")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="overrides of the demo's recipe")
    args = parser.parse_args()
    seeds = [int(seed) for seed in args.seeds.split(",")]
    print(
        f"{os.cpu_count()} CPU cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}; "
        f"load average at start {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print("| seed | base pass@1 | PACS pass@1 | gain | seconds |\n|---|---|---|---|---|", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pacs-demo-seeds-") as scratch:
        for seed in seeds:
            row = run_seed(seed, Path(scratch), args.overrides)
            rows.append(row)
            gain = 100 * (row["final"] - row["base"])
            print(
                f"| {seed} | {100 * row['base']:.1f} | {100 * row['final']:.1f} | {gain:+.1f} | {row['seconds']:.0f} |",
                flush=True,
            )
    smallest = min(100 * (row["final"] - row["base"]) for row in rows)
    slowest = max(row["seconds"] for row in rows)
    print(f"smallest gain {smallest:+.1f} points; slowest seed {slowest:.0f} s; load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
