"""Runs that repeat bit for bit: what pacs does by default, and what `train.deterministic` adds.

On a CPU a run is the same bits every time with the same config and seed: sampling draws from
seeded generators, and the one kernel that added in a run-dependent order (an index with repeats
back-propagated through parallel atomic adds) is not used (`pacs.train.logprobs._RowsByIndexSelect`).
The `pacs` command also puts Intel MKL's matrix products in its strict reproducible mode
(`reproducible_math_environment`), whose sums do not depend on the thread count.

GPUs choose kernels by speed: cuBLAS may split a product's sum over a workspace, cuDNN autotunes,
atomics order additions by timing, and vLLM batches requests as they come. `train.deterministic`
asks each for the reproducible choice (`use_deterministic_kernels`); the docs' table says which
parts of a run are then bitwise on which hardware.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's fixed workspace configuration that makes its results reproducible (CUDA >= 10.2)."""
MKL_REPRODUCIBLE = "AUTO,STRICT"
"""MKL's conditional numerical reproducibility: the processor's own code path (AUTO), in the
strict mode whose matrix-product results do not depend on the number of threads."""


def reproducible_math_environment(environment: MutableMapping[str, str] | None = None) -> None:
    """Put MKL in `MKL_REPRODUCIBLE` mode in `environment` (default: this process's), unless the
    user chose (`MKL_CBWR`). MKL reads it when it first computes: call it before any matrix
    product (the `pacs` command does, before torch is imported). Without it, a CPU run is the
    same bits at the same thread count only; with it, also at another thread count where MKL's
    products are the only sums split over threads (the demo recipe's model: 1 and 2 threads
    give the same bits). torch's own reductions over large tensors (> 32,768 elements) still
    split by thread count: fix OMP_NUM_THREADS to repeat those exactly."""
    environment = os.environ if environment is None else environment
    environment.setdefault("MKL_CBWR", MKL_REPRODUCIBLE)


def use_deterministic_kernels() -> None:
    """Ask torch, cuBLAS, cuDNN and vLLM for their run-to-run reproducible kernels, in this process,
    before any of them has computed (cuBLAS reads its workspace setting once): torch's
    deterministic algorithms (an operation without one raises instead of running
    nondeterministically), `CUBLAS_WORKSPACE`, cuDNN without autotuning, and vLLM's batch-invariant
    mode (`VLLM_BATCH_INVARIANT`, which vLLM supports on NVIDIA GPUs of compute capability 8.0 and
    newer). What the user set in the environment is kept."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    if torch.cuda.is_available():
        os.environ.setdefault("VLLM_BATCH_INVARIANT", "1")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
