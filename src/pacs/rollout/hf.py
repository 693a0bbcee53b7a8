"""Rollout engine on transformers' `generate`: batched, left-padded prompts, pure sampling.

Sampling is exactly softmax(logits / temperature) restricted to the top-p nucleus: top-k,
repetition penalties and every other logits processor are off, so the behaviour policy is the one
the trainer's log-probabilities describe.
"""

from __future__ import annotations

from typing import Sequence

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from pacs.rollout.base import Rollouts, SamplingParams, pad_rows


class TransformersEngine:
    """Generate with a Hugging Face causal LM, at most `max_sequences_per_call` sequences at once."""

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, max_sequences_per_call: int = 512):
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer needs an end-of-sequence token and a padding token to generate")
        self.model = model
        self.tokenizer = tokenizer
        self.max_sequences_per_call = max_sequences_per_call

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        return GenerationConfig(
            do_sample=True,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=0,
            max_new_tokens=params.max_new_tokens,
            num_return_sequences=params.n,
            eos_token_id=self.tokenizer.eos_token_id,
            pad_token_id=self.tokenizer.pad_token_id,
        )

    @torch.no_grad()
    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        device = next(self.model.parameters()).device
        prompts_per_call = max(1, self.max_sequences_per_call // params.n)
        generation_config = self._generation_config(params)
        pad_id, eos_id = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        was_training = self.model.training
        self.model.eval()
        prompt_rows, response_rows = [], []
        for start in range(0, len(prompt_token_ids), prompts_per_call):
            chunk = [torch.tensor(ids, dtype=torch.long) for ids in prompt_token_ids[start : start + prompts_per_call]]
            input_ids = pad_rows(chunk, pad_id, left=True).to(device)
            attention_mask = pad_rows([torch.ones_like(ids) for ids in chunk], 0, left=True).to(device)
            output = self.model.generate(
                input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config
            )
            responses = output[:, input_ids.shape[1] :].cpu()
            for row, ids in enumerate(chunk):
                prompt_rows.extend([ids] * params.n)
                for sample in range(params.n):
                    response_rows.append(_cut_after_eos(responses[row * params.n + sample], eos_id))
        self.model.train(was_training)
        response_ids = pad_rows(response_rows, pad_id, left=False)
        return Rollouts(
            prompt_ids=pad_rows(prompt_rows, pad_id, left=True),
            prompt_mask=pad_rows([torch.ones_like(ids) for ids in prompt_rows], 0, left=True),
            response_ids=response_ids,
            response_mask=pad_rows([torch.ones_like(ids) for ids in response_rows], 0, left=False),
            response_texts=self.tokenizer.batch_decode(response_ids, skip_special_tokens=True),
            group_size=params.n,
        )


def _cut_after_eos(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """(R,) generated tokens -> the prefix up to and including the first end-of-sequence token."""
    ends = (tokens == eos_id).nonzero()
    return tokens[: int(ends[0]) + 1] if len(ends) else tokens
