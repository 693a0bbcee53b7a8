"""Everything that makes the loop run on N processes, in one place.

The loop in `pacs.train.trainer` reads as the algorithm; it asks this module who does what:

    world = World.from_environment(config.train.strategy)   # torchrun / accelerate launch env
    model = world.wrap(model)                                # DDP or FSDP2 (or nothing)
    local_prompts = world.shard_prompts(step_prompts, mini_batch_size)
    ... generate / score / update on the local share ...
    metrics = world.mean_over_ranks(metrics, weights)       # global, on every rank
    if world.is_writer: write files                          # rank 0 alone

Sharding a step (DESIGN.md, section 6). Every rank draws the same `train.batch_size` prompts
(same sampler state), cuts them into the step's mini-batches of `train.mini_batch_size` prompts,
and takes the r-th contiguous slice of each: rank r's k-th local mini-batch is a share of the
global mini-batch k, so an N-process update sees exactly the mini-batches of a 1-process update.
A prompt's whole group lives on one rank, so group statistics stay local.

Exactness. Every loss is "sum over the global mini-batch / a global count"; each rank
back-propagates its own rows divided by the global count (`sum` gives the counts), and the
gradients are summed across ranks: DDP and FSDP2 average, so the loop scales each local loss by
the world size (`loss_scale`).

FSDP2 (`train.strategy=fsdp`): `fully_shard` each decoder layer, then the root; parameters,
gradients and optimizer state are sharded, and gradients stay sharded between micro-batches
(each backward reduce-scatters: more communication than one reduction per update, but no rank
ever holds a whole unsharded gradient). The frozen KL reference is sharded the same way
(`shard_frozen`). Generation unshards every layer once and keeps them unsharded until it ends
(`generation`), so it never all-gathers per token (and ranks may generate different numbers of
tokens without a collective to hang on). Checkpoints gather the model's state (`named_state`) and
the optimizer's to rank 0 one tensor at a time (`whole_on_writer`), which writes each into
files of bounded size as it comes; on resume, the optimizer state is read by rank 0 alone and
sent to each rank as its shard (`from_writer_like`).

Collectives. Every collective pacs calls is a method of `World`, and each one hands the backend
its tensors on the device that backend serves (`communication_device`): NCCL serves CUDA tensors
only, gloo CPU ones, so a caller may build its counts on the CPU whatever the backend.
`tests/test_distributed_runs.py` keeps it so: a 2-process training run fails if pacs calls a
`torch.distributed` collective from anywhere else.

Several nodes. Nodes may share nothing but the network (node-local disks). Rank 0 alone reads
what only it may see (the checkpoint to resume, the models `load_once` loads) and sends every
rank its part; a decision every rank must take alike is rank 0's (`decided_by_writer`); and what
each node reads from its own disk (the tokenizer, the data, a LoRA base model) is read under
`on_every_rank` (`on_every_node` when it fills the node's cache), so that a node that lacks it
stops every rank with one error naming that node, instead of leaving the others waiting in a
collective it never joins.

One process (no launcher) is the trivial case: nothing is wrapped and every collective is the
identity.
"""

from __future__ import annotations

import gc
import os
import socket
from datetime import timedelta
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.nn.parallel import DistributedDataParallel

from pacs.models.lora import language_model

STRATEGIES = ("auto", "ddp", "fsdp")
T = TypeVar("T")


class DistributedConfigError(ValueError):
    """A batch that cannot be split evenly across the processes, or a strategy that cannot run."""


class NodeError(ValueError):
    """Something that some ranks could not do (`World.on_every_rank`), raised on every rank: the
    message names each rank that failed, its node and host, and its error."""


@dataclass(frozen=True)
class WeightsAside:
    """Rank 0's loaded tensors, kept while its model is sent as a skeleton (`World.load_once`):
    the state dict, and every buffer (non-persistent ones, like rotary frequencies, included).
    Empty on the other ranks, whose skeletons rank 0's tensors fill."""

    state: dict[str, torch.Tensor]
    buffers: dict[str, torch.Tensor]


@dataclass(frozen=True)
class World:
    """This process's place among all of them: `rank` of `world_size`, on `device`, with
    `strategy` "none" (one process), "ddp" or "fsdp"."""

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

    # ----- the step's data ---------------------------------------------------------------------

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
            raise DistributedConfigError(
                f"train.mini_batch_size={mini_batch_size} must divide train.batch_size={batch_size}"
            )

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

    # ----- collectives (identity with one process) -------------------------------------------

    def _to_backend(self, tensor: torch.Tensor) -> torch.Tensor:
        """A copy of `tensor` on a device the process group's backend serves
        (`communication_device`), for a collective to work on in place."""
        device = communication_device(dist.get_backend_config(), tensor.device, self.local_rank)
        return tensor.detach().to(device, copy=True)

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """The sum of `value` over every rank (a new tensor on `value`'s device; any shape)."""
        if self.world_size == 1:
            return value.clone()
        total = self._to_backend(value)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total.to(value.device)

    def max(self, value: float) -> float:
        """The largest `value` of any rank."""
        if self.world_size == 1:
            return value
        largest = self._to_backend(torch.tensor(value, dtype=torch.float64))
        dist.all_reduce(largest, op=dist.ReduceOp.MAX)
        return float(largest)

    def gather_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """(b, ...) rows of every rank, concatenated in rank order: (world_size * b, ...). Every
        rank must pass the same shape."""
        if self.world_size == 1:
            return rows
        local = self._to_backend(rows)
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(parts, local)
        return torch.cat(parts).to(rows.device)

    def gather_objects(self, value: Any) -> list[Any]:
        """`value` of every rank, in rank order (picklable objects between this job's own
        processes; used for rollout records and evaluation reports)."""
        if self.world_size == 1:
            return [value]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, value)
        return gathered

    def gather_on_writer(self, value: Any) -> list[Any] | None:
        """`value` of every rank, in rank order, on rank 0 alone (None on the others): for what
        rank 0 alone writes (evaluation records), which no other rank needs a copy of."""
        if self.world_size == 1:
            return [value]
        gathered: list[Any] | None = [None] * self.world_size if self.is_writer else None
        dist.gather_object(value, gathered, dst=0)
        return gathered

    def _from_writer(self, tensor: torch.Tensor) -> torch.Tensor:
        """Rank 0's `tensor` (same shape and dtype on every rank), on the caller's device."""
        received = self._to_backend(tensor)
        dist.broadcast(received, src=0)
        return received.to(tensor.device)

    def decided_by_writer(self, decide: Callable[[], Any]) -> Any:
        """Rank 0's `decide()` on every rank, which none of the others runs: for a decision that
        every rank must take alike (which checkpoint to resume, what a file holds) from what rank
        0 sees. When it raises, every rank raises the same error (none is left waiting)."""
        if self.world_size == 1:
            return decide()
        outcome = None
        if self.is_writer:
            try:
                outcome = (True, decide())
            except Exception as error:  # sent to every rank, raised below on each
                outcome = (False, error)
        message = [outcome]
        dist.broadcast_object_list(message, src=0)
        succeeded, value = message[0]
        if not succeeded:
            raise value
        return value

    def on_every_rank(self, action: Callable[[], T], *, remedy: str = "") -> T:
        """`action()` on every rank, its own value returned to each: for what every node does from
        its own disk (reading the tokenizer, the data). When it raises on any rank, every rank
        raises one `NodeError` that names each failed rank (`place`) and its error, then
        `remedy`, so none goes on into a collective that a failed rank will never join."""
        if self.world_size == 1:
            return action()
        value, own_error = None, None
        try:
            value = action()
        except Exception as error:  # every rank learns of it below
            own_error = error
        failure = None if own_error is None else f"{self.place}: {type(own_error).__name__}: {own_error}"
        failures = [failure for failure in self.gather_objects(failure) if failure is not None]
        if failures:
            lines = [f"{len(failures)} of {self.world_size} processes could not go on:", *failures, remedy]
            raise NodeError("\n".join(line for line in lines if line)) from own_error
        return value

    def mean_over_ranks(self, metrics: dict[str, float], weights: dict[str, float] | None = None) -> dict[str, float]:
        """Metrics that are means over each rank's own rows or tokens, made global: the mean over
        the ranks that report a key, each rank weighted by `weights[key]` (the count its value is a
        mean over; 1 when absent). Non-finite values stay non-finite."""
        if self.world_size == 1:
            return dict(metrics)
        weights = weights or {}
        per_rank = self.gather_objects({key: (value, weights.get(key, 1.0)) for key, value in metrics.items()})
        reduced = {}
        for key in dict.fromkeys(key for values in per_rank for key in values):
            pairs = [values[key] for values in per_rank if key in values]
            total_weight = sum(weight for _, weight in pairs)
            if total_weight > 0:
                reduced[key] = sum(value * weight for value, weight in pairs if weight) / total_weight
            else:
                reduced[key] = sum(value for value, _ in pairs) / len(pairs)
        return reduced

    def slowest(self, timings: dict[str, float]) -> dict[str, float]:
        """Each timing (seconds) of the slowest rank."""
        if self.world_size == 1:
            return dict(timings)
        per_rank = self.gather_objects(timings)
        return {key: max(values[key] for values in per_rank) for key in timings}

    def on_every_node(self, load: Callable[[], T], *, remedy: str = "") -> T:
        """`load()` on every rank, each node's first rank before the others (`node_leader_first`:
        it fills the node's cache, a built-in model or a hub download), a failure on any rank
        raised on every rank (`on_every_rank`)."""

        def leader_first() -> T:
            with self.node_leader_first():
                return load()

        return self.on_every_rank(leader_first, remedy=remedy)

    @contextmanager
    def node_leader_first(self) -> Iterator[None]:
        """Run the body on each node's local rank 0 first, then on the other ranks: for work that
        fills a per-node cache (building a built-in model, downloading from the hub), so that the
        other ranks find it done instead of racing to write it."""
        if self.local_rank != 0:
            self.barrier()
        try:
            yield
        finally:  # a leader that failed still lets the others go (they report their own outcome)
            if self.local_rank == 0:
                self.barrier()

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def close(self) -> None:
        """Tear the process group down, after freeing what is unreachable: a model that FSDP or
        DDP wrapped sits in reference cycles (modules, hooks, device meshes that hold the group)
        that would otherwise be freed at interpreter exit, which aborts a process when a
        communication thread then needs the interpreter to free a tensor (pytorch/pytorch#179291).
        Call it once the models are out of reach."""
        if self.world_size > 1 and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()

    # ----- models ------------------------------------------------------------------------------

    def load_once(self, load: Callable[[], torch.nn.Module]) -> tuple[torch.nn.Module, WeightsAside | None]:
        """A model for `wrap` or `shard_frozen`, read by rank 0 alone: rank 0 runs `load()` (on the
        CPU), keeps its tensors aside and sends every rank the model as an empty skeleton on the
        meta device, which `wrap` fills from rank 0's tensors (each rank its shard under FSDP, the
        whole model under DDP). So no node holds one copy per rank while loading, and only rank 0
        needs to see what `load` reads (a checkpoint on its own disk). With one process: `load()`.
        Every rank must call it."""
        if self.strategy == "none":
            return load(), None
        aside = WeightsAside({}, {})  # rank 0 fills it; elsewhere it says "a skeleton to fill"

        def skeleton_of_loaded() -> torch.nn.Module:
            model = load()
            aside.state.update(model.state_dict())
            aside.buffers.update(model.named_buffers())
            return model.to("meta")  # the tensors aside keep their data; the model is now a skeleton

        skeleton = self.decided_by_writer(skeleton_of_loaded)
        skeleton.tie_weights()  # moving to the meta device gave tied weights a parameter each
        return skeleton, aside

    def wrap(
        self, model: torch.nn.Module, *, compute_dtype: torch.dtype | None = None, aside: WeightsAside | None = None
    ) -> torch.nn.Module:
        """`model` on this rank's device, wrapped for the strategy: DDP, or FSDP2 with each
        decoder layer and then the root sharded (bf16 compute with fp32 sharded master weights
        when `compute_dtype` is bfloat16). For a LoRA model the FSDP root is the Hugging Face
        model inside peft's wrapper, the module that generation calls as well. A skeleton from
        `load_once` is filled from rank 0's tensors: under FSDP sharded empty first, each rank
        then keeping its shard; under DDP whole (DDP's own broadcast of rank 0's tensors at
        construction is then skipped: they are there already)."""
        if self.strategy == "ddp":
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            model = self._on_device(model, aside)
            return DistributedDataParallel(model, device_ids=device_ids, init_sync=aside is None)
        if self.strategy == "fsdp":
            return self._fully_shard(model, compute_dtype, reshard_root=False, aside=aside)
        return model.to(self.device)

    def shard_frozen(
        self, model: torch.nn.Module, *, compute_dtype: torch.dtype | None = None, aside: WeightsAside | None = None
    ) -> torch.nn.Module:
        """A model that is never trained (the KL reference), ready for forward passes: sharded like
        `wrap` under FSDP, the root resharded after forward too (no rank holds it whole between
        passes: no backward follows), on this rank's device otherwise."""
        model.requires_grad_(False)
        if self.strategy == "fsdp":
            return self._fully_shard(model, compute_dtype, reshard_root=True, aside=aside).eval()
        return self._on_device(model, aside).eval()

    def _on_device(self, model: torch.nn.Module, aside: WeightsAside | None) -> torch.nn.Module:
        """`model` on this rank's device; a skeleton (`load_once`) given storage there and filled."""
        if aside is None:
            return model.to(self.device)
        model.to_empty(device=self.device)
        model.tie_weights()  # to_empty gave tied weights a tensor each
        self._fill_from_writer(model, aside)
        return model

    def _fully_shard(
        self, model: torch.nn.Module, compute_dtype: torch.dtype | None, *, reshard_root: bool, aside: WeightsAside | None
    ) -> torch.nn.Module:
        """FSDP2 on each decoder layer, then on the root; the root of a trained model keeps its
        parameters gathered after forward (FSDP2's own choice for a root: backward needs them
        right away), which `generation` restores. A skeleton (`load_once`) is sharded on the meta
        device, given storage for its shards only, and filled: each tensor is broadcast from rank
        0, every rank keeping its shard."""
        policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32) if compute_dtype else MixedPrecisionPolicy()
        if aside is None:
            model = model.to(self.device)
        for layer in decoder_layers(model):
            fully_shard(layer, mp_policy=policy)
        fully_shard(language_model(model), mp_policy=policy, reshard_after_forward=reshard_root)
        if aside is not None:
            model.to_empty(device=self.device)
            self._fill_from_writer(model, aside)
        return model

    def _fill_from_writer(self, model: torch.nn.Module, aside: WeightsAside) -> None:
        """Every tensor of a skeleton that has storage, filled from rank 0's `aside`: each state
        tensor broadcast, every rank keeping what it holds of it (its shard of a sharded one),
        then every buffer (non-persistent ones, like rotary frequencies, included)."""
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, aside.state, options=options)
        for name, buffer in model.named_buffers():
            buffer.copy_(self._from_writer(aside.buffers[name] if self.is_writer else buffer))

    @staticmethod
    def unwrap(model: torch.nn.Module) -> torch.nn.Module:
        """The Hugging Face model inside a DDP wrapper (FSDP2 shards in place: no wrapper)."""
        return model.module if isinstance(model, DistributedDataParallel) else model

    def gradient_sync(self, model: torch.nn.Module, sync: bool):
        """A context in which backward passes synchronise gradients across ranks only when `sync`
        (the last micro-batch of an optimizer update). Under FSDP2 every backward synchronises:
        its reduce-scatter keeps each rank's gradients a shard, where skipping it would hold the
        whole unsharded gradient until the update's last micro-batch."""
        if sync or self.strategy != "ddp":
            return nullcontext()
        return model.no_sync()

    @contextmanager
    def generation(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """The unwrapped model, ready to generate: under FSDP2 every shard group is all-gathered
        once on entry and stays whole until exit (no per-token collectives). On exit the layers
        reshard and go back to resharding after forward; the root (the first FSDP module) stays
        gathered, as `wrap` set it to be after every forward."""
        root, *layers = [module for module in model.modules() if isinstance(module, FSDPModule)] or [None]
        for module in layers:
            module.set_reshard_after_forward(False, recurse=False)
        for module in [root, *layers] if root is not None else []:
            module.unshard()
        try:
            yield self.unwrap(model)
        finally:
            for module in layers:
                module.reshard()
                module.set_reshard_after_forward(True, recurse=False)

    def named_state(self, model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
        """(key, tensor) of the state dict of the model inside any wrapper, each tensor once: a
        tied weight (shared by two modules) under its first key only, the one `save_pretrained`
        keeps. Under FSDP2 the tensors are the shards (DTensors; the root is resharded first, see
        `_reshard`), for `whole_on_writer` to gather one at a time."""
        _reshard(model)
        seen: set[int] = set()
        named = []
        for key, tensor in self.unwrap(model).state_dict(keep_vars=True).items():
            if id(tensor) not in seen:
                seen.add(id(tensor))
                named.append((key, tensor))
        return named

    def named_parameters(self, model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
        """(name, parameter) of the model inside any wrapper, as its optimizer holds them: under
        FSDP2 the shards (the root is resharded first, see `_reshard`)."""
        _reshard(model)
        return list(self.unwrap(model).named_parameters())

    def whole_state(self, model: torch.nn.Module, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """Each (name, tensor) of the state dict of the model inside any wrapper, whole, on every
        rank, one at a time, in `dtype` when given (floating-point tensors): under FSDP2 a shard is
        cast, then all-gathered when its turn comes (every rank must iterate to the end, in step),
        so no rank holds more than one gathered tensor beyond what the consumer keeps, and a bf16
        consumer gathers half the bytes of the fp32 masters. Tied weights appear under each of
        their names."""
        _reshard(model)
        for name, tensor in self.unwrap(model).state_dict().items():
            tensor = tensor.detach()
            if dtype is not None and tensor.is_floating_point():
                tensor = tensor.to(dtype)
            yield name, tensor.full_tensor() if isinstance(tensor, DTensor) else tensor

    def whole_on_writer(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        """Each (name, tensor) whole, on rank 0's CPU, one at a time: a sharded tensor (DTensor,
        FSDP) is gathered when its turn comes, so no rank ever holds more than one of them whole.
        Yields nothing on other ranks, which must still iterate to take part."""
        for name, tensor in named_tensors:
            whole = tensor.detach().full_tensor() if isinstance(tensor, DTensor) else tensor
            if self.is_writer:
                yield name, whole.detach().to("cpu", copy=True)

    def from_writer_like(self, whole: torch.Tensor | None, like: torch.Tensor, *, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        """Rank 0's `whole` tensor (of `shape` and `dtype`; None on other ranks) as this rank holds
        tensors like `like`: its shard, placed as `like` is, for a DTensor; the whole tensor on
        `like`'s device otherwise."""
        if isinstance(like, DTensor):
            source = whole if self.is_writer else torch.empty(shape, dtype=dtype)
            return distribute_tensor(source.to(like.device), like.device_mesh, like.placements, src_data_rank=0)
        if self.world_size == 1:
            return whole.to(like.device)
        received = self._from_writer(whole if self.is_writer else torch.empty(shape, dtype=dtype))
        return received.to(like.device)


def _reshard(model: torch.nn.Module) -> None:
    """Every FSDP2 module of `model` back to its shards: the root stays gathered after a forward
    pass until the next backward ends, and while it is, the model's registered parameters are
    its gathered tensors, not the sharded ones that the optimizer and state dicts name."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


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


def communication_device(backend_config: str, tensor_device: torch.device, local_rank: int) -> torch.device:
    """Where a collective must see a tensor that lives on `tensor_device`, for a process group
    configured as `torch.distributed.get_backend_config()` says ("cuda:nccl", "cpu:gloo,cuda:nccl",
    "cpu:gloo,cuda:gloo"): where it is when the backend serves that device type, else the CPU when
    the backend serves it, else this rank's CUDA device (NCCL serves CUDA tensors only)."""
    served = {entry.split(":")[0] for entry in backend_config.split(",")}
    if tensor_device.type in served:
        return tensor_device
    if "cpu" in served:
        return torch.device("cpu")
    return torch.device("cuda", local_rank)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a Hugging Face model (the units FSDP2 shards): the
    children of its first `ModuleList` (`model.model.layers` for Qwen2 and Llama)."""
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 0:
            return list(module)
    raise DistributedConfigError(f"{type(model).__name__} has no list of decoder layers to shard with FSDP")
