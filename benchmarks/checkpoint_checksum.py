"""What checksumming every byte of a checkpoint costs, on a checkpoint of about 1 GiB.

A checkpoint's manifest holds each file's XXH3-64 hash over all its bytes
(`pacs.train.checkpointing.folders.seal`), computed right after the file is written, while the
kernel still holds its bytes in the page cache, and checked at resume before the checkpoint is
loaded (`checkpoint_problem`). This script writes a safetensors file of `--gib` GiB of float32
tensors into a staging folder, as a checkpoint does, and times, `--repeats` times (medians
printed): the write itself, fsync, the whole-file hash at seal, a whole-file CRC-32 (zlib, the
other choice), the sampled CRC-32 earlier manifests held, the check at resume (page cache warm,
as right after a save), and reading the tensors back (`safetensors.torch.load_file`, every
element summed) for scale. Run:
`.venv/bin/python benchmarks/checkpoint_checksum.py [--gib 1] [--repeats 3] [--dir /tmp]`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from safetensors.torch import load_file, save_file

from pacs.train.checkpointing.folders import CHUNK_BYTES, checkpoint_problem, file_hash, sampled_crc32, seal


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def zlib_crc32(handle) -> int:
    handle.seek(0)
    crc = 0
    while chunk := handle.read(CHUNK_BYTES):
        crc = zlib.crc32(chunk, crc)
    return crc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the checkpoint's weights file")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default=None, help="folder on the disk to write to (default: the system's temp folder)")
    args = parser.parse_args()
    tensor_elements = 16 << 20  # 64 MiB of float32 each
    count = max(1, round(args.gib * (1 << 30) / (4 * tensor_elements)))
    generator = torch.Generator().manual_seed(0)
    tensors = {f"layer_{i}.weight": torch.randn(tensor_elements, generator=generator) for i in range(count)}
    size = count * tensor_elements * 4
    times: dict[str, list[float]] = {}

    def note(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(dir=args.dir) as folder:
            staging = Path(folder) / "step_1"
            staging.mkdir()
            path = staging / "model.safetensors"
            note("write (safetensors save_file)", timed(lambda: save_file(tensors, str(path))))
            with open(path, "rb") as handle:
                note("fsync", timed(lambda: os.fsync(handle.fileno())))
                note("XXH3-64 of every byte (seal)", timed(lambda: file_hash(handle)))
                note("zlib CRC-32 of every byte (not chosen)", timed(lambda: zlib_crc32(handle)))
                note("CRC-32 of 16 sampled 64 KiB blocks (before)", timed(lambda: sampled_crc32(handle, size)))
            seal(staging, 1)
            note("check at resume (every byte, warm cache)", timed(lambda: checkpoint_problem(staging)))
            note("load_file, every element read (for scale)", timed(lambda: [t.sum() for t in load_file(str(path)).values()]))
    table = Table(title=f"a checkpoint of {size / (1 << 30):.2f} GiB (one file), median of {args.repeats}")
    table.add_column("phase")
    table.add_column("seconds", justify="right")
    table.add_column("GiB/s", justify="right")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        table.add_row(name, f"{median:.3f}", f"{size / (1 << 30) / median:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
