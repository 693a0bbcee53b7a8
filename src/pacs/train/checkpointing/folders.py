"""Checkpoint folders on disk: assembled aside, made durable, checked, put in place, kept bounded.

    checkpoints/.tmp-NAME-PID/   a checkpoint being assembled by process PID (`staging_directory`)
    checkpoints/NAME/            a checkpoint in place, its `MANIFEST` written last

Writing one (`seal`, then `put_in_place`): every file and folder of the staging folder is
fsynced, then `MANIFEST` (each file's size and the XXH3-64 hash of all its bytes, read back while
the kernel still holds them in memory) is written and fsynced, then the
folder is renamed into place (swapped with a previous NAME in one step, `exchange`) and its
parent fsynced. A process killed at any point leaves either the previous checkpoint or the new
one under NAME, never a part of one (where the file system cannot swap, a kill between two
renames leaves NAME absent and its previous copy kept aside); after a machine crash the
same holds for the files the kernel had promised to keep (fsync), so a checkpoint in place is
whole unless the disk lies, and `checkpoint_problem` catches a file of one that was damaged
later: cut short, torn, or with a single flipped bit anywhere (a copy cut short, a disk that lied).

Reading them back (`checkpoints_newest_first`): every `step_N` and `final`, newest step first,
each with what its sizes say is wrong with it (None: whole as far as they tell). `resume=auto`
then checks the bytes of the newest candidate (`checkpoint_problem`), and of the next when one is
damaged, takes the newest whole one and says which it skipped, naming the file.

`final` is not a second copy of the last step's checkpoint when there is one: `link_checkpoint`
makes it of hard links to the same files (a copy where the file system has no hard links), so
it costs no space and outlives that step's removal. `remove_older_checkpoints` keeps the newest
`train.keep_checkpoints` step checkpoints, each removed only once a newer one is in place.

A staging folder of a process that died while writing (a kill mid-save) is removed by the next
run in the folder (`remove_dead_staging`), which holds the folder's lock (`pacs.outputs.lock_run`) and so
knows that no other process writes there.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import torch
import xxhash

from pacs.outputs import MARKER, is_pacs_output

MANIFEST = "manifest.json"
"""Written last into a checkpoint: {"format", "step", "files": {path: {"bytes", "xxh3_64"}}}."""
MANIFEST_FORMAT = 2
"""2: each file's "xxh3_64", the hash of every byte of it (`file_hash`). 1 (written by earlier
pacs, still read): its "crc32", of `SAMPLED_BLOCKS` evenly spaced blocks of `SAMPLED_BLOCK_BYTES`
bytes (`sampled_crc32`)."""
TRAINER_STATE = "trainer_state.pt"
SAMPLED_BLOCKS = 16
SAMPLED_BLOCK_BYTES = 1 << 16
CHUNK_BYTES = 8 << 20
"""Bytes read at a time when a file's hash is computed."""
STEP_NAME = re.compile(r"step_(\d+)")
FINAL = "final"
_STAGING_NAME = re.compile(r"\.(?P<kind>tmp|old)-(?P<name>.+)-\d+")
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


@dataclass(frozen=True)
class FoundCheckpoint:
    """A checkpoint folder and its step; `problem` says why it cannot be resumed (None: whole)."""

    path: Path
    step: int
    problem: str | None


def staging_directory(directory: Path) -> Path:
    """A fresh hidden folder beside `directory` to assemble its checkpoint in; refuses a
    `directory` that is neither a checkpoint nor empty (`check_replaceable`)."""
    if directory.is_dir():
        check_replaceable(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = directory.parent / f".tmp-{directory.name}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


@contextmanager
def removed_on_error(staging: Path | None) -> Iterator[None]:
    """Remove `staging` (None: nothing) when the body raises, a KeyboardInterrupt too: a failed
    save leaves no folder behind. (A killed one does; `remove_dead_staging` removes that.)"""
    try:
        yield
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        raise


def check_replaceable(directory: Path) -> None:
    """Refuse to replace `directory` unless it is a checkpoint (it holds a trainer state or a
    manifest) or holds nothing but pacs's output marker: a checkpoint swaps only its own folder."""
    others = sorted(entry.name for entry in directory.iterdir() if entry.name != MARKER)
    if others and not ((directory / TRAINER_STATE).is_file() or (directory / MANIFEST).is_file()):
        raise FileExistsError(
            f"{directory} holds files that are not a pacs checkpoint ({', '.join(others[:5])}); a checkpoint "
            "replaces only a previous checkpoint or an empty folder. Choose another output folder"
        )


def seal(staging: Path, step: int | None) -> None:
    """Make the assembled checkpoint in `staging` durable and checkable: fsync every file, write
    `MANIFEST` (step, and each file's size and `file_hash`) and fsync it, then every folder. The
    files were just written, so their bytes are read back from the kernel's page cache, not the
    disk (where memory is short, some from the disk)."""
    files = {}
    for path in sorted(p for p in staging.rglob("*") if p.is_file() and p.name != MARKER):
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
            size = os.fstat(handle.fileno()).st_size
            files[path.relative_to(staging).as_posix()] = {"bytes": size, "xxh3_64": file_hash(handle)}
    with open(staging / MANIFEST, "w") as handle:
        json.dump({"format": MANIFEST_FORMAT, "step": step, "files": files}, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    for folder in sorted((p for p in staging.rglob("*") if p.is_dir()), reverse=True):
        _fsync_directory(folder)
    _fsync_directory(staging)


def file_hash(handle: IO[bytes]) -> str:
    """XXH3-64 (hex) of every byte of the open file `handle`, read `CHUNK_BYTES` at a time into one
    buffer: a non-cryptographic hash that reads at memory speed (docs/results.md, "Checksums of
    checkpoints"), so any change of the bytes, a single flipped bit included, changes it but for
    a chance of 2^-64."""
    handle.seek(0)
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    digest = xxhash.xxh3_64()
    while read := handle.readinto(buffer):
        digest.update(view[:read])
    return digest.hexdigest()


def sampled_crc32(handle: IO[bytes], size: int) -> int:
    """CRC-32 of `SAMPLED_BLOCKS` evenly spaced blocks of the open file `handle` of `size` bytes
    (of all of it when it is no longer): the checksum of format-1 manifests."""
    if size <= SAMPLED_BLOCKS * SAMPLED_BLOCK_BYTES:
        handle.seek(0)
        return zlib.crc32(handle.read())
    crc = 0
    for block in range(SAMPLED_BLOCKS):
        handle.seek((size - SAMPLED_BLOCK_BYTES) * block // (SAMPLED_BLOCKS - 1))
        crc = zlib.crc32(handle.read(SAMPLED_BLOCK_BYTES), crc)
    return crc


def put_in_place(staging: Path, directory: Path) -> Path:
    """Rename the sealed `staging` to `directory`, atomically replacing a previous checkpoint there
    (its `pacs.outputs.MARKER` kept), which is removed only once the new one is in place; the
    parent folder is fsynced so that the rename survives a crash."""
    if not directory.exists():
        os.replace(staging, directory)
        _fsync_directory(directory.parent)
        return directory
    if is_pacs_output(directory):
        shutil.copy2(directory / MARKER, staging / MARKER)
    if exchange(staging, directory):  # `directory` is never without a checkpoint
        retired = staging
    else:  # two renames: a kill between them leaves `directory` absent (`remove_dead_staging`)
        retired = directory.parent / f".old-{directory.name}-{os.getpid()}"
        os.replace(directory, retired)
        os.replace(staging, directory)
    _fsync_directory(directory.parent)
    shutil.rmtree(retired)
    return directory


def exchange(first: Path, second: Path) -> bool:
    """Swap `first` and `second` in one atomic step (Linux's renameat2 with RENAME_EXCHANGE), so
    that neither name is ever missing; False, having changed nothing, where the system or the
    file system cannot (another OS, an old kernel or C library, NFS)."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(error, os.strerror(error), str(first), None, str(second))


def link_checkpoint(source: Path, directory: Path) -> Path:
    """`directory` as a checkpoint of the same files as the sealed checkpoint `source`: hard links
    (copies where the file system refuses them), put in place like any checkpoint (a failure
    before that leaves no staging folder)."""
    staging = staging_directory(directory)
    with removed_on_error(staging):
        for path in sorted(source.rglob("*")):
            target = staging / path.relative_to(source)
            if path.is_dir():
                target.mkdir(exist_ok=True)
            elif path.name != MARKER:
                try:
                    os.link(path, target)
                except OSError as error:
                    if error.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                        raise
                    shutil.copy2(path, target)
                    with open(target, "rb") as handle:
                        os.fsync(handle.fileno())
        for folder in sorted((p for p in staging.rglob("*") if p.is_dir()), reverse=True):
            _fsync_directory(folder)
        _fsync_directory(staging)
    return put_in_place(staging, directory)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def checkpoint_problem(directory: Path, *, contents: bool = True) -> str | None:
    """Why the checkpoint in `directory` cannot be resumed (a file missing, shorter or longer than
    its manifest says, or, with `contents`, holding other bytes than its checksum says: every
    byte read), or None. A checkpoint without a manifest (written by a pacs before manifests) is
    taken as whole when its trainer state is there."""
    manifest_path = directory / MANIFEST
    if not manifest_path.is_file():
        return None if (directory / TRAINER_STATE).is_file() else f"it has neither {MANIFEST} nor {TRAINER_STATE}"
    try:
        manifest = json.loads(manifest_path.read_text())
        files, whole_files = manifest["files"], manifest.get("format", 1) >= 2
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return f"its {MANIFEST} cannot be read ({error})"
    for name, expected in files.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size != expected["bytes"]:
                return f"{name} holds {size:,} bytes where its manifest says {expected['bytes']:,}"
            if contents and (
                file_hash(handle) != expected["xxh3_64"] if whole_files else sampled_crc32(handle, size) != expected["crc32"]
            ):
                return f"{name} does not hold the bytes its manifest's checksum says"
    return None


def checkpoint_step(directory: Path) -> int | None:
    """The step a checkpoint holds: its manifest's, else its trainer state's (a checkpoint written
    before manifests existed), else None."""
    try:
        return int(json.loads((directory / MANIFEST).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:  # a checkpoint written before manifests
        return int(torch.load(directory / TRAINER_STATE, weights_only=True, map_location="cpu", mmap=True)["step"])
    except Exception:  # unreadable: the checkpoint is reported damaged by checkpoint_problem
        return None


def checkpoints_newest_first(checkpoints_dir: Path) -> list[FoundCheckpoint]:
    """Every `step_N` and `final` folder in `checkpoints_dir`, newest step first (`final` before a
    step checkpoint of the same step), each with its `checkpoint_problem` as far as the sizes tell
    (its bytes unread: `checkpoint_problem(path)` reads them)."""
    found = []
    if checkpoints_dir.is_dir():
        for path in checkpoints_dir.iterdir():
            match = STEP_NAME.fullmatch(path.name)
            if not path.is_dir() or not (match or path.name == FINAL):
                continue
            problem = checkpoint_problem(path, contents=False)
            step = int(match.group(1)) if match else checkpoint_step(path)
            if step is None:
                step, problem = -1, problem or f"its step cannot be read from {MANIFEST} or {TRAINER_STATE}"
            found.append(FoundCheckpoint(path, step, problem))
    return sorted(found, key=lambda checkpoint: (checkpoint.step, checkpoint.path.name == FINAL), reverse=True)


def remove_older_checkpoints(checkpoints_dir: Path, keep: int) -> list[Path]:
    """Remove every `step_N` folder but the `keep` newest (`final` is never removed); return them."""
    steps = sorted(
        (int(match.group(1)), path)
        for path in checkpoints_dir.iterdir()
        if path.is_dir() and (match := STEP_NAME.fullmatch(path.name))
    )
    removed = [path for _, path in steps[: max(0, len(steps) - keep)]]
    for path in removed:
        shutil.rmtree(path)
    return removed


def remove_dead_staging(checkpoints_dir: Path) -> list[str]:
    """Remove the staging folders (`.tmp-NAME-PID`, `.old-NAME-PID`) that a process killed while
    saving left behind, and say what was done with each. Call it holding the run's lock
    (`pacs.outputs.lock_run`): no live process writes them. An `.old-NAME-PID` without NAME (a kill between
    `put_in_place`'s two renames) holds the only whole copy of NAME: it is kept, and named."""
    if not checkpoints_dir.is_dir():
        return []
    notes = []
    for path in sorted(checkpoints_dir.iterdir()):
        match = _STAGING_NAME.fullmatch(path.name)
        if not (match and path.is_dir()):
            continue
        if match["kind"] == "old" and not (checkpoints_dir / match["name"]).exists():
            notes.append(
                f"kept {path}: it holds {match['name']}, which a killed save was replacing; rename it to "
                f"{checkpoints_dir / match['name']} to resume from it"
            )
            continue
        shutil.rmtree(path)
        notes.append(f"removed {path}, left by a save that was killed")
    return notes
