"""Continuous batching for the transformers engine (`rollout.hf.continuous_batching`).

`generate` runs a batch of left-padded rows until its longest response ends: a row that ended
early still takes a slot of every later forward pass. transformers' continuous batching
(`ContinuousBatchingManager`, the engine behind `model.generate_batch` and TRL's
`use_transformers_paged`) keeps the sequences in a paged key/value cache and schedules one
forward pass over whichever sequences are still running, so a finished one frees its slot at
once; a prompt is run once and its cache forked for its n samples (`num_return_sequences`).

Sampling is the transformers engine's (`pacs.rollout.hf`): the manager samples from
softmax(processed logits) with `torch.multinomial` (argmax at temperature 0), the processed
logits being logits / temperature, cut to the top-p nucleus when `top_p < 1`, the only
processors the engine's clean generation config asks for (`TransformersEngine._generation_config`);
the model's own generation defaults are swapped out while the manager builds its processors
(`_clean_generation_defaults`). Its log-probs are log of those probabilities at the sampled
token, in float32. A response ends at the first of the declared end-of-sequence ids, which it
includes, or after `max_new_tokens`.

Three things the manager does that the engine undoes or pins:

- It sizes its cache from the device's free memory (60% of the host's RAM on a CPU): the engine
  sizes it for the call instead, `max_sequences` sequences of the longest prompt plus
  `max_new_tokens` (`_cache_settings`).
- It generates in a thread of its own, where the caller's autocast (thread-local) does not reach,
  and its paged cache holds one dtype, the model's (under bf16 autocast a layer's keys come out
  in float32 and its values in bfloat16). Under the caller's autocast the engine therefore gives
  the model's floating-point weights the autocast dtype for the call (`_weights_in`: a bf16 copy
  beside the float32 master weights, put back after), so that a mixed-precision run samples from
  its bf16 weights, as `generate` under autocast does.
- It reseeds torch's generator with its `seed`: the engine draws that seed from torch's generator,
  so a run seeded as before draws the same samples again, and queues every request before the
  generation thread starts, so that the first forward pass holds the same requests whatever the
  threads' timing (the batches, and so the order of the draws, depend only on the requests).

On a CPU it measured no faster than `generate` (docs/results.md, continuous batching), so `auto`
turns it on for CUDA devices only. Its CUDA graphs and asynchronous batching run only where the
model's attention needs no mask, a flash-attention implementation (transformers switches to one when
flash-attn, or its `kernels` fallback, is installed); with SDPA, the default without them,
transformers keeps both off and pads each forward's attention mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, Protocol

import torch
from transformers import GenerationConfig

CONTINUOUS_BATCHING_DEVICES = ("cuda",)
"""Device types `rollout.hf.continuous_batching: auto` batches continuously on."""


def continuous_batching_on(setting: Literal["auto"] | bool, device: torch.device) -> bool:
    """Whether the transformers engine batches continuously on `device`: `setting` when true or
    false; `auto`: on a CUDA device, not on a CPU (module docstring)."""
    if setting == "auto":
        return device.type in CONTINUOUS_BATCHING_DEVICES
    return bool(setting)


class ContinuouslyBatchingModel(Protocol):
    """What `generate_continuously` uses of a model: a transformers causal LM, a `PreTrainedModel`
    with `GenerationMixin`'s continuous batching (one class to Python, two to transformers' types)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def init_continuous_batching(self) -> Callable[..., Any]: ...

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]: ...


def generate_continuously(
    model: ContinuouslyBatchingModel,
    prompt_token_ids: Sequence[Sequence[int]],
    generation_config: GenerationConfig,
    n: int,
    max_sequences: int,
) -> list[tuple[list[int], list[float]]]:
    """n samples of each prompt through transformers' continuous batching, the n samples of a
    prompt adjacent: one (response token ids, log-probs) pair per sample, len(prompt_token_ids) * n
    in all, in prompt order. A response holds its tokens through the first end-of-sequence id
    (included); log-probs are those of the sampling distribution at each token (float32), empty
    unless `generation_config.output_scores`. At most `max_sequences` sequences are in the cache at
    once. Raises RuntimeError naming the request when the manager fails one."""
    config = GenerationConfig.from_dict({**generation_config.to_dict(), "num_return_sequences": n})
    lengths = [len(ids) for ids in prompt_token_ids]
    settings = _cache_settings(generation_config, max(lengths), sum(lengths), max_sequences)
    device_type = model.device.type
    autocast = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    request_ids = [f"prompt_{index}" for index in range(len(prompt_token_ids))]
    with _weights_in(model, autocast):
        manager = model.init_continuous_batching(generation_config=config, continuous_batching_config=settings)
        try:
            for request_id, ids in zip(request_ids, prompt_token_ids):
                manager.add_request(list(ids), request_id=request_id, max_new_tokens=generation_config.max_new_tokens)
            manager.start()
            outputs = _collect(manager, len(request_ids) * n)
        finally:
            manager.destroy()
    samples = []
    for request_id in request_ids:
        for sample_id in [f"{request_id}__child#{child}" for child in range(n - 1)] + [request_id]:
            output = outputs[sample_id]
            samples.append((list(output.generated_tokens), list(output.logprobs)))
    return samples


def _collect(manager, expected: int) -> dict:
    """The manager's finished outputs by request id, waiting until `expected` have finished; a
    failed request or a generation thread that died raises RuntimeError."""
    outputs: dict = {}
    while len(outputs) < expected:
        output = manager.get_result(timeout=1)
        if output is None:
            if not manager.is_running():
                raise RuntimeError(f"transformers' continuous batching stopped after {len(outputs)} of {expected} samples")
            continue
        if output.error is not None:
            raise RuntimeError(f"transformers' continuous batching failed request {output.request_id}: {output.error}")
        if output.is_finished():
            outputs[output.request_id] = output
    return outputs


def _cache_settings(generation_config: GenerationConfig, longest_prompt: int, prompt_tokens: int, max_sequences: int):
    """A `ContinuousBatchingConfig` whose paged cache holds `max_sequences` sequences of
    `longest_prompt + max_new_tokens` tokens, each in whole pages of at most 256 tokens (a power of
    two, at least 16, no longer than one sequence needs), with the sampled tokens' log-probs and
    the seed drawn from torch's generator. A forward pass takes at most `max_sequences` requests
    and max(max_sequences, min(prompt_tokens, 2048)) tokens (every prompt's prefill at once where
    it fits: the attention mask of transformers' SDPA path grows with it times the cache). Only
    fields transformers 5.10 to 5.24 all read, except the page size (`page_size` since 5.17,
    `block_size` before)."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    sequence_tokens = longest_prompt + generation_config.max_new_tokens
    page = min(256, max(16, 1 << math.ceil(math.log2(sequence_tokens))))
    settings = ContinuousBatchingConfig(
        num_blocks=max_sequences * math.ceil(sequence_tokens / page),
        max_batch_tokens=max(max_sequences, min(prompt_tokens, 2048)),
        return_logprobs=bool(generation_config.output_scores),
        seed=int(torch.randint(0, 2**31 - 1, ())),
    )
    setattr(settings, "page_size" if hasattr(settings, "page_size") else "block_size", page)
    if hasattr(settings, "max_requests_per_batch"):
        settings.max_requests_per_batch = max_sequences
    return settings


@contextmanager
def _weights_in(model: ContinuouslyBatchingModel, dtype: torch.dtype | None) -> Iterator[None]:
    """While inside, every floating-point parameter of `model` holds a copy of its values in
    `dtype` (the originals kept aside and put back on exit, untouched); None changes nothing."""
    originals = {}
    if dtype is not None:
        for parameter in model.parameters():
            if parameter.is_floating_point() and parameter.dtype != dtype:
                originals[parameter] = parameter.data
                parameter.data = parameter.data.to(dtype)
    try:
        yield
    finally:
        for parameter, data in originals.items():
            parameter.data = data
