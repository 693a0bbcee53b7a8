"""A rollout engine that answers with scripted texts, for the tests of multi-turn rollouts."""

from __future__ import annotations

import torch

from pacs.rollout.base import Rollouts, SamplingParams, rollouts_from_rows


class ScriptedEngine:
    """Answers its c-th `generate` with `turns[c]`: one text per row (n rows per prompt), encoded
    whole (an end-of-sequence token where a text ends with the tokenizer's). Keeps every call's prompts."""

    holds_own_weights = False
    has_weights = True

    def __init__(self, tokenizer, turns: list[list[str]]):
        self.tokenizer, self.turns, self.prompts = tokenizer, turns, []

    def generate(self, prompt_token_ids, params: SamplingParams) -> Rollouts:
        texts = self.turns[len(self.prompts)]
        self.prompts.append([list(prompt) for prompt in prompt_token_ids])
        prompts = [torch.tensor(prompt) for prompt in prompt_token_ids for _ in range(params.n)]
        responses = [torch.tensor(self.tokenizer.encode(text, add_special_tokens=False)) for text in texts]
        return rollouts_from_rows(prompts, responses, None, self.tokenizer, params.n)
