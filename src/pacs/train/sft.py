"""`pacs sft`: a short supervised warm-start on reference answers (token-mean cross-entropy on
the model's response tokens only), so that RL starts from a model that solves some problems but
not all.

A reference answer is a text (one assistant turn, then end-of-sequence) or a demonstration of
several turns: assistant messages and the `tool` messages that answer their tool calls, laid out
as the chat template renders them after the prompt (`demonstration_tokens`). The loss covers the
assistant turns' tokens only, as RL's does (`PolicyBatch.loss_mask`): the tool's output and the
template's markers around it are read, never learnt."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from pathlib import Path

import torch

from pacs.algos.masks import masked_sum
from pacs.data.prompts import encode_prompts
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.progress import progress_bar
from pacs.rollout.base import pad_rows
from pacs.train.batch import PolicyBatch
from pacs.train.checkpointing.state import save_checkpoint
from pacs.train.logprobs import response_logprobs


def demonstration_tokens(tokenizer, prompt: list[dict], turns: list[dict]) -> tuple[list[int], list[int]]:
    """(response token ids, model-token mask) of the messages `turns` after the messages `prompt`,
    as `tokenizer`'s chat template renders the whole conversation, cut into stretches as a chat-format
    rollout makes them (`pacs.rollout.multiturn`): an assistant message's stretch is the text its
    rendering adds to the conversation before it, through its last end-of-sequence text (where the
    model stops its turn); a `tool` message's stretch is the rest: what follows that end, the tool
    message and the generation prompt of the assistant turn after it. Each stretch is tokenised on
    its own; mask 1 on assistant stretches, 0 on tool ones; text after the last turn's end is left out.

    Raises ValueError naming the message whose rendering does not extend the one before it (a
    template that rewrites earlier turns), an assistant message rendered without the end-of-sequence
    text, or a role other than assistant and tool."""
    rendered = _render(tokenizer, prompt, add_generation_prompt=True)
    carried = ""
    token_ids: list[int] = []
    model_tokens: list[int] = []
    for position, message in enumerate(turns):
        if message["role"] not in ("assistant", "tool"):
            raise ValueError(f"demonstration turn {position} has role {message['role']!r}; turns are 'assistant' or 'tool'")
        is_tool = message["role"] == "tool"
        text = _render(tokenizer, prompt + turns[: position + 1], add_generation_prompt=is_tool)
        if not text.startswith(rendered):
            raise ValueError(
                f"demonstration turn {position} ({message['role']}): the chat template's rendering does not extend the "
                "conversation before it, so its tokens cannot be appended; use a template that renders turns in order"
            )
        added, carried = carried + text[len(rendered) :], ""
        if not is_tool:
            end = added.rfind(tokenizer.eos_token) + len(tokenizer.eos_token)
            if end < len(tokenizer.eos_token):
                raise ValueError(
                    f"demonstration turn {position} (assistant): the chat template renders it without the end-of-sequence "
                    f"text {tokenizer.eos_token!r}, where a model ends its turn; use a template that ends assistant messages with it"
                )
            added, carried = added[:end], added[end:]
        stretch = tokenizer(added, add_special_tokens=False)["input_ids"]
        token_ids += stretch
        model_tokens += [int(not is_tool)] * len(stretch)
        rendered = text
    return token_ids, model_tokens


def _render(tokenizer, messages: list[dict], *, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)


def _reference_tokens(tokenizer, row: dict, reference: str | list[dict]) -> tuple[list[int], list[int]]:
    """(response ids, model-token mask) of one row's reference: a text's tokens and end-of-sequence
    (every token the model's), or a demonstration's (`demonstration_tokens`)."""
    if isinstance(reference, str):
        token_ids = tokenizer(reference, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return token_ids, [1] * len(token_ids)
    return demonstration_tokens(tokenizer, row["prompt"], reference)


def warm_start_loss(model, batch: PolicyBatch) -> torch.Tensor:
    """The token mean of -log π over the model's tokens of `batch` (one response per prompt):
    -Σ_{i,t} m_it log π(y_it | x_i, y_i,<t) / Σ_{i,t} m_it with m = `batch.loss_mask` (B, R), so a
    tool's output is context, never a target."""
    logprobs = response_logprobs(model, batch, prompts_shared=False)
    return -masked_sum(logprobs, batch.loss_mask).sum() / batch.loss_mask.sum()


def supervised_warm_start(
    model_path: str,
    rows: list[dict],
    reference_answer: Callable[[dict], str | list[dict]],
    out_dir: Path,
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    show_progress: bool = True,
) -> Path:
    """Fine-tune `model_path` on (prompt, reference) pairs with AdamW for `steps` steps of
    `batch_size` rows; write a Hugging Face directory to `out_dir`. `reference_answer(row)` is a
    text (the response is its tokens and end-of-sequence) or the messages of a demonstration
    (`demonstration_tokens`); the loss is `warm_start_loss`, over the model's tokens only.

    Raises ValueError, before anything loads, unless steps >= 1, batch_size >= 1 and lr is a
    finite number > 0."""
    for name, value, valid in (("steps", steps, steps >= 1), ("batch_size", batch_size, batch_size >= 1)):
        if isinstance(value, bool) or not isinstance(value, int) or not valid:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(model_path)
    model = load_causal_lm(model_path, dtype="float32")
    prompts = encode_prompts(tokenizer, rows, max_prompt_length=None)
    answers = [_reference_tokens(tokenizer, row, reference_answer(row)) for row in rows]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    order_rng = random.Random(seed)
    model.train()
    progress = progress_bar(range(steps), desc="warm-start", unit="step", disable=not show_progress)
    for _ in progress:
        picked = order_rng.sample(range(len(rows)), min(batch_size, len(rows)))
        prompt_ids = [torch.tensor(prompts.token_ids[i]) for i in picked]
        answer_ids = [torch.tensor(answers[i][0]) for i in picked]
        response_mask = pad_rows([torch.ones(len(a)) for a in answer_ids], 0, left=False)
        model_token_mask = pad_rows([torch.tensor(answers[i][1], dtype=torch.float32) for i in picked], 0, left=False)
        batch = PolicyBatch(
            prompt_ids=pad_rows(prompt_ids, tokenizer.pad_token_id, left=True),
            prompt_mask=pad_rows([torch.ones_like(p) for p in prompt_ids], 0, left=True),
            response_ids=pad_rows(answer_ids, tokenizer.pad_token_id, left=False),
            response_mask=response_mask,
            rewards=torch.zeros(len(picked)),
            old_logprobs=torch.zeros_like(response_mask),
            entropy=torch.zeros_like(response_mask),
            model_token_mask=model_token_mask,
        )
        loss = warm_start_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        progress.set_postfix(loss=f"{loss.item():.3f}")
    return save_checkpoint(out_dir, model, tokenizer, {"sft_steps": steps, "seed": seed})
