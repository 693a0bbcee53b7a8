"""`pacs sft`: a short supervised warm-start on reference answers (token-mean cross-entropy on
response tokens only), so that RL starts from a model that solves some problems but not all."""

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


def supervised_warm_start(
    model_path: str,
    rows: list[dict],
    reference_answer: Callable[[dict], str],
    out_dir: Path,
    *,
    steps: int,
    batch_size: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    show_progress: bool = True,
) -> Path:
    """Fine-tune `model_path` on (prompt, reference_answer(row) + end-of-sequence) pairs with
    AdamW for `steps` steps of `batch_size` rows; write a Hugging Face directory to `out_dir`.

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
    answers = [tokenizer(reference_answer(row), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for row in rows]
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    order_rng = random.Random(seed)
    model.train()
    progress = progress_bar(range(steps), desc="warm-start", unit="step", disable=not show_progress)
    for _ in progress:
        picked = order_rng.sample(range(len(rows)), min(batch_size, len(rows)))
        prompt_ids = [torch.tensor(prompts.token_ids[i]) for i in picked]
        answer_ids = [torch.tensor(answers[i]) for i in picked]
        response_mask = pad_rows([torch.ones(len(a)) for a in answer_ids], 0, left=False)
        batch = PolicyBatch(
            prompt_ids=pad_rows(prompt_ids, tokenizer.pad_token_id, left=True),
            prompt_mask=pad_rows([torch.ones_like(p) for p in prompt_ids], 0, left=True),
            response_ids=pad_rows(answer_ids, tokenizer.pad_token_id, left=False),
            response_mask=response_mask,
            rewards=torch.zeros(len(picked)),
            old_logprobs=torch.zeros_like(response_mask),
            entropy=torch.zeros_like(response_mask),
        )
        logprobs = response_logprobs(model, batch, prompts_shared=False)  # one answer per prompt
        loss = -masked_sum(logprobs, batch.response_mask).sum() / response_mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        progress.set_postfix(loss=f"{loss.item():.3f}")
    return save_checkpoint(out_dir, model, tokenizer, {"sft_steps": steps, "seed": seed})
