"""Generation overlapping the update: `rollout.max_staleness` = k ≥ 1.

Each training process starts one generator process of its own (`serve`), which holds its own copy
of the policy in its own engine (transformers or vLLM) and generates the process's share of the
coming steps' prompts while the trainer scores, recomputes log-probs and updates. After every
update the trainer writes the new weights into a ring of shared buffers on its own device
(`WeightRing`: shared memory on a CPU, CUDA IPC on a GPU; never through gloo, a socket or the
disk), and control messages (which ring slot holds which version, what to generate, the rollouts
back) go through a pipe.

The schedule is fixed, so a run does not depend on timing and resumes exactly:

    version(j) = max(0, j − 1 − k)      the policy version (updates done) that samples step j's batch
    staleness(j) = (j − 1) − version(j) = min(j − 1, k)   versions between sampler and trained policy

The trainer sends the weights of version v = j before it asks for the batch of step j + 1 + k, and
the generator serves messages in order, so batch j is sampled by exactly version(j). The weights of
the last k + 1 updates sample no batch and are not sent. Step j's
batch thus needs no update after step j − 1 − k: with k = 1 the generator samples step j + 1's
batch while the trainer updates on step j's.

The weight ring. R = k buffers ("slots"), each one flat tensor holding every weight of the policy
in the engine's dtype, on the trainer's device; allocated once, at the first push (its layout, the
(name, shape) list, read from a first pass over the weights, so that no second copy is ever
staged), and shared with the generator once, in that push's message (a CPU slot as a shared-memory
file descriptor, a CUDA slot and its interprocess event as IPC handles). Then, for version v,
the run's n-th push:

    trainer    acquire(free)  ->  copy the weights into slot n mod R  ->  [CUDA: record slot's event]
               ->  send ("weights", v, slot)
    generator  on ("weights", v, slot): if a version is noted and not yet loaded, release(free) for
               it (skipped: no batch asked for it) and note v instead
               on ("generate", step, ...): if a version is noted: [CUDA: wait for its slot's event]
               -> copy the slot into the engine -> [CUDA: synchronize] -> release(free); then generate

`free` is a counting semaphore that starts at R. Its invariants:
- writes take the slots in turn and the generator releases versions in
  the order they were written (each one once: loaded or skipped), so a push that holds `free` writes
  a slot whose previous version the generator has loaded or skipped: a slot being read, or holding
  a version the generator may still load, is never overwritten;
- the generator loads when a batch starts, the newest version noted before that batch's request in
  the pipe, which is exactly version(step): the schedule above is unchanged;
- every version pushed is followed by a request it samples (the last k + 1 are not pushed), so
  every slot is released: with R = 1 a version that no batch loads would hold the only slot, and
  the next push would wait for ever;
- a push waits only for a load, never for a batch: at the push of version j the trainer holds batch
  j, so the generator has started (or is about to start) batch j + 1, which loads version j − k,
  the previous occupant of the slot the push takes (pushes are one per version, so slots hold
  consecutive versions); versions j − k + 1 .. j − 1 sit in the other k − 1 slots.
A push thus costs one copy of the model into the slot (on the device: one device copy); the ring
holds k models in the engine's dtype beside the generator's own copy (the pages of a slot are taken
when it is first written, so a run that stops early never touches the rest). Under FSDP each
rank feeds a generator of its own, which needs the whole model: `policy_weights` gathers it one
tensor at a time, and the one all-gather per tensor is what every rank's generator reads.

The objective under staleness is AReaL's decoupled one: the behaviour policy μ is the generator's
(its log-probs come with the rollouts as the sampler's), the proximal policy π_old is the trainer's
recomputation at the version it updates, and the algorithm's sampler correction
(`algorithm.rollout_is_cap`, `pacs.algos.importance.rollout_is_weights`) reweights by π_old / μ.

Sampling is seeded per step and rank (`batch_seed`) with the transformers engine, so a batch is the
same whenever it is generated: a checkpoint after step s saves the batches already sampled by
older versions (steps s + 1 .. s + k) and the prompts of the one sampled by version s, and a resumed
run trains exactly what an uninterrupted one would. vLLM seeds its engine once (its per-request
seeds fail on a CPU), so a resumed run with vLLM regenerates the version-s batch with another draw.
"""

from __future__ import annotations

import math
import os
import queue
import threading
import time
import traceback
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Semaphore
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from pacs.config import Config, VllmConfig
from pacs.distributed.world import World
from pacs.models.loading import DTYPES, load_causal_lm, load_tokenizer
from pacs.models.precision import Precision
from pacs.rollout.base import Rollouts, SamplingParams, rank_seed
from pacs.rollout.continuous_batching import continuous_batching_on
from pacs.rollout.hf import TransformersEngine
from pacs.rollout.vllm import VllmEngine

LAUNCHER_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
)
"""What torchrun tells a training process: the generator is no member of that job (vLLM would
otherwise join it), so it starts without them."""
DROPPED_IN_FLIGHT = (
    "the checkpoint holds batches sampled ahead (rollout.max_staleness={saved}) that this run cannot take ({why}): "
    "they are dropped, their prompts skipped, and the run goes on from the checkpoint's weights, not as an "
    "uninterrupted run would"
)
ROLLOUT_FIELDS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", "response_logprobs")


def version_of(step: int, max_staleness: int) -> int:
    """The policy version (updates done) whose weights sample the batch of `step`."""
    return max(0, step - 1 - max_staleness)


def batch_seed(seed: int, step: int, rank: int) -> int:
    """The seed of `rank`'s sampling of the batch of `step` in a run seeded with `seed`."""
    return rank_seed(rank_seed(seed, step), rank)


@dataclass(frozen=True)
class GeneratorSpec:
    """What the generator process builds: its engine ("hf" or "vllm", vLLM's settings as a dict),
    on `device` ("cpu", or the number of the one CUDA device it sees), computing with `threads`
    CPU threads in `dtype` (a key of `DTYPES`)."""

    model_path: str
    engine: str
    dtype: str
    device: str
    threads: int
    max_sequences_per_call: int
    max_model_len: int
    seed: int
    vllm: dict[str, Any] = field(default_factory=dict)
    continuous_batching: bool = False
    """Whether the hf engine batches continuously (`rollout.hf.continuous_batching`, resolved for the device)."""


@dataclass
class GeneratedBatch:
    """A step's rollouts on this rank, the version that sampled them and the generator's seconds."""

    step: int
    version: int
    prompt_indices: list[int]
    rollouts: Rollouts
    generate_s: float = 0.0


@dataclass
class Request:
    """A batch asked of the generator: its step, the version that samples it, its prompts."""

    step: int
    version: int
    prompt_indices: list[int]


# ----- the weight ring ---------------------------------------------------------------------------

Layout = list[tuple[str, tuple[int, ...]]]
WeightSource = Callable[[], Iterable[tuple[str, torch.Tensor]]]
"""The policy's weights, whole, by Hugging Face name, one at a time: each call iterates them afresh
(under FSDP every rank must iterate in step: each tensor is gathered in its turn)."""


@dataclass
class SharedRing:
    """What the generator needs to open the ring, sent once: the layout, each slot's handle (a CPU
    tensor in shared memory, or a CUDA tensor's IPC arguments) and, on CUDA, each slot's
    interprocess event handle."""

    layout: Layout
    slots: list[Any]
    events: list[bytes]


class WeightRing:
    """The trainer's side of the ring (the module's docstring gives the protocol): `slots` flat
    buffers of the weights in `dtype` on `device`, written in turn; `free` counts the slots the
    generator has released (it starts at `slots`); while `write` waits for a slot it calls
    `check_generator` every second, which raises if the generator has ended."""

    def __init__(
        self,
        slots: int,
        device: torch.device,
        dtype: torch.dtype,
        free: Semaphore,
        check_generator: Callable[[], None],
        timeout_s: float,
    ):
        if slots < 1:
            raise ValueError(f"a weight ring needs at least 1 slot, not {slots} (rollout.max_staleness >= 1)")
        self.size, self.device, self.dtype, self.free = slots, device, dtype, free
        self.check_generator, self.timeout_s = check_generator, timeout_s
        self.buffers: list[torch.Tensor] = []
        self.events: list[torch.cuda.Event] = []
        self.layout: Layout = []
        self.writes = 0

    def write(self, weights: WeightSource) -> tuple[int, SharedRing | None]:
        """Copy the weights into the next slot (waiting until the generator has released it):
        that slot's index, and the ring's handles on the first write (None after). The first write
        reads the layout from one pass over `weights` (each tensor dropped once seen) and allocates
        the ring, so no more than one model (the slot) and one tensor are ever held."""
        shared = None
        if not self.buffers:
            self.layout = [(name, tuple(tensor.shape)) for name, tensor in weights()]
            shared = self._allocate()
        slot = self.writes % self.size
        self._acquire_slot()
        for (name, tensor), (expected, place) in zip(weights(), _unflattened(self.buffers[slot], self.layout), strict=True):
            if name != expected or tuple(tensor.shape) != tuple(place.shape):
                raise ValueError(
                    f"weight {name} {tuple(tensor.shape)} where the ring's layout has {expected} {tuple(place.shape)}"
                )
            place.copy_(tensor.detach())
        if self.events:
            self.events[slot].record(torch.cuda.current_stream(self.device))
        self.writes += 1
        return slot, shared

    def _allocate(self) -> SharedRing:
        numel = sum(math.prod(shape) for _, shape in self.layout)
        if self.device.type == "cuda":
            self.buffers = [torch.empty(numel, dtype=self.dtype, device=self.device) for _ in range(self.size)]
            with torch.cuda.device(self.device):
                self.events = [torch.cuda.Event(interprocess=True) for _ in range(self.size)]
                events = [event.ipc_handle() for event in self.events]
            # the generator sees the trainer's device alone, as cuda:0: it opens each handle there
            handles = [reduce_tensor(buffer)[1] for buffer in self.buffers]
            return SharedRing(self.layout, handles, events)
        self.buffers = [_shared_memory_tensor(numel, self.dtype) for _ in range(self.size)]
        return SharedRing(self.layout, list(self.buffers), [])

    def _acquire_slot(self) -> None:
        waited = 0.0
        while not self.free.acquire(timeout=1.0):
            waited += 1.0
            self.check_generator()
            if waited >= self.timeout_s:
                raise RuntimeError(
                    f"the rollout generator released no weight slot within {self.timeout_s:g} s "
                    "(train.distributed_timeout_s): it is stuck loading weights"
                )


def _shared_memory_tensor(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised flat tensor allocated in shared memory from the start (`share_memory_` on an
    ordinary tensor would copy it into a second allocation); its pages are taken when written."""
    storage = torch.UntypedStorage._new_shared(numel * dtype.itemsize)
    return torch.empty(0, dtype=dtype).set_(storage, 0, (numel,), (1,))


class RingReader:
    """The generator's side of the ring: the newest version noted and not yet loaded, loaded when a
    batch starts (`load_newest`); every version noted is released once, loaded or skipped."""

    def __init__(self, free: Semaphore):
        self.free = free
        self.layout: Layout = []
        self.buffers: list[torch.Tensor] = []
        self.events: list[torch.cuda.Event] = []
        self.noted: tuple[int, int] | None = None
        """(version, slot) of the newest version written and not yet loaded."""

    def note(self, version: int, slot: int, shared: SharedRing | None) -> None:
        """The trainer wrote `version` into `slot` (`shared`: the ring's handles, with the first)."""
        if shared is not None:
            self._open(shared)
        if self.noted is not None:
            self.free.release()
        self.noted = (version, slot)

    def load_newest(self, load: Callable[[Iterator[tuple[str, torch.Tensor]]], None]) -> None:
        """Hand the newest version noted to `load` (views of its slot, by name), then release the slot."""
        if self.noted is None:
            return
        _, slot = self.noted
        if self.events:
            self.events[slot].synchronize()
        load(_unflattened(self.buffers[slot], self.layout))
        if self.events:
            torch.cuda.synchronize()
        self.noted = None
        self.free.release()

    def _open(self, shared: SharedRing) -> None:
        self.layout = shared.layout
        if shared.events:
            self.buffers = [rebuild_cuda_tensor(*handle[:6], 0, *handle[7:]) for handle in shared.slots]
            self.events = [torch.cuda.Event.from_ipc_handle(0, handle) for handle in shared.events]
        else:
            self.buffers = shared.slots


def _unflattened(buffer: torch.Tensor, layout: Layout) -> Iterator[tuple[str, torch.Tensor]]:
    offset = 0
    for name, shape in layout:
        count = math.prod(shape)
        yield name, buffer[offset : offset + count].view(shape)
        offset += count


# ----- the generator process ---------------------------------------------------------------------


def serve(spec: GeneratorSpec, free: Semaphore, connection: Connection) -> None:
    """The generator process: build the engine, then serve the trainer's messages in order until
    "stop" or until the trainer is gone (the pipe closes):

        ("weights", version, slot, shared)  the ring's slot holds `version` (`RingReader.note`;
                                            shared: the ring's handles, with the first push only)
        ("generate", step, prompts, params, seed) -> ("rollouts", step, arrays, texts, n, seconds)

    Replies go out through `Outbox`, so that a batch larger than the pipe's buffer never holds the
    loop up: the trainer may be waiting for this process to release a slot before it reads. Any
    error is sent back as ("error", traceback) before the process ends."""
    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    if spec.device != "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.device
    torch.set_num_threads(spec.threads)
    outbox = Outbox(connection)
    try:
        engine = _build_engine(spec)
        _serve_messages(engine, RingReader(free), connection, outbox)
    except EOFError:
        return
    except BaseException:
        outbox.put(("error", traceback.format_exc()))
    outbox.close()


class Outbox:
    """Messages to the trainer, sent in order by a thread of their own (`put` never blocks);
    `close` waits until every one is sent or the trainer is gone."""

    def __init__(self, connection: Connection):
        self.messages: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._send_each, args=(connection,), daemon=True)
        self.thread.start()

    def _send_each(self, connection: Connection) -> None:
        while (message := self.messages.get()) is not None:
            try:
                connection.send(message)
            except OSError:  # the trainer is gone
                return

    def put(self, message: tuple) -> None:
        self.messages.put(message)

    def close(self) -> None:
        self.messages.put(None)
        self.thread.join()


def _build_engine(spec: GeneratorSpec) -> TransformersEngine | VllmEngine:
    tokenizer = load_tokenizer(spec.model_path)
    if spec.engine == "vllm":
        return VllmEngine(
            spec.model_path,
            tokenizer,
            VllmConfig(**spec.vllm),
            dtype=spec.dtype,
            max_model_len=spec.max_model_len,
            seed=spec.seed,
            max_num_seqs=spec.max_sequences_per_call,
            weights_pushed=True,
        )
    model = load_causal_lm(spec.model_path, dtype=spec.dtype).to("cpu" if spec.device == "cpu" else "cuda:0").eval()
    return TransformersEngine(
        model, tokenizer, max_sequences_per_call=spec.max_sequences_per_call, continuous_batching=spec.continuous_batching
    )


def _serve_messages(engine, reader: RingReader, connection: Connection, outbox: Outbox) -> None:
    while True:
        message = connection.recv()
        if message[0] == "stop":
            return
        if message[0] == "weights":
            reader.note(*message[1:])
            continue
        _, step, prompts, params, seed = message
        reader.load_newest(lambda weights: _load(engine, weights))
        started = time.perf_counter()
        torch.manual_seed(seed)
        with torch.inference_mode():
            rollouts = engine.generate(prompts, params)
        fields = {name: getattr(rollouts, name) for name in ROLLOUT_FIELDS}
        arrays = {name: tensor.numpy() for name, tensor in fields.items()}
        outbox.put(("rollouts", step, arrays, rollouts.response_texts, params.n, time.perf_counter() - started))


def _load(engine: TransformersEngine | VllmEngine, weights: Iterator[tuple[str, torch.Tensor]]) -> None:
    """Give the generator's engine the pushed weights: vLLM loads them; transformers' engine
    generates with its module, whose tensors take them in place (a name it lacks is an error)."""
    if engine.holds_own_weights:
        engine.load_weights(weights)
        return
    state = engine.model.state_dict()
    with torch.no_grad():
        for name, tensor in weights:
            state[name].copy_(tensor)


# ----- the trainer's side ------------------------------------------------------------------------


class AsyncGenerator:
    """This training process's generator process, the ring of weights it reads (`WeightRing`, with
    `slots` slots on `device`) and the pipe for everything else. `close` ends it; it also ends when
    this process dies."""

    def __init__(self, spec: GeneratorSpec, timeout_s: float, *, device: torch.device, slots: int):
        context = mp.get_context("spawn")
        free = context.Semaphore(slots)
        self.connection, child_end = context.Pipe()
        self.process = context.Process(target=serve, args=(spec, free, child_end), name="pacs-generator", daemon=False)
        self.process.start()
        child_end.close()
        self.ring = WeightRing(slots, device, DTYPES[spec.dtype], free, self.raise_if_ended, timeout_s)

    def push(self, version: int, weights: WeightSource) -> None:
        """Write `weights` into the ring as `version` and tell the generator which slot holds it; the
        generator loads it when it starts the next batch it is asked for (`WeightRing.write`)."""
        slot, shared = self.ring.write(weights)
        self.connection.send(("weights", version, slot, shared))

    def request(self, step: int, prompts: list[list[int]], params: SamplingParams, seed: int) -> None:
        self.connection.send(("generate", step, prompts, params, seed))

    def raise_if_ended(self) -> None:
        """Raise, with its error if it sent one, when the generator process has ended."""
        if self.process.is_alive():
            return
        try:
            while self.connection.poll():
                message = self.connection.recv()
                if message[0] == "error":
                    raise RuntimeError(f"the rollout generator process failed:\n{message[1]}")
        except EOFError:
            pass
        raise RuntimeError(f"the rollout generator process ended (exit code {self.process.exitcode})")

    def receive(self) -> tuple[int, Rollouts, float]:
        """The next batch the generator finished: (step, rollouts, its seconds of generation)."""
        try:
            message = self.connection.recv()
        except EOFError:
            self.process.join(timeout=5)
            raise RuntimeError(f"the rollout generator process ended (exit code {self.process.exitcode})") from None
        if message[0] == "error":
            raise RuntimeError(f"the rollout generator process failed:\n{message[1]}")
        _, step, arrays, texts, group_size, seconds = message
        tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
        return step, Rollouts(**tensors, response_texts=texts, group_size=group_size), seconds

    def close(self) -> None:
        """Stop the generator (killed if it does not stop within 30 s)."""
        try:
            self.connection.send(("stop",))
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.connection.close()


class RolloutPipeline:
    """The schedule over this process's `AsyncGenerator` (see the module's docstring): which
    batches are asked for (`requested`, in order), which came back and wait to be trained
    (`ready`), and what a checkpoint keeps of them (`state`, `restore`)."""

    def __init__(
        self,
        generator: AsyncGenerator,
        *,
        max_staleness: int,
        last_step: int,
        params: SamplingParams,
        seed: int,
        rank: int,
        next_prompts: Callable[[], list[int]],
        token_ids: Callable[[list[int]], list[list[int]]],
    ):
        self.generator = generator
        self.max_staleness = max_staleness
        self.last_step = last_step
        self.params = params
        self.seed = seed
        self.rank = rank
        self.next_prompts = next_prompts
        """This rank's share of the next `train.batch_size` prompts (indices), as the sampler draws them."""
        self.token_ids = token_ids
        """The token ids of prompts given by index."""
        self.requested: OrderedDict[int, Request] = OrderedDict()
        self.ready: dict[int, GeneratedBatch] = {}
        self.resent: list[Request] = []
        """The requests a checkpoint kept (`restore`), to send again once the generator has the weights."""

    def begin(self, start_step: int, weights: WeightSource) -> None:
        """Give the generator the weights the run starts from (after `start_step` updates) and ask
        for the first batches: those whose prompts a checkpoint kept, then new ones up to
        `max_staleness` + 1 steps ahead."""
        self.generator.push(start_step, weights)
        for request in self.resent:
            self.request(request.step, request.prompt_indices)
        ahead = min(start_step + 1 + self.max_staleness, self.last_step)
        for step in range(start_step + 1, ahead + 1):
            if step not in self.ready and step not in self.requested:
                self.request(step, self.next_prompts())

    def advance(self, step: int, weights: WeightSource) -> None:
        """After the update of `step`: its weights to the generator, and the batch they sample,
        `max_staleness` + 1 steps ahead, asked for; nothing in the last `max_staleness` + 1 steps,
        whose weights sample no batch (every version pushed is loaded: see the module docstring)."""
        ahead = step + 1 + self.max_staleness
        if ahead <= self.last_step:
            self.generator.push(step, weights)
            self.request(ahead, self.next_prompts())

    def request(self, step: int, prompt_indices: list[int]) -> None:
        """Ask for the batch of `step`: the prompts at `prompt_indices`, `params.n` responses each."""
        self.requested[step] = Request(step, version_of(step, self.max_staleness), prompt_indices)
        self.generator.request(step, self.token_ids(prompt_indices), self.params, batch_seed(self.seed, step, self.rank))

    def take(self, step: int) -> GeneratedBatch:
        """The batch of `step`, waiting for the generator if it is not back yet."""
        while step not in self.ready:
            self._receive_one()
        return self.ready.pop(step)

    def _receive_one(self) -> None:
        step, rollouts, seconds = self.generator.receive()
        request = self.requested.pop(step)
        self.ready[step] = GeneratedBatch(step, request.version, request.prompt_indices, rollouts, seconds)

    def state(self, trained_step: int) -> dict[str, Any]:
        """What a checkpoint after `trained_step` keeps (tensors and plain values): every batch
        sampled by an older version than `trained_step` (waited for: a resumed run has no such
        weights), and the prompts of those the current version samples (generated again)."""
        while any(request.version < trained_step for request in self.requested.values()):
            self._receive_one()
        ready = [
            {
                "step": batch.step,
                "version": batch.version,
                "prompt_indices": batch.prompt_indices,
                "response_texts": batch.rollouts.response_texts,
                "group_size": batch.rollouts.group_size,
                **{name: getattr(batch.rollouts, name) for name in ROLLOUT_FIELDS},
            }
            for batch in sorted(self.ready.values(), key=lambda batch: batch.step)
        ]
        requested = [{"step": r.step, "version": r.version, "prompt_indices": r.prompt_indices} for r in self.requested.values()]
        return {"max_staleness": self.max_staleness, "ready": ready, "requested": requested}

    def restore(self, state: dict[str, Any]) -> None:
        """Put back the batches a checkpoint kept (`state`), and the requests to send again (`resent`)."""
        for saved in state["ready"]:
            rollouts = Rollouts(
                **{name: saved[name] for name in ROLLOUT_FIELDS},
                response_texts=list(saved["response_texts"]),
                group_size=saved["group_size"],
            )
            self.ready[saved["step"]] = GeneratedBatch(saved["step"], saved["version"], list(saved["prompt_indices"]), rollouts)
        self.resent = [Request(saved["step"], saved["version"], list(saved["prompt_indices"])) for saved in state["requested"]]

    def close(self) -> None:
        self.generator.close()


def start_pipeline(
    config: Config,
    world: World,
    in_flight: dict[str, Any] | None,
    next_prompts: Callable[[], list[int]],
    token_ids: Callable[[list[int]], list[list[int]]],
) -> RolloutPipeline:
    """This process's generator, started with `config`'s engine on this process's device, with
    the batches in flight that a resumed checkpoint kept (`RolloutPipeline.state`); the pipeline
    draws its prompts with `next_prompts` and reads their tokens with `token_ids`. On a CPU the
    process's threads are split between training and generation (at least one each), so the two
    halves of a step run on their own cores rather than taking turns on the same ones."""
    threads = 1
    if world.device.type == "cpu":
        total = torch.get_num_threads()
        threads = max(1, total // 2)
        torch.set_num_threads(max(1, total - threads))
    rollout, data = config.rollout, config.data
    spec = GeneratorSpec(
        model_path=config.model.path,
        engine=rollout.engine,
        dtype=Precision(config.model.dtype).engine,
        device=_visible_device(world.device),
        threads=threads,
        max_sequences_per_call=rollout.generation_batch_size,
        max_model_len=rollout.vllm.max_model_len or data.max_prompt_length + data.max_response_length,
        seed=rank_seed(config.seed, world.rank),
        vllm=rollout.vllm.model_dump(),
        continuous_batching=continuous_batching_on(rollout.hf.continuous_batching, world.device),
    )
    params = SamplingParams(
        n=rollout.n,
        temperature=rollout.temperature,
        top_p=rollout.top_p,
        max_new_tokens=data.max_response_length,
        return_logprobs=True,
    )
    generator = AsyncGenerator(
        spec, timeout_s=config.train.distributed_timeout_s, device=world.device, slots=rollout.max_staleness
    )
    pipeline = RolloutPipeline(
        generator,
        max_staleness=rollout.max_staleness,
        last_step=config.train.steps,
        params=params,
        seed=config.seed,
        rank=world.rank,
        next_prompts=next_prompts,
        token_ids=token_ids,
    )
    if in_flight is not None:
        pipeline.restore(in_flight)
    return pipeline


def in_flight_to_resume(saved: list[dict[str, Any]] | None, world: World, max_staleness: int) -> dict[str, Any] | None:
    """This rank's batches in flight (`RolloutPipeline.state`) from a checkpoint's every-rank list
    `saved`, or None: when it has none, or when this run cannot take them (another process count,
    another `max_staleness`, or a synchronous run), which a warning says (`DROPPED_IN_FLIGHT`)."""
    if not saved:
        return None
    if len(saved) != world.world_size:
        why = f"{world.world_size} processes, not {len(saved)}"
    elif not max_staleness:
        why = "it runs synchronously"
    elif saved[world.rank]["max_staleness"] != max_staleness:
        why = f"it runs with rollout.max_staleness={max_staleness}"
    else:
        return saved[world.rank]
    warnings.warn(DROPPED_IN_FLIGHT.format(saved=saved[0]["max_staleness"], why=why), stacklevel=3)
    return None


def _visible_device(device: torch.device) -> str:
    """`device` as the generator process names it: "cpu", or the physical CUDA device's number
    (the generator sees that one alone, as cuda:0)."""
    if device.type != "cuda":
        return "cpu"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    index = device.index or 0
    return visible.split(",")[index] if visible else str(index)
