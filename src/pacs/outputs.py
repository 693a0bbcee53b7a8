"""Where pacs may write: the one rule every command that writes a folder follows.

pacs writes only inside folders it owns and never deletes a previous output:

- a folder that does not exist, or is empty, is created or taken and marked as pacs's with a
  small file, `MARKER`, naming the command that made it;
- a non-empty folder without the marker holds someone else's files: it is refused;
- a marked folder that holds a previous output is refused, unless the command continues it
  (`reuse`, e.g. `pacs train resume=auto`) or was asked to replace it (`replace`, e.g.
  `--overwrite`): the previous output is then moved aside to `NAME.superseded` (or
  `NAME.superseded.2`, ...), never deleted;
- a write that finds the disk full (ENOSPC) or the quota spent (EDQUOT) stops the command with one
  line naming the folder, what was being written, its size and the free space (`DiskFull`,
  `disk_faults`), the part it wrote removed;
- a folder that a live process writes (it holds the run lock, `RUN_LOCK`, see `lock_run`) is
  never moved aside nor replaced, by any command: it is refused, naming that process; and a
  writer whose folder was moved all the same (`mv`) stops at its next step (`check_run_in_place`);
- what a command finds in a folder and what it then does there (claims it, moves it aside, takes
  its run lock) happen under one claim of the folder that holds it (`claiming`), so no other pacs
  process acts between the look and the act: a run that starts while another moves its folder
  aside finds it either before the move or after it, never half way.

A command that writes one file (`pacs prepare --out FILE`) refuses an existing file unless
asked to replace it (`claim_output_file`), which moves it aside the same way.

Commands check every input (config, overrides, paths, the data's contents, the reward function)
before they call `claim_output_dir` and before they load a model, and report every problem at
once (`unusable_inputs`), so a refused command leaves the disk as it was.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TypeVar

MARKER = ".pacs-output"
"""File in every output folder that pacs made; holds the name of the command that made it."""
SUPERSEDED = ".superseded"
RUN_LOCK = ".pacs-run.lock"
"""In a run's folder: the file whose POSIX lock its writing process holds (`lock_run`)."""
_held_locks: list[IO[str]] = []
"""The run locks this process holds (closed ones are dropped when next looked at)."""
_claims: dict[str, tuple[int, int]] = {}
"""Folder (real path) -> (the descriptor whose flock claims it, how many `claiming` bodies of
this process hold it)."""


Decision = TypeVar("Decision")


class OutputRefused(ValueError):
    """pacs will not write to a folder; the message says why and what to do instead."""


class RunLocked(OutputRefused):
    """A live process holds the folder's run lock: it writes there."""


class RunMoved(OutputRefused):
    """The folder a run writes was moved away or replaced while it ran."""


class DiskFull(OSError):
    """A write found its disk full or its quota spent; the message says where, what and how much."""


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_DISK_FULL_TEXT = re.compile(r"No space left on device|Disk quota exceeded|os error (28|122)\b")
"""How libraries that do not raise OSError (safetensors' Rust writer) report the two errnos."""


def is_disk_full(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is ENOSPC or EDQUOT (by errno, or by the
    text a library that raises another type quotes)."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS or _DISK_FULL_TEXT.search(str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False


def size_text(size: float) -> str:
    """`size` bytes for people: "812 B", "6.3 MB", "1.2 GB" (powers of 1000, as `df -H`)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def free_bytes(path: Path) -> int:
    """Bytes free to this user on the disk holding `path` (its nearest existing folder)."""
    path = Path(path).absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


@contextmanager
def disk_faults(folder: Path, what: str, size: int | None = None) -> Iterator[None]:
    """Turn a full disk or spent quota met in the body (see `is_disk_full`) into `DiskFull`: one
    line naming `folder`, `what` was being written, its `size` (None: not known beforehand) and
    the free space. The body removes what it wrote in part; other errors pass unchanged."""
    try:
        yield
    except Exception as error:
        if not is_disk_full(error):
            raise
        needs = f" (about {size_text(size)})" if size else ""
        raise DiskFull(
            errno.ENOSPC,
            f"the disk holding {folder} is full: writing {what}{needs} failed with {size_text(free_bytes(folder))} "
            "free, and nothing of it was kept. Free space there, or choose an output folder on a larger disk",
        ) from None


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


@contextmanager
def claiming(directory: Path) -> Iterator[None]:
    """Hold, for the body, the claim of the folder that holds `directory` (created if missing): an
    exclusive `flock` of that folder itself, which writes nothing, waited for while another process
    holds it. Every pacs command that looks at an output folder and then claims it, moves it aside
    or takes its run lock does both holding the claim, so no other one acts in between. Reentrant
    within a process; where the file system has no flock (some network file systems), the body
    runs unclaimed, as a run goes on without a run lock there."""
    parent = Path(directory).absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(parent)
    if key in _claims:
        descriptor, depth = _claims[key]
        _claims[key] = (descriptor, depth + 1)
    else:
        descriptor = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError as error:
            os.close(descriptor)
            if error.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF, errno.EINVAL):
                raise
            yield
            return
        _claims[key] = (descriptor, 1)
    try:
        yield
    finally:
        descriptor, depth = _claims[key]
        if depth > 1:
            _claims[key] = (descriptor, depth - 1)
        else:
            del _claims[key]
            os.close(descriptor)  # releases the flock


def superseded_path(directory: Path) -> Path:
    """The first free name of `NAME.superseded`, `NAME.superseded.2`, ... beside `directory`."""
    candidate = directory.with_name(directory.name + SUPERSEDED)
    number = 2
    while candidate.exists() or candidate.is_symlink():
        candidate = directory.with_name(f"{directory.name}{SUPERSEDED}.{number}")
        number += 1
    return candidate


def move_aside(directory: Path) -> Path:
    """Rename the folder (or file) `directory` to `superseded_path(directory)` and return that path;
    a folder whose run lock a live process holds is refused (`RunLocked`), and the lock is held
    while the folder moves, so that no run starts writing it meanwhile."""
    with claiming(directory):
        aside = superseded_path(directory)
        lock = _try_lock(Path(directory) / RUN_LOCK, create=False) if Path(directory).is_dir() else None
        try:
            directory.rename(aside)
        finally:
            if lock is not None:
                lock.close()
    return aside


def claim_run_folder(
    directory: Path, command: str, decide: Callable[[], tuple[Decision, bool | None]], *, replace: bool = False
) -> tuple[Decision, IO[str] | None, Path | None]:
    """A run's start in `directory`, as one step no other pacs process can interleave with (held
    under `claiming`): with `replace`, a previous output moved aside (`claim_output_dir`); a live
    writer refused (`RunLocked`, naming it); `decide()` (what the run makes of the folder: it reads
    only, and may refuse by raising) returning (its decision, whether the run writes into what the
    folder holds, `reuse`, or None when it writes nothing); then, unless None, the folder claimed
    and its run lock taken (`lock_run`). Returns the decision, the run lock (None where nothing is
    written or the file system has no locks) and where a previous output was moved (None: nowhere)."""
    directory = Path(directory)
    with claiming(directory):
        aside = claim_output_dir(directory, command, replace=True) if replace else None
        if directory.is_dir():
            check_unlocked(directory)
        decision, reuse = decide()
        if reuse is None:
            return decision, None, aside
        claim_output_dir(directory, command, reuse=reuse or replace)
        return decision, lock_run(directory), aside


def lock_run(output_dir: Path) -> IO[str] | None:
    """Take `output_dir`'s run lock (a POSIX lock on `RUN_LOCK`, released by the kernel when the
    process ends, however it ends), write this process's pid and host into it, and return the
    open file that holds it (close it to release); None where the file system has no locks.
    Raises `RunLocked`, naming the holder, while another process (or this one) holds it."""
    handle = _try_lock(Path(output_dir) / RUN_LOCK, create=True)
    if handle is None:
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
    handle.flush()
    _held_locks.append(handle)
    return handle


def check_unlocked(directory: Path) -> None:
    """Raise `RunLocked`, naming the process, while a live process holds `directory`'s run lock."""
    if holder := run_lock_holder(directory):
        raise _run_locked(Path(directory), holder)


def run_lock_holder(directory: Path) -> str | None:
    """Who holds `directory`'s run lock ("pid N on HOST", as its writer wrote), or None when no
    live process does (or the folder has no lock file). Changes nothing."""
    try:
        lock = _try_lock(Path(directory) / RUN_LOCK, create=False)
    except RunLocked as error:
        return error.holder
    if lock is not None:
        lock.close()
    return None


def _try_lock(path: Path, *, create: bool) -> IO[str] | None:
    """The open `path` holding its lock (None: no such file and not `create`, or no locks on this
    file system); raises `RunLocked` while a process holds it. A lock this process holds is
    refused without opening the file again: closing a second descriptor would release it."""
    _held_locks[:] = [handle for handle in _held_locks if not handle.closed]
    try:
        identity = os.stat(path)
    except FileNotFoundError:
        identity = None
    for held in _held_locks:
        if identity is not None and os.path.samestat(identity, os.fstat(held.fileno())):
            raise _run_locked(path.parent, f"pid {os.getpid()} on {socket.gethostname()}, this process")
    if identity is None and not create:
        return None
    handle = open(path, "a+" if create else "r+")
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        if error.errno in (errno.EACCES, errno.EAGAIN):
            raise _run_locked(path.parent, holder) from None
        return None  # no locks here (ENOLCK, ENOSYS): the run goes on unprotected
    return handle


def _run_locked(directory: Path, holder: str) -> RunLocked:
    error = RunLocked(
        f"{directory} is being written by a running pacs command ({holder}); it is neither moved nor replaced while "
        "that process lives: wait for it to end (or stop it), or choose another output folder"
    )
    error.holder = holder
    return error


def check_run_in_place(output_dir: Path, lock: IO[str] | None) -> None:
    """Raise `RunMoved` when `output_dir` no longer holds the run lock file this process holds
    (`lock`, from `lock_run`; None: nothing to check): the folder was moved away or replaced
    while the run wrote it, and writing on by path would write into whatever is there now. The
    message says where the folder went when it is beside its old place."""
    if lock is None:
        return
    mine = os.fstat(lock.fileno())
    try:
        if os.path.samestat(mine, os.stat(Path(output_dir) / RUN_LOCK)):
            return
    except FileNotFoundError:
        pass
    output_dir = Path(output_dir)
    moved_to = next((sibling for sibling in _siblings(output_dir) if _holds(sibling / RUN_LOCK, mine)), None)
    where = f"it is now {moved_to}" if moved_to else "it is no longer there"
    raise RunMoved(
        f"{output_dir}, which this run writes, was moved away or replaced while it ran ({where}); stopping before "
        "writing anything more. Continue the run where its folder is now with output_dir=THERE resume=auto"
    )


def _siblings(directory: Path) -> list[Path]:
    try:
        return sorted(entry for entry in directory.parent.iterdir() if entry.is_dir() and entry != directory)
    except OSError:
        return []


def _holds(path: Path, identity: os.stat_result) -> bool:
    try:
        return os.path.samestat(identity, os.stat(path))
    except OSError:
        return False


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
    check_unlocked(directory)
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
    with claiming(directory):  # checked again under the claim: another process may have acted since
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
