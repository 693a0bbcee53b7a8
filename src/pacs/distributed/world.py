"""This process's place among all of them: rank, world size, device and strategy, and its share of
a step's prompts. Facts only: collectives are in `collectives.py`, models in `wrapping.py`."""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

STRATEGIES = ("auto", "ddp", "fsdp")
SEPARATE_STORES = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""Set to 1 in torchrun's environment, each attempt of a job gets a rendezvous store of its own
(`check_restartable`)."""


class DistributedConfigError(ValueError):
    """A batch that cannot be split evenly across the processes, or a strategy that cannot run."""


@dataclass(frozen=True)
class World:
    """This process's place among all of them: `rank` of `world_size`, on `device`, with
    `strategy` "none" (one process), "ddp" or "fsdp"; `local_rank` among its node's processes."""

    rank: int
    world_size: int
    device: torch.device
    strategy: str
    local_rank: int = 0

    @classmethod
    def single(cls, device: torch.device | str = "cpu") -> World:
        return cls(rank=0, world_size=1, device=torch.device(device), strategy="none")

    @classmethod
    def from_environment(cls, strategy: str = "auto", timeout_s: float = 1800.0) -> World:
        """Join the process group that torchrun (or `accelerate launch`) describes in the
        environment (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT): NCCL on CUDA, gloo on
        CPU, a collective that waits longer than `timeout_s` seconds ending the job. Without a
        launcher: one process, on CUDA if there is one."""
        if strategy not in STRATEGIES:
            raise DistributedConfigError(f"unknown train.strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cpu")
        if torch.cuda.is_available():
            per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(local_rank + 1)))
            device = torch.device("cuda", cuda_device_index(local_rank, torch.cuda.device_count(), per_node))
        if world_size == 1:
            return cls.single(device)
        check_restartable(os.environ)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s))
        return cls(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            device=device,
            strategy="ddp" if strategy == "auto" else strategy,
            local_rank=local_rank,
        )

    @property
    def is_writer(self) -> bool:
        """Rank 0 alone writes files (metrics, TensorBoard, config, checkpoints, rollouts)."""
        return self.rank == 0

    @property
    def place(self) -> str:
        """Where this process runs, for errors: "node N (host H), rank R" (N: torchrun's node rank)."""
        return f"node {os.environ.get('GROUP_RANK', '0')} (host {socket.gethostname()}), rank {self.rank}"

    @property
    def loss_scale(self) -> float:
        """Each rank's loss is its share of the global loss; DDP and FSDP2 average gradients over
        ranks, so multiplying by the world size makes the synchronised gradient their sum."""
        return float(self.world_size)

    def check_divisible(self, batch_size: int, mini_batch_size: int) -> None:
        """Refuse a step that cannot be shared evenly: each mini-batch's prompts must split into
        `world_size` equal shares (and the batch into whole mini-batches)."""
        if mini_batch_size % self.world_size:
            raise DistributedConfigError(
                f"train.mini_batch_size={mini_batch_size} prompts cannot be split evenly across "
                f"{self.world_size} processes; each optimizer update needs the same number of whole "
                f"prompt groups on every process. Use a mini_batch_size that is a multiple of "
                f"{self.world_size} (and a batch_size that is a multiple of it)"
            )
        if batch_size % mini_batch_size:
            raise DistributedConfigError(f"train.mini_batch_size={mini_batch_size} must divide train.batch_size={batch_size}")

    def shard_prompts(self, prompts: Sequence[Any], mini_batch_size: int, rank: int | None = None) -> list[Any]:
        """This rank's (or `rank`'s) prompts of a step: from each consecutive mini-batch of
        `mini_batch_size` prompts, the `rank`-th of `world_size` equal contiguous slices, in order."""
        self.check_divisible(len(prompts), mini_batch_size)
        share = mini_batch_size // self.world_size
        rank = self.rank if rank is None else rank
        return [
            prompt
            for start in range(0, len(prompts), mini_batch_size)
            for prompt in prompts[start + rank * share : start + (rank + 1) * share]
        ]

    def close(self) -> None:
        """Tear the process group down, after freeing what is unreachable: a model that FSDP or
        DDP wrapped sits in reference cycles (modules, hooks, device meshes that hold the group)
        that would otherwise be freed at interpreter exit, which aborts a process when a
        communication thread then needs the interpreter to free a tensor (pytorch/pytorch#179291).
        Call it once the models are out of reach."""
        if self.world_size > 1 and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()


def check_restartable(environment: dict[str, str] | os._Environ) -> None:
    """Refuse a torchrun job whose workers torchrun may restart (`--max-restarts` > 0) but could
    not reconnect: torchrun (torch 2.13) keeps one rendezvous store for a whole job and shares it
    with its workers, so restarted workers read the killed ones' addresses from it and wait for
    them until the collective timeout (pytorch/pytorch#135712). `SEPARATE_STORES`=1 avoids it."""
    restartable = int(environment.get("TORCHELASTIC_MAX_RESTARTS") or 0) > 0
    if restartable and environment.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise DistributedConfigError(
            f"torchrun --max-restarts {environment['TORCHELASTIC_MAX_RESTARTS']} would restart workers that never "
            "reconnect: torchrun shares one rendezvous store with every attempt's workers, and the restarted ones "
            "find the killed ones' addresses in it (pytorch/pytorch#135712). Launch with "
            f"{SEPARATE_STORES}=1 in torchrun's environment ({SEPARATE_STORES}=1 torchrun --max-restarts ...), "
            "which gives each attempt a store of its own"
        )


def cuda_device_index(local_rank: int, visible_devices: int, processes_per_node: int) -> int:
    """The CUDA device (torch's ordinal among the devices this process sees) of the process with
    `local_rank` among `processes_per_node` on its node: 0 when it sees one GPU (a launcher that
    gives each process its own, as SLURM's `--gpus-per-task` does, or processes sharing one), its
    local rank when it sees one per process or more. DistributedConfigError otherwise."""
    if visible_devices == 1:
        return 0
    if local_rank < visible_devices and processes_per_node <= visible_devices:
        return local_rank
    raise DistributedConfigError(
        f"{processes_per_node} processes on this node, and process {local_rank} sees {visible_devices} GPUs: give "
        "each process one GPU (CUDA_VISIBLE_DEVICES) or every process all of them, at least one per process"
    )
