"""Rollout engine on transformers' `generate`: batched, left-padded prompts, pure sampling.

Sampling is exactly softmax(logits / temperature), restricted to the top-p nucleus when
`top_p < 1` (evaluation only: the trainer refuses it, see `pacs.config`), and greedy (the most
likely token) at temperature 0 (evaluation only). Every other logits processor is off, whatever
the model's own `generation_config.json` asks for: `generate()` fills each field a call leaves
unset from the model's generation config, so an instruct model's
`repetition_penalty: 1.05` or `top_k: 20` would otherwise reshape every sample, and the
behaviour policy would no longer be the one the trainer's log-probabilities describe. The engine
therefore generates against a clean generation config that keeps only the model's declared
end-of-sequence ids (Qwen2.5-Instruct declares two: `<|im_end|>` and `<|endoftext|>`); a
response ends at the first of any of them.

A row also ends where `SamplingParams.stop` says so (`RowStop`, a transformers `StoppingCriteria`):
transformers still samples every row at each step, so the other rows draw what they would draw
without it, and a stopped row takes padding until every row has stopped, when generation ends.
Continuous batching ignores `stop`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import cast

import torch
from transformers import (
    GenerationConfig,
    GenerationMixin,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)
from transformers.cache_utils import Cache, DynamicLayer, StaticCache, StaticLayer

from pacs.models.cache import CACHE_ARGUMENT
from pacs.models.loading import eval_mode
from pacs.rollout.base import Rollouts, SamplingParams, pad_rows, rollouts_from_rows
from pacs.rollout.continuous_batching import generate_continuously


def end_of_sequence_ids(generation_config: GenerationConfig | None, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """Every token id that ends a response: the tokenizer's EOS and each id the model's
    generation config declares (`eos_token_id` may be an int or a list), in that order."""
    declared = getattr(generation_config, "eos_token_id", None)
    declared = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    ids = [tokenizer.eos_token_id, *declared]
    return tuple(dict.fromkeys(int(token) for token in ids if token is not None))


@contextmanager
def _clean_generation_defaults(model: PreTrainedModel, eos_ids: tuple[int, ...], pad_id: int) -> Iterator[None]:
    """While generating, the model's own generation config (whose fields `generate()` would merge
    into ours) is replaced by one that holds only the end-of-sequence and padding ids."""
    declared = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=list(eos_ids), pad_token_id=pad_id)
    try:
        yield
    finally:
        model.generation_config = declared


class TransformersEngine:
    """Generate with a Hugging Face causal LM, at most `max_sequences_per_call` sequences at once:
    with `generate` in left-padded batches, or with `continuous_batching` through transformers'
    continuous batching (`pacs.rollout.continuous_batching`), the same sampling either way."""

    holds_own_weights = False
    """It generates with the trained module itself (`pacs.rollout.base.RolloutEngine`)."""
    has_weights = True

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_sequences_per_call: int = 512,
        continuous_batching: bool = False,
    ):
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs an end-of-sequence token and a padding token to generate")
        if not isinstance(model, GenerationMixin):
            raise TypeError(
                f"TransformersEngine generates with a causal LM, a model with transformers' generate (GenerationMixin); "
                f"got {type(model).__name__}: load it with pacs.models.loading.load_causal_lm (AutoModelForCausalLM)"
            )
        self.model = model
        self.tokenizer = tokenizer
        self.max_sequences_per_call = max_sequences_per_call
        self.continuous_batching = continuous_batching
        self.eos_ids = end_of_sequence_ids(model.generation_config, tokenizer)

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        """Pure sampling at `params.temperature` and `params.top_p` (greedy decoding at
        temperature 0). Fields left unset take transformers' global defaults, which are neutral (no
        penalty, no cut-off), because the model's own generation config is swapped out while
        generating (`_clean_generation_defaults`); top-k's global default is 50, so it is switched
        off here."""
        sampling = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p, "top_k": 0}
        return GenerationConfig(
            **(sampling if params.temperature > 0 else {"do_sample": False}),
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=1,  # a prompt's n samples are rows of their own (_generate_samples)
            eos_token_id=list(self.eos_ids),
            pad_token_id=self.tokenizer.pad_token_id,
            output_scores=params.return_logprobs,
            return_dict_in_generate=True,
        )

    @torch.no_grad()
    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        if self.continuous_batching:
            return self._generate_continuously(prompt_token_ids, params)
        device = next(self.model.parameters()).device
        prompts_per_call = max(1, self.max_sequences_per_call // params.n)
        generation_config = self._generation_config(params)
        pad_id = self.tokenizer.pad_token_id
        prompt_rows, response_rows, logprob_rows = [], [], []
        with eval_mode(self.model), _clean_generation_defaults(self.model, self.eos_ids, pad_id):
            for start in range(0, len(prompt_token_ids), prompts_per_call):
                chunk = [torch.tensor(ids, dtype=torch.long) for ids in prompt_token_ids[start : start + prompts_per_call]]
                input_ids = pad_rows(chunk, pad_id, left=True).to(device)
                attention_mask = pad_rows([torch.ones_like(ids) for ids in chunk], 0, left=True).to(device)
                row_stop = None if params.stop is None else RowStop(params.stop, input_ids.shape[1])
                output = self._generate_samples(input_ids, attention_mask, generation_config, params.n, row_stop)
                responses = output.sequences[:, input_ids.shape[1] :]
                lengths = _lengths_through_first_end(responses, self.eos_ids)
                if row_stop is not None:
                    lengths = torch.minimum(lengths, row_stop.lengths(responses.shape[0], responses.shape[1]).to(lengths.device))
                if params.return_logprobs:
                    sampled_logprobs = _sampled_logprobs(output.scores, responses)
                for ids in chunk:
                    prompt_rows.extend([ids] * params.n)
                for sequence, length in enumerate(lengths.tolist()):
                    response_rows.append(responses[sequence, :length].cpu())
                    if params.return_logprobs:
                        logprob_rows.append(sampled_logprobs[sequence, :length].cpu())
        return rollouts_from_rows(
            prompt_rows, response_rows, logprob_rows if params.return_logprobs else None, self.tokenizer, params.n
        )

    def _generate_continuously(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        """`generate`'s rollouts, sampled by transformers' continuous batching
        (`pacs.rollout.continuous_batching.generate_continuously`) under the same generation config."""
        pad_id = self.tokenizer.pad_token_id
        with eval_mode(self.model), _clean_generation_defaults(self.model, self.eos_ids, pad_id):
            samples = generate_continuously(
                self.model, prompt_token_ids, self._generation_config(params), params.n, self.max_sequences_per_call
            )
        prompt_rows = [torch.tensor(ids, dtype=torch.long) for ids in prompt_token_ids for _ in range(params.n)]
        response_rows = [torch.tensor(tokens, dtype=torch.long) for tokens, _ in samples]
        logprob_rows = [torch.tensor(logprobs, dtype=torch.float32) for _, logprobs in samples]
        return rollouts_from_rows(
            prompt_rows, response_rows, logprob_rows if params.return_logprobs else None, self.tokenizer, params.n
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Refused: the engine generates with the caller's model, whose weights are the policy's."""
        raise TypeError("TransformersEngine generates with the trained model itself and holds no weights to load")

    def sleep(self) -> None:
        """Nothing to free: the engine generates with the caller's model."""

    def close(self) -> None:
        """Nothing to release: the engine generates with the caller's model."""

    def _generate_samples(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        generation_config: GenerationConfig,
        n: int,
        row_stop: RowStop | None = None,
    ):
        """`generate`'s output for n samples of each prompt, the n samples of a prompt adjacent,
        each row also ending where `row_stop` stops it (None: at its end-of-sequence token or length).

        input_ids, attention_mask: (U, P) left-padded prompts. Each prompt's key/value cache is
        computed once for its n samples: all but the last prompt token are run once, the cache is
        repeated n times per prompt, and `generate` goes on from it over (U * n, P) rows. The
        sampling distribution is the one of `generate` with `num_return_sequences=n`, which runs
        every prompt n times; here the prompt costs 1/n of that.

        For a model whose every layer attends to the whole sequence, the repeated cache is copied
        into a preallocated `StaticCache` of P + max_new_tokens positions (`_preallocated`): each
        new token is then written in place, where a growing cache copies itself once per token
        (a quarter of the demo's generation time). The price: every step attends over all
        P + max_new_tokens positions, so a batch whose every response ends far short of
        max_new_tokens generates slower than on a growing cache (`benchmarks/generation_cache.py`:
        up to 2.7x at 512 allowed tokens and 15 used), and one whose longest runs to it faster (2.4x
        at 512). A training batch of many samples usually has one that runs long. Other layer kinds
        (sliding windows, hybrid models) keep the growing cache.

        Each process generates on its own (`synced_gpus=False`): transformers would otherwise
        switch it on for a model that FSDP shards and add a collective after every token, which
        hangs as soon as one rank generates while another does not.
        """
        rows_ids, rows_mask = input_ids.repeat_interleave(n, dim=0), attention_mask.repeat_interleave(n, dim=0)
        stopping = {} if row_stop is None else {"stopping_criteria": StoppingCriteriaList([row_stop])}
        if n == 1 or input_ids.shape[1] == 1:
            return self.model.generate(
                input_ids=rows_ids, attention_mask=rows_mask, generation_config=generation_config, synced_gpus=False, **stopping
            )
        prefix_mask = attention_mask[:, :-1]
        cache = self.model(
            input_ids=input_ids[:, :-1],
            attention_mask=prefix_mask,
            position_ids=(prefix_mask.cumsum(dim=1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
        )[CACHE_ARGUMENT]
        cache.batch_repeat_interleave(n)
        preallocated = _preallocated(cache, self.model.config, input_ids.shape[1] + generation_config.max_new_tokens)
        return self.model.generate(
            input_ids=rows_ids,
            attention_mask=rows_mask,
            generation_config=generation_config,
            synced_gpus=False,
            **stopping,
            **{CACHE_ARGUMENT: preallocated},
        )


class RowStop(StoppingCriteria):
    """`SamplingParams.stop` as a transformers stopping criterion over (S, P + t) sequences whose
    first `prompt_length` columns are the (left-padded) prompts: after each new token it asks
    `stop` about each row not yet stopped, with the row's t new tokens (padding after an
    end-of-sequence token included: such a row has ended already, and `lengths` is cut at its end
    by the caller), and returns the (S,) bool tensor of the rows stopped so far, which transformers
    pads from the next token on. It records each stopped row's length: its new tokens through the
    one `stop` was true at."""

    def __init__(self, stop: Callable[[Sequence[int]], bool], prompt_length: int):
        self.stop, self.prompt_length = stop, prompt_length
        self.stopped_at: dict[int, int] = {}
        """row -> its length when it stopped."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        new_tokens = input_ids[:, self.prompt_length :].tolist()
        for row, tokens in enumerate(new_tokens):
            if row not in self.stopped_at and self.stop(tokens):
                self.stopped_at[row] = len(tokens)
        stopped = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        stopped[list(self.stopped_at)] = True
        return cast(torch.BoolTensor, stopped)

    def lengths(self, rows: int, generated: int) -> torch.Tensor:
        """(rows,) each row's length where it stopped, `generated` (the generated width) where it did not."""
        lengths = torch.full((rows,), generated, dtype=torch.long)
        for row, length in self.stopped_at.items():
            lengths[row] = length
        return lengths


def _preallocated(cache: Cache, config: PretrainedConfig, max_length: int) -> Cache:
    """`cache`'s keys and values (B, heads, L, head_dim) per layer, copied into a `StaticCache`
    of `max_length` positions when every layer of both is a plain full-attention layer (each of
    `cache`'s holding the prompt's keys and values) and no autocast is on; otherwise `cache`
    itself. Under bf16 autocast the prompt's keys and values come out in float32 and each new
    token's values in bfloat16: a growing cache's `torch.cat` promotes them, a static cache's
    in-place copy refuses them."""
    filled = [
        (layer.keys, layer.values)
        for layer in cache.layers
        if type(layer) is DynamicLayer and layer.keys is not None and layer.values is not None
    ]
    if len(filled) != len(cache.layers) or torch.is_autocast_enabled(filled[0][0].device.type):
        return cache
    static = StaticCache(config=config, max_cache_len=max_length)
    if len(static.layers) != len(cache.layers) or not all(type(layer) is StaticLayer for layer in static.layers):
        return cache
    for index, (keys, values) in enumerate(filled):
        static.update(keys, values, index)
    return static


def _lengths_through_first_end(responses: torch.Tensor, eos_ids: tuple[int, ...]) -> torch.Tensor:
    """(S, R) generated tokens -> (S,) lengths of each prefix up to and including its first
    end-of-sequence token (R where there is none)."""
    is_end = torch.isin(responses, torch.tensor(eos_ids, device=responses.device))
    first_end = torch.where(is_end.any(dim=1), is_end.int().argmax(dim=1) + 1, responses.shape[1])
    return first_end


def _sampled_logprobs(scores: tuple[torch.Tensor, ...], responses: torch.Tensor) -> torch.Tensor:
    """log of the sampling distribution at each sampled token: `scores` are generate's processed
    logits, one (S, V) tensor per new token (after temperature and top-p); returns (S, R) in fp32
    or wider."""
    logits = torch.stack(scores, dim=1)
    logits = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    return torch.log_softmax(logits, dim=-1).gather(-1, responses.unsqueeze(-1)).squeeze(-1)
