"""Generation overlapping the update: `rollout.max_staleness` = k ≥ 1.

Each training process starts one generator process of its own (`serve`), which holds its own copy
of the policy in its own engine (transformers or vLLM) and generates the process's share of the
coming steps' prompts while the trainer scores, recomputes log-probs and updates. After every
update the trainer pushes the new weights over a private two-member gloo process group (one
broadcast of one flat host buffer, started asynchronously: the trainer goes on while the
generator receives it between two batches; never a copy through the disk), and control messages
(what to generate, the rollouts back) go through a pipe.

The schedule is fixed, so a run does not depend on timing and resumes exactly:

    version(j) = max(0, j − 1 − k)      the policy version (updates done) that samples step j's batch
    staleness(j) = (j − 1) − version(j) = min(j − 1, k)   versions between sampler and trained policy

The trainer sends the weights of version v = j before it asks for the batch of step j + 1 + k, and
the generator serves messages in order, so batch j is sampled by exactly version(j). Step j's
batch thus needs no update after step j − 1 − k: with k = 1 the generator samples step j + 1's
batch while the trainer updates on step j's.

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

import datetime
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
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch._C._distributed_c10d import BroadcastOptions

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


# ----- the generator process ---------------------------------------------------------------------


def serve(spec: GeneratorSpec, store_port: int, timeout_s: float, connection: Connection) -> None:
    """The generator process: join the private group (rank 1), build the engine, then serve the
    trainer's messages in order until "stop" or until the trainer is gone (the pipe closes):

        ("weights", version, layout)        receive the flat buffer, load it (layout: (name, shape) list)
        ("generate", step, prompts, params, seed) -> ("rollouts", step, arrays, texts, n, seconds)

    Replies go out through `Outbox`, so that a batch larger than the pipe's buffer never holds the
    loop up: the trainer may be waiting for this process to take the next weights before it reads
    (with max_staleness >= 2 it is). Any error is sent back as ("error", traceback) before the process ends."""
    for name in LAUNCHER_VARIABLES:
        os.environ.pop(name, None)
    if spec.device != "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = spec.device
    torch.set_num_threads(spec.threads)
    outbox = Outbox(connection)
    try:
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", store_port, 2, False, timeout=timeout)
        group = dist.ProcessGroupGloo(store, 1, 2, timeout)
        engine = _build_engine(spec)
        _serve_messages(engine, group, connection, outbox, DTYPES[spec.dtype])
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


def _serve_messages(engine, group, connection: Connection, outbox: Outbox, dtype: torch.dtype) -> None:
    layout: list[tuple[str, tuple[int, ...]]] = []
    buffer = torch.empty(0, dtype=dtype)
    while True:
        message = connection.recv()
        if message[0] == "stop":
            return
        if message[0] == "weights":
            if message[2] is not None:  # the first push says where each tensor lies; later ones reuse it
                layout = message[2]
                buffer = torch.empty(sum(math.prod(shape) for _, shape in layout), dtype=dtype)
            group.broadcast([buffer], _from_trainer()).wait()
            _load(engine, _unflattened(buffer, layout))
            continue
        _, step, prompts, params, seed = message
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


def _from_trainer() -> BroadcastOptions:
    options = BroadcastOptions()
    options.rootRank = 0
    return options


def _unflattened(buffer: torch.Tensor, layout: list[tuple[str, tuple[int, ...]]]) -> Iterator[tuple[str, torch.Tensor]]:
    offset = 0
    for name, shape in layout:
        count = math.prod(shape)
        yield name, buffer[offset : offset + count].view(shape)
        offset += count


# ----- the trainer's side ------------------------------------------------------------------------


class AsyncGenerator:
    """This training process's generator process and the two ways to it: the private group for
    weights, the pipe for everything else. `close` ends it; it also ends when this process dies."""

    def __init__(self, spec: GeneratorSpec, timeout_s: float):
        timeout = datetime.timedelta(seconds=timeout_s)
        self.store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=timeout, wait_for_workers=False)
        context = mp.get_context("spawn")
        self.connection, child_end = context.Pipe()
        self.process = context.Process(
            target=serve, args=(spec, self.store.port, timeout_s, child_end), name="pacs-generator", daemon=False
        )
        self.process.start()
        child_end.close()
        self.group = dist.ProcessGroupGloo(self.store, 0, 2, timeout)
        self.dtype = DTYPES[spec.dtype]
        self.buffer: torch.Tensor | None = None
        self.layout: list[tuple[str, tuple[int, ...]]] = []
        self.sending: dist.Work | None = None

    def push(self, version: int, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send `weights` (the policy's, whole, by Hugging Face name) as `version`: copied into one
        flat host buffer, whose broadcast runs on while the trainer goes on. The first push builds
        the buffer and sends its layout; every later one waits for the previous broadcast and copies
        each tensor into its place in the same buffer.

        The first push cannot size the buffer before the weights arrive (each is gathered in its
        turn): it keeps them in host memory, then copies them into the buffer one at a time and
        releases each once copied. The buffer's pages are taken as they are written, so the host
        holds about one model in `dtype` at a time (plus its largest tensor), never the pieces and
        their concatenation (two models)."""
        if self.buffer is None:
            pieces = []
            for name, tensor in weights:
                pieces.append(tensor.detach().reshape(-1).to("cpu", self.dtype))
                self.layout.append((name, tuple(tensor.shape)))
            self.buffer = torch.empty(sum(piece.numel() for piece in pieces), dtype=self.dtype)
            pieces.reverse()
            for _, place in _unflattened(self.buffer, self.layout):
                place.view(-1).copy_(pieces.pop())
            self.connection.send(("weights", version, self.layout))
        else:
            self.sending.wait()
            for (_, tensor), (_, place) in zip(weights, _unflattened(self.buffer, self.layout), strict=True):
                place.copy_(tensor.detach())
            self.connection.send(("weights", version, None))
        self.sending = self.group.broadcast([self.buffer], _from_trainer())

    def request(self, step: int, prompts: list[list[int]], params: SamplingParams, seed: int) -> None:
        self.connection.send(("generate", step, prompts, params, seed))

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

    def begin(self, start_step: int, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
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

    def advance(self, step: int, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """After the update of `step`: its weights to the generator, and the batch they sample,
        `max_staleness` + 1 steps ahead, asked for."""
        self.generator.push(step, weights)
        ahead = step + 1 + self.max_staleness
        if ahead <= self.last_step:
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
    generator = AsyncGenerator(spec, timeout_s=config.train.distributed_timeout_s)
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
