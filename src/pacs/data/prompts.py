"""Rows -> prompt token ids through the tokenizer's chat template, with length filtering."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from pacs.data.loading import render_prompt


@dataclass
class EncodedPrompts:
    """`token_ids[i]` is the prompt of `rows[i]`; `num_filtered` rows were longer than the limit."""

    rows: list[dict]
    token_ids: list[list[int]]
    num_filtered: int


def encode_prompts(tokenizer: PreTrainedTokenizerBase, rows: list[dict], max_prompt_length: int | None) -> EncodedPrompts:
    """Render each row's chat messages and tokenize; drop (and count) prompts over the limit."""
    kept_rows, kept_ids = [], []
    for row in rows:
        ids = tokenizer(render_prompt(tokenizer, row), add_special_tokens=False)["input_ids"]
        if max_prompt_length is None or len(ids) <= max_prompt_length:
            kept_rows.append(row)
            kept_ids.append(ids)
    return EncodedPrompts(kept_rows, kept_ids, len(rows) - len(kept_rows))
