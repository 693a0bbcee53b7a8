"""Writing a Hugging Face model directory from whichever process is asked to, and from a stream
of tensors.

Once a process group exists, transformers' `save_pretrained` writes only on global rank 0
(`should_save_on_this_rank`), and silently writes nothing elsewhere. A node's own cache (a
built-in model, its warm-start) is written by that node's first process, whatever its global
rank, so pacs saves those through `save_from_this_process`.

`save_pretrained` needs the whole state dict at once. A sharded model's state is gathered one
tensor at a time instead, and `save_streamed` writes what `save_pretrained` would from that
stream, holding at most one file's worth of tensors (`write_safetensors_files`):

    config.json, generation_config.json
    model.safetensors                                         (one file), or
    model-00001-of-0000N.safetensors ... + model.safetensors.index.json
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import PreTrainedModel

WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"


def process_umask() -> int:
    """This process's umask, read without changing it (Linux's /proc; elsewhere set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def with_umask_modes(directory: Path) -> Path:
    """Give `directory` and everything in it the modes a new file or folder gets from the user's
    umask (0666 / 0777 minus it), and return it. safetensors writes its files 0600, and a
    `tempfile.mkdtemp` folder is 0700: a checkpoint that others on the machine (or a serving job
    run as another user) cannot read, whatever the user's umask says."""
    mask = process_umask()
    for path in [directory, *directory.rglob("*")]:
        if not path.is_symlink():
            path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)
    return directory


def save_from_this_process(model: PreTrainedModel, directory: Path, **options) -> None:
    """`model.save_pretrained(directory, **options)`, written by this process even when it is
    not global rank 0 of a process group."""
    # an instance attribute over transformers' method, deleted below: save_pretrained asks it whether this process writes
    model.should_save_on_this_rank = lambda is_main_process: is_main_process  # type: ignore[method-assign]
    try:
        model.save_pretrained(directory, **options)
    finally:
        del model.should_save_on_this_rank


def write_safetensors_files(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    directory: Path,
    stem: str,
    file_bytes: int,
    as_saved: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] = dict,
) -> list[tuple[str, list[str]]]:
    """Each (name, tensor) into `directory/<stem>-00001.safetensors`, `-00002`, ..., taken from
    `named_tensors` one at a time: a file is written as soon as the next tensor would take it past
    `file_bytes` (a tensor larger than that gets a file of its own), so no more than `file_bytes`
    of tensors are ever held here. `as_saved` maps each file's tensors to those written (e.g.
    renamed). Returns each file's name and the names of the tensors in it, in order; no tensors:
    no file (and no directory)."""
    files: list[tuple[str, list[str]]] = []
    pending: dict[str, torch.Tensor] = {}
    pending_bytes = 0

    def flush() -> None:
        nonlocal pending_bytes
        name = f"{stem}-{len(files) + 1:05d}.safetensors"
        written = {key: tensor.contiguous() for key, tensor in as_saved(pending).items()}
        directory.mkdir(parents=True, exist_ok=True)
        save_file(written, str(directory / name), metadata={"format": "pt"})
        files.append((name, list(written)))
        pending.clear()
        pending_bytes = 0

    for name, tensor in named_tensors:
        size = tensor.numel() * tensor.element_size()
        if pending and pending_bytes + size > file_bytes:
            flush()
        pending[name] = tensor
        pending_bytes += size
    if pending:
        flush()
    return files


def save_streamed(
    model: PreTrainedModel, directory: Path, named_tensors: Iterable[tuple[str, torch.Tensor]], file_bytes: int
) -> None:
    """What `model.save_pretrained(directory)` writes (config, generation config, safetensors
    weights in the layout transformers loads: `_as_saved`), with the weights taken from
    `named_tensors` (each of the model's state-dict tensors once, a tied weight under its first
    name, as `save_pretrained` keeps it), one at a time, in files of at most `file_bytes`: one
    `WEIGHTS_FILE`, or numbered shards and a `WEIGHTS_INDEX_FILE`."""
    directory.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]
    config.dtype = str(model.dtype).removeprefix("torch.")
    config.save_pretrained(directory)
    if model.can_generate():
        model.generation_config.save_pretrained(directory)
    files = write_safetensors_files(named_tensors, directory, "model", file_bytes, lambda shard: _as_saved(model, shard))
    if len(files) == 1:
        os.replace(directory / files[0][0], directory / WEIGHTS_FILE)
        return
    weight_map, total_size = {}, 0
    for number, (name, keys) in enumerate(files, start=1):
        final = f"model-{number:05d}-of-{len(files):05d}.safetensors"
        os.replace(directory / name, directory / final)
        weight_map.update(dict.fromkeys(keys, final))
        total_size += (directory / final).stat().st_size
    index = {"metadata": {"total_size": total_size}, "weight_map": weight_map}
    (directory / WEIGHTS_INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _as_saved(model: PreTrainedModel, shard: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`shard` as `save_pretrained` writes it: transformers 5 holds some architectures' weights
    in another layout than their checkpoints (a mixture of experts' stacked experts) and reverts
    it on save, file by file when it saves offloaded weights, as here; transformers 4 writes
    weights as the model holds them."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        return shard
    return revert_weight_conversion(model, shard)
