"""The python tool's cost (`pacs.rollout.tools.ToolRunner`): seconds to run a step's batch of calls.

    python benchmarks/tool_calls.py                        # 64 calls, 1 and 2 workers, 5 repeats
    python benchmarks/tool_calls.py --calls 256 --workers 1,2,4
    python benchmarks/tool_calls.py --sandbox none         # without bubblewrap's namespaces

For each worker count (sandboxes at once), a fresh runner (`rollout.tools=python`,
`rollout.tool_sandbox` from `--sandbox`, 5 s limit, 1024 MiB), then per
program kind the median over `--repeats` batches of `--calls` calls of `run` (the first batch, which
starts the workers, reported apart):
- `print`: ``print(12345 * 6789)``, the cost of a call itself;
- `loop`: a loop of 10^5 additions, a program that computes;
- `error`: ``1 / 0``, an exception returned as output;
- `sympy`: ``import sympy`` and a factorisation (every call is a fresh interpreter in a fresh
  sandbox, so every call imports sympy).
Timings mean something only on a quiet machine: the table gives the 1-minute load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from pacs.plugins import PYTHON_TOOL
from pacs.rollout.tools import ToolRunner

PROGRAMS = {
    "print": "print(12345 * 6789)",
    "loop": "total = 0\nfor i in range(100_000):\n    total += i\nprint(total)",
    "error": "1 / 0",
    "sympy": "import sympy\nprint(sympy.factorint(2**32 + 1))",
}


def batch_seconds(runner: ToolRunner, program: str, calls: int) -> float:
    started = time.perf_counter()
    outputs = runner.run([program] * calls)
    seconds = time.perf_counter() - started
    assert len(outputs) == calls
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=64)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sandbox", choices=("bwrap", "none"), default="bwrap")
    args = parser.parse_args()
    print(f"load average (1 min) before: {os.getloadavg()[0]:.2f}; {args.calls} calls per batch; sandbox {args.sandbox}")
    print("| workers | program | first batch (s) | median batch (s) | per call (ms) |")
    print("|---|---|---|---|---|")
    for workers in [int(w) for w in args.workers.split(",")]:
        with ToolRunner(
            PYTHON_TOOL, num_workers=workers, timeout_s=5.0, memory_limit_mib=1024, max_output_chars=512, sandbox=args.sandbox
        ) as runner:
            for name, program in PROGRAMS.items():
                first = batch_seconds(runner, program, args.calls)
                median = statistics.median(batch_seconds(runner, program, args.calls) for _ in range(args.repeats))
                print(f"| {workers} | {name} | {first:.3f} | {median:.3f} | {1000 * median / args.calls:.2f} |")
    print(f"load average (1 min) after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
