"""The distribution built from pyproject.toml: what a non-editable install (a wheel from PyPI, the GPU
check's `pip install --target`) holds. The development venv's editable install reads src/ directly,
so a module left out of the package list would pass every other test."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def copy_of_the_sources(to: Path) -> Path:
    """What the distribution is built from, copied to `to` (a build writes beside its sources)."""
    for folder in ("src", "configs"):
        shutil.copytree(REPO / folder, to / folder, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for file in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / file, to / file)
    return to


def test_the_wheel_holds_every_module_of_src_and_every_built_in_config(tmp_path: Path):
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index", "--no-build-isolation",
         "--wheel-dir", str(tmp_path / "wheels"), str(copy_of_the_sources(tmp_path / "sources"))],
        check=True, capture_output=True,
    )  # fmt: skip
    (wheel,) = (tmp_path / "wheels").glob("pacs-*.whl")
    held = set(zipfile.ZipFile(wheel).namelist())
    modules = {path.relative_to(REPO / "src").as_posix() for path in (REPO / "src" / "pacs").rglob("*.py")}
    configs = {f"pacs/configs/{path.name}" for path in (REPO / "configs").iterdir() if path.suffix in (".py", ".yaml")}
    assert sorted(modules - held) == []
    assert sorted(configs - held) == []
