"""How many threads pacs computes with, and how idle threads wait: chosen once, by the `pacs`
command, before torch is imported (its OpenMP runtime reads both from the environment then).

torch's default is one thread per core, each spinning for a while (libgomp: 300,000 rounds) when
it waits for the others. On a machine where another process keeps a core busy, a spinning thread
takes CPU time from the thread it waits for, and a step can take many times as long
(`benchmarks/threads.py`; its figures are in docs/results.md). So, unless the user chose
(`OMP_NUM_THREADS`, `OMP_WAIT_POLICY`, `GOMP_SPINCOUNT`):

- threads wait passively (`OMP_WAIT_POLICY=PASSIVE`): they sleep at once instead of spinning;
- there is one thread per core that is idle when the command starts (`idle_cores`, sampled over
  `SAMPLE_S`), at least one and at most the cores this process may run on.

The trade, measured by `benchmarks/threads.py` (docs/results.md): the spinning wait is what
collapses beside other busy processes, and a passive wait alone removes most of that; on an
otherwise idle machine it costs a little. The thread count is the smaller
choice: beside one busy process one thread per idle core is fastest, while on a machine crowded
by many processes more threads would take a larger share of the CPU from the others, which pacs
leaves to the user (`OMP_NUM_THREADS`).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import MutableMapping

SAMPLE_S = 0.2
"""How long the CPU's idle time is sampled for before a command chooses its thread count."""
USER_SETTINGS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def idle_cores(sample_s: float = SAMPLE_S) -> float | None:
    """How many of the machine's cores were idle, on average, over the next `sample_s` seconds
    (Linux's /proc/stat); None where it cannot be read."""

    def idle_and_total() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(value) for value in stat.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields[:8])  # idle + iowait; user .. steal

    try:
        idle_before, total_before = idle_and_total()
        time.sleep(sample_s)
        idle_after, total_after = idle_and_total()
    except (OSError, ValueError, IndexError):
        return None
    elapsed = total_after - total_before
    return (os.cpu_count() or 1) * (idle_after - idle_before) / elapsed if elapsed > 0 else None


def choose_threads(environment: MutableMapping[str, str] | None = None) -> int | None:
    """Set the wait policy and thread count in `environment` (default: this process's) as the
    module docstring says, leaving alone what the user set; return the thread count chosen
    (None: the user's, or torch already imported, when it is too late to choose)."""
    environment = os.environ if environment is None else environment
    if "torch" in sys.modules:
        return None
    if "OMP_WAIT_POLICY" not in environment and "GOMP_SPINCOUNT" not in environment:
        environment["OMP_WAIT_POLICY"] = "PASSIVE"
    if "OMP_NUM_THREADS" in environment:
        return None
    threads = threads_for(idle_cores(), usable_cores())
    environment["OMP_NUM_THREADS"] = str(threads)
    return threads


def threads_for(idle: float | None, cores: int) -> int:
    """One thread per idle core (rounded), at least 1 and at most `cores`; `cores` when the idle
    cores are unknown."""
    return cores if idle is None else max(1, min(cores, round(idle)))
