"""`pacs` under an audit of its collectives: every `torch.distributed` collective that pacs code
calls must come through `pacs.distributed.collectives` (the one place that puts tensors on
the device the backend serves) or a caller on the allowlist (`ALLOWED`), and every tensor a
collective gets must be on a device the backend serves.

    OMP_NUM_THREADS=1 torchrun --nproc_per_node 2 tests/helpers/collective_audit.py train ARGS...

runs `pacs ARGS...` with the collectives wrapped; each call is attributed to the first frame, from
the caller outwards, that is torch's own distributed code (FSDP hooks, DTensor, checkpoint
helpers: allowed), vLLM's (an engine's own process groups, which it sets up on the job's and puts
on its own devices: allowed, at start-up and in tensor-parallel generation alike) or pacs code
(allowed only where `ALLOWED` says). Frames of other libraries are looked through: transformers'
`generate` all-reducing per token under pacs's rollout counts against the rollout. Any violation
ends the process with exit code 3 and a list.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from pacs.cli import main as pacs_main

COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "reduce",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
)
PACS = str(Path(__import__("pacs").__file__).parent)
ALLOWED: dict[str, set[str] | None] = {
    str(Path(PACS) / "distributed" / "collectives.py"): None,  # any of its functions
}
"""pacs file -> the functions in it that may call a collective (None: every one). vLLM's engine
(`pacs.rollout.vllm.VllmEngine`) needs no entry: the collectives it makes are vLLM's own frames'
(`OWNERS_OF_THEIR_COLLECTIVES`), while pacs's code around it may call none itself."""
TORCH_DISTRIBUTED = str(Path(torch.__file__).parent / "distributed")
_VLLM = importlib.util.find_spec("vllm")
OWNERS_OF_THEIR_COLLECTIVES = (TORCH_DISTRIBUTED, *([str(Path(_VLLM.origin).parent)] if _VLLM else []))
"""Libraries whose collectives are their own: torch's distributed code (FSDP hooks, DTensor,
checkpoint helpers) and vLLM (its process groups: set up on the job's by every rank's engine at
the same point of its setup, then used by tensor-parallel generation and weight loading)."""
violations: list[str] = []


def attribute(stack: list[traceback.FrameSummary]) -> str | None:
    """Why the call at the end of `stack` breaks the rule, or None."""
    for frame in reversed(stack[:-1]):  # the last frame is the wrapper itself
        if frame.filename.startswith(OWNERS_OF_THEIR_COLLECTIVES):
            return None
        if frame.filename.startswith(PACS):
            allowed = ALLOWED.get(frame.filename, set())
            return None if allowed is None or frame.name in allowed else f"{frame.filename}:{frame.lineno} ({frame.name})"
    return None


def served_device_types() -> set[str]:
    return {entry.split(":")[0] for entry in dist.get_backend_config().split(",")}


def audited(name: str, collective):
    @functools.wraps(collective)
    def wrapper(*args, **kwargs):
        culprit = attribute(traceback.extract_stack())
        if culprit:
            violations.append(f"{name} called from {culprit}")
        tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
        tensors += [item for value in args if isinstance(value, list) for item in value if isinstance(item, torch.Tensor)]
        for tensor in tensors:
            if dist.is_initialized() and tensor.device.type not in served_device_types():
                violations.append(f"{name} got a {tensor.device.type} tensor, which the backend does not serve")
        return collective(*args, **kwargs)

    return wrapper


def install() -> None:
    for name in COLLECTIVES:
        if hasattr(c10d, name):
            wrapped = audited(name, getattr(c10d, name))
            setattr(c10d, name, wrapped)
            setattr(dist, name, wrapped)


def main(arguments: list[str]) -> None:
    """`pacs ARGUMENTS` with the collectives audited."""
    install()
    try:
        pacs_main(arguments)
    finally:
        if violations:
            print("collectives outside pacs.distributed.collectives:\n" + "\n".join(sorted(set(violations))), file=sys.stderr)
            sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1:])
