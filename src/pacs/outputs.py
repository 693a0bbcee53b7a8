"""Where pacs may write: the one rule every command that writes a folder follows.

pacs writes only inside folders it owns and never deletes a previous output:

- a folder that does not exist, or is empty, is created or taken and marked as pacs's with a
  small file, `MARKER`, naming the command that made it;
- a non-empty folder without the marker holds someone else's files: it is refused;
- a marked folder that holds a previous output is refused, unless the command continues it
  (`reuse`, e.g. `pacs train resume=auto`) or was asked to replace it (`replace`, e.g.
  `--overwrite`): the previous output is then moved aside to `NAME.superseded` (or
  `NAME.superseded.2`, ...), never deleted.

A command that writes one file (`pacs prepare --out FILE`) refuses an existing file unless
asked to replace it (`claim_output_file`), which moves it aside the same way.

Commands check every input (config, overrides, paths, the data's contents, the reward function)
before they call `claim_output_dir` and before they load a model, and report every problem at
once (`unusable_inputs`), so a refused command leaves the disk as it was.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from pathlib import Path

MARKER = ".pacs-output"
"""File in every output folder that pacs made; holds the name of the command that made it."""
SUPERSEDED = ".superseded"


class OutputRefused(ValueError):
    """pacs will not write to a folder; the message says why and what to do instead."""


def unusable_inputs(checks: Iterable[tuple[str, Callable[[], object]]]) -> str | None:
    """Run every (input name, check) and return one message listing each input whose check
    raised ValueError or FileNotFoundError ("unusable inputs:" then "  name: error" per line),
    or None when all passed."""
    problems = []
    for name, check in checks:
        try:
            check()
        except (ValueError, FileNotFoundError) as error:
            problems.append(f"  {name}: {error}")
    return "unusable inputs:\n" + "\n".join(problems) if problems else None


def is_pacs_output(directory: Path) -> bool:
    """Whether `directory` is a folder that pacs made (it holds `MARKER`)."""
    return (Path(directory) / MARKER).is_file()


def _entries(directory: Path) -> list[str]:
    """Names in `directory` other than the marker, sorted."""
    return sorted(entry.name for entry in directory.iterdir() if entry.name != MARKER)


def _listing(names: list[str], shown: int = 5) -> str:
    more = f", ... ({len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def superseded_path(directory: Path) -> Path:
    """The first free name of `NAME.superseded`, `NAME.superseded.2`, ... beside `directory`."""
    candidate = directory.with_name(directory.name + SUPERSEDED)
    number = 2
    while candidate.exists() or candidate.is_symlink():
        candidate = directory.with_name(f"{directory.name}{SUPERSEDED}.{number}")
        number += 1
    return candidate


def move_aside(directory: Path) -> Path:
    """Rename the folder (or file) `directory` to `superseded_path(directory)` and return that path."""
    aside = superseded_path(directory)
    directory.rename(aside)
    return aside


def _check_output_dir(directory: Path, *, reuse: bool, replace: bool) -> None:
    """Raise `OutputRefused` unless `claim_output_dir` with these arguments may write to
    `directory`; touches nothing."""
    directory = Path(directory)
    if not directory.exists():
        if directory.is_symlink():
            raise OutputRefused(f"{directory} is a dangling symbolic link; choose another output folder")
        return
    if not directory.is_dir():
        raise OutputRefused(f"{directory} is a file, not a folder; choose another output folder")
    entries = _entries(directory)
    if not entries or reuse and is_pacs_output(directory):
        return
    if not is_pacs_output(directory):
        raise OutputRefused(
            f"{directory} holds files that pacs did not write ({_listing(entries)}); pacs writes only "
            f"into a new or empty folder or one it made (marked by {MARKER}). Choose another output folder"
        )
    if not replace:
        raise OutputRefused(
            f"{directory} holds a previous output ({_listing(entries)}); pass --overwrite to move it "
            f"aside to {superseded_path(directory)}, or choose another output folder"
        )


def claim_output_dir(directory: Path, command: str, *, reuse: bool = False, replace: bool = False) -> Path | None:
    """Make `directory` an output folder of `command` (e.g. "pacs train", written into the
    marker), or raise `OutputRefused` (see the module's rule) having changed nothing. `reuse`:
    keep a previous pacs output there and write into it; `replace`: move a previous pacs output
    aside first. Returns where a previous output was moved, else None."""
    directory = Path(directory)
    _check_output_dir(directory, reuse=reuse, replace=replace)
    aside = None
    if directory.is_dir() and _entries(directory) and not reuse:
        aside = move_aside(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if not is_pacs_output(directory):
        (directory / MARKER).write_text(f"{command}\n")
    return aside


def claim_output_file(path: Path, *, replace: bool = False) -> Path | None:
    """Make way for a command to write the single file `path`: refuse (`OutputRefused`) a folder
    there, or an existing file unless `replace`, which moves it aside (`superseded_path`); create
    the parent folders. Returns where a previous file was moved, else None."""
    path = Path(path)
    if path.is_dir():
        raise OutputRefused(f"{path} is a folder; give the path of a file to write")
    if path.exists() and not replace:
        raise OutputRefused(
            f"{path} already exists; pass --overwrite to move it aside to {superseded_path(path)}, or choose another output file"
        )
    aside = move_aside(path) if path.exists() else None
    path.parent.mkdir(parents=True, exist_ok=True)
    return aside


def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` through a file beside it, fsynced and renamed over `path`: a process
    killed, or a machine that crashes, mid-write leaves the previous `path` whole, never a part
    (and a write that fails leaves nothing else)."""
    partial = path.parent / f".{path.name}.{socket.gethostname()}-{os.getpid()}"  # apart on a shared disk too
    try:
        with open(partial, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
