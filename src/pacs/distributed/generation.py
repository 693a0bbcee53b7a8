"""The policy unsharded for the whole of a `generate` call, not per token."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.fsdp import FSDPModule

from pacs.distributed.wrapping import unwrap


@contextmanager
def unsharded_for_generation(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The unwrapped model, ready to generate: under FSDP2 every shard group is all-gathered once
    on entry and stays whole until exit (no per-token collectives, and ranks may generate different
    numbers of tokens). On exit the layers reshard and go back to resharding after forward; the
    root (the first FSDP module) stays gathered, as `wrap_model` set it to be after every forward.
    Under DDP, or with one process, the model inside any wrapper, as it is."""
    sharded = [module for module in model.modules() if isinstance(module, FSDPModule)]
    root, layers = (sharded[0], sharded[1:]) if sharded else (None, [])
    for module in layers:
        module.set_reshard_after_forward(False, recurse=False)
    for module in [root, *layers] if root is not None else []:
        module.unshard()
    try:
        yield unwrap(model)
    finally:
        for module in layers:
            module.reshard()
            module.set_reshard_after_forward(True, recurse=False)
