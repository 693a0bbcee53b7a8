"""Specification of the asynchronous generator's first weight push (`WeightRing.write`) in host
memory: the ring of shared buffers is built without holding the model twice, and a slot not yet
written takes no memory. Measured in a fresh process (its peak of anonymous and shared-memory
pages); no generator reads the ring."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TENSORS, NUMEL = 8, 16 * 2**20
"""Eight float32 tensors of 64 MiB each (above glibc's largest mmap threshold, so each is its own
mapping, returned to the system when freed)."""

PUSH = """
import json, threading, time
from pathlib import Path
import torch
import torch.multiprocessing as mp
from pacs.train.async_generator import WeightRing

def taken() -> int:
    # the process's own memory and the shared memory it wrote: file-backed pages (torch's libraries)
    # that the kernel evicted under load and faults back in are not the push's
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return sum(int(fields[name].split()[0]) * 1024 for name in ("RssAnon", "RssShmem"))

def weights():
    for index in range(TENSORS):
        yield f"layer.{index}.weight", torch.full((NUMEL // 1024, 1024), float(index))

ring = WeightRing(2, torch.device("cpu"), torch.float32, mp.get_context("spawn").Semaphore(2), lambda: None, 60)
before, peak, pushing = taken(), [0], True

def watch():
    while pushing:
        peak[0] = max(peak[0], taken())
        time.sleep(0.0005)

watcher = threading.Thread(target=watch)
watcher.start()
ring.write(weights)
pushing = False
watcher.join()
peak[0] = max(peak[0], taken())
firsts = [float(ring.buffers[0][index * NUMEL]) for index in range(TENSORS)]
print(json.dumps({"above": peak[0] - before, "firsts": firsts}))
""".replace("TENSORS", str(TENSORS)).replace("NUMEL", str(NUMEL))


@pytest.mark.slow
def test_the_first_push_holds_the_model_about_once_in_host_memory_whatever_the_rings_size():
    done = subprocess.run([sys.executable, "-c", PUSH], capture_output=True, text=True, check=True)
    measured = json.loads(done.stdout.splitlines()[-1])
    model_bytes = TENSORS * NUMEL * 4
    assert measured["firsts"] == [float(index) for index in range(TENSORS)]
    assert measured["above"] < 1.4 * model_bytes, f"{measured['above'] / 2**20:.0f} MiB for a {model_bytes / 2**20:.0f} MiB model"
