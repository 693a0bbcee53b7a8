"""Specification of the asynchronous generator's first weight push (`AsyncGenerator.push`) in host
memory: the trainer's flat buffer is built without holding the model twice. Measured in a fresh
process (its peak resident set); the generator process and its group are stand-ins that take the
buffer and send nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TENSORS, NUMEL = 8, 16 * 2**20
"""Eight float32 tensors of 64 MiB each (above glibc's largest mmap threshold, so each is its own
mapping, returned to the system when freed)."""

PUSH = """
import json, threading, time, types
from pathlib import Path
import torch
from pacs.train.async_generator import AsyncGenerator

def anonymous() -> int:
    # the process's own memory: file-backed pages (torch's libraries) that the kernel evicted under
    # load and faults back in are not the push's
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024

def weights():
    for index in range(TENSORS):
        yield f"layer.{index}.weight", torch.full((NUMEL // 1024, 1024), float(index))

generator = object.__new__(AsyncGenerator)
generator.buffer, generator.layout, generator.dtype, generator.sending = None, [], torch.float32, None
generator.connection = types.SimpleNamespace(send=lambda message: None)
generator.group = types.SimpleNamespace(broadcast=lambda tensors, options: None)
before, peak, pushing = anonymous(), [0], True

def watch():
    while pushing:
        peak[0] = max(peak[0], anonymous())
        time.sleep(0.0005)

watcher = threading.Thread(target=watch)
watcher.start()
generator.push(0, weights())
pushing = False
watcher.join()
peak[0] = max(peak[0], anonymous())
firsts = [float(generator.buffer[index * NUMEL]) for index in range(TENSORS)]
print(json.dumps({"above": peak[0] - before, "firsts": firsts}))
""".replace("TENSORS", str(TENSORS)).replace("NUMEL", str(NUMEL))


@pytest.mark.slow
def test_the_first_push_holds_the_model_about_once_in_host_memory_not_twice():
    done = subprocess.run([sys.executable, "-c", PUSH], capture_output=True, text=True, check=True)
    measured = json.loads(done.stdout.splitlines()[-1])
    model_bytes = TENSORS * NUMEL * 4
    assert measured["firsts"] == [float(index) for index in range(TENSORS)]
    assert measured["above"] < 1.4 * model_bytes, f"{measured['above'] / 2**20:.0f} MiB for a {model_bytes / 2**20:.0f} MiB model"
