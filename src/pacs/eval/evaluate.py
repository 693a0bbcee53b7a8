"""Evaluation: n samples per problem, scored by the verifier, pass@k per data source."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from pacs.data.loading import load_rows
from pacs.data.prompts import encode_prompts
from pacs.eval.passk import mean_pass_at_k
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.rewards import load_reward_function, score_responses
from pacs.rollout.base import RolloutEngine, SamplingParams
from pacs.rollout.hf import TransformersEngine


@dataclass
class EvalResult:
    """records: one dict per sample; metrics: {data_source: {"pass@k": value}}."""

    records: list[dict]
    metrics: dict[str, dict[str, float]]
    num_filtered: int

    def write(self, out_dir: Path) -> None:
        """`eval_rollout.jsonl` (every sample with its score) and `eval_metrics.json`."""
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "eval_rollout.jsonl", "w") as handle:
            for record in self.records:
                handle.write(json.dumps(record) + "\n")
        (out_dir / "eval_metrics.json").write_text(json.dumps(self.metrics, indent=2) + "\n")


def evaluate(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict],
    params: SamplingParams,
    compute_score: Callable,
    *,
    max_prompt_length: int | None = None,
    sequences_per_call: int = 512,
    show_progress: bool = True,
) -> EvalResult:
    """Sample `params.n` responses for every row, score them, and compute pass@k.

    A sample counts as correct when its score is 1 (full credit).
    """
    prompts = encode_prompts(tokenizer, rows, max_prompt_length)
    if not prompts.rows:
        raise ValueError(f"no prompt is within max_prompt_length={max_prompt_length} tokens; nothing to evaluate")
    prompts_per_call = max(1, sequences_per_call // params.n)
    records: list[dict] = []
    correct_counts: dict[str, list[int]] = defaultdict(list)
    progress = tqdm(total=len(prompts.rows), desc="evaluating", unit="prompt", disable=not show_progress)
    for start in range(0, len(prompts.rows), prompts_per_call):
        chunk_rows = prompts.rows[start : start + prompts_per_call]
        rollouts = engine.generate(prompts.token_ids[start : start + prompts_per_call], params)
        repeated_rows = [row for row in chunk_rows for _ in range(params.n)]
        scores = score_responses(compute_score, repeated_rows, rollouts.response_texts)
        for problem, row in enumerate(chunk_rows):
            sample_scores = scores[problem * params.n : (problem + 1) * params.n]
            correct_counts[row["data_source"]].append(sum(score == 1.0 for score in sample_scores))
            for sample, score in enumerate(sample_scores):
                records.append(
                    {
                        "data_source": row["data_source"],
                        "index": (row.get("extra_info") or {}).get("index", start + problem),
                        "sample": sample,
                        "prompt": row["prompt"],
                        "ground_truth": row["reward_model"]["ground_truth"],
                        "response": rollouts.response_texts[problem * params.n + sample],
                        "score": score,
                    }
                )
        progress.update(len(chunk_rows))
    progress.close()
    metrics = {source: mean_pass_at_k(counts, params.n) for source, counts in correct_counts.items()}
    return EvalResult(records, metrics, prompts.num_filtered)


def evaluate_model(
    model_path: str,
    specs: list[str],
    *,
    n: int,
    out_dir: Path,
    temperature: float = 0.6,
    top_p: float = 0.95,
    max_tokens: int = 4096,
    seed: int = 0,
    dtype: str = "float32",
    reward_function: str | None = None,
    show_progress: bool = True,
) -> EvalResult:
    """`pacs eval`: load a model, sample `n` responses per problem of every spec (validation
    split for built-in tasks), score, write `eval_rollout.jsonl` and `eval_metrics.json`.

    `max_tokens` is capped by the model's context length minus the longest prompt.
    """
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(model_path)
    model = load_causal_lm(model_path, dtype=dtype)
    if torch.cuda.is_available():
        model = model.cuda()
    rows = [row for spec in specs for row in load_rows(spec, default_split="val")]
    context = getattr(model.config, "max_position_embeddings", None)
    longest_prompt = max(len(ids) for ids in encode_prompts(tokenizer, rows, None).token_ids)
    if context is not None:
        if longest_prompt >= context:
            raise ValueError(
                f"the longest prompt has {longest_prompt} tokens, at or beyond the model's context of {context}"
            )
        max_tokens = min(max_tokens, context - longest_prompt)
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_tokens)
    engine = TransformersEngine(model, tokenizer)
    result = evaluate(engine, tokenizer, rows, params, load_reward_function(reward_function), show_progress=show_progress)
    result.write(out_dir)
    return result
