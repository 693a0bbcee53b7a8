"""Rows -> prompt token ids through the tokenizer's chat template, with length filtering."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from pacs.data.loading import render_prompt, row_location


@dataclass
class EncodedPrompts:
    """`token_ids[i]` is the prompt of `rows[i]`; `num_filtered` rows were longer than the limit."""

    rows: list[dict]
    token_ids: list[list[int]]
    num_filtered: int


def prompt_token_ids(tokenizer: PreTrainedTokenizerBase, row: dict) -> list[int]:
    """The token ids of `row`'s prompt as the model reads it: its messages through the chat template."""
    return tokenizer(render_prompt(tokenizer, row), add_special_tokens=False)["input_ids"]


def check_some_prompt_fits(
    tokenizer: PreTrainedTokenizerBase,
    rows_by_spec: dict[str, list[dict]],
    max_prompt_length: int,
    *,
    where: Callable[[str, int], str] = row_location,
) -> None:
    """Raise ValueError when every prompt of `rows_by_spec` (data spec -> its rows: one split's
    data) is longer than `max_prompt_length` tokens, which would leave nothing to train on (longer
    prompts are left out); the error names the longest prompt (where it is, by `where`) and the
    `data.max_prompt_length` that keeps every prompt. Stops at the first prompt that fits."""
    longest, longest_at, count = 0, "", 0
    for spec, rows in rows_by_spec.items():
        for position, row in enumerate(rows):
            length = len(prompt_token_ids(tokenizer, row))
            if length <= max_prompt_length:
                return
            count += 1
            if length > longest:
                longest, longest_at = length, where(spec, position)
    if count:
        raise ValueError(
            f"every one of the {count} prompts is longer than data.max_prompt_length={max_prompt_length} tokens (through "
            f"the model's chat template), and longer prompts are left out; the longest, {longest_at}, has {longest} tokens: "
            f"data.max_prompt_length={longest} keeps every prompt"
        )


def encode_prompts(tokenizer: PreTrainedTokenizerBase, rows: list[dict], max_prompt_length: int | None) -> EncodedPrompts:
    """Render each row's chat messages and tokenize; drop (and count) prompts over the limit."""
    kept_rows, kept_ids = [], []
    for row in rows:
        ids = prompt_token_ids(tokenizer, row)
        if max_prompt_length is None or len(ids) <= max_prompt_length:
            kept_rows.append(row)
            kept_ids.append(ids)
    return EncodedPrompts(kept_rows, kept_ids, len(rows) - len(kept_rows))
