"""A real small filesystem for disk-full tests: a tmpfs mounted for the test (root only; the test
is skipped elsewhere, where the injected-error tests cover the same code)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def mounted_tmpfs(directory: Path, size: str = "10m") -> Iterator[Path]:
    """`directory` (created) with a tmpfs of `size` mounted on it until the block ends."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({mounted.stderr.strip() or mounted.returncode}); the injected-error tests cover this"
        )
    try:
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def fill_leaving(directory: Path, free: int) -> None:
    """Write a file into `directory` that leaves about `free` bytes of its disk free."""
    with open(directory / "filler", "wb") as handle:
        handle.write(b"\0" * max(shutil.disk_usage(directory).free - free, 0))
