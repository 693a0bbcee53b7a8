"""Evaluation: n samples per problem, scored by the verifier, pass@k per data source.

Prepared files may repeat each problem R times (`pacs prepare --repeat R`, rows sharing
`data_source` and `extra_info.index`): such copies are merged and generated once with n·R
samples, so pass@k reaches k = n·R without generating any prompt twice.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from pacs.data.loading import load_rows
from pacs.data.prompts import encode_prompts
from pacs.eval.passk import mean_pass_at_k
from pacs.models.loading import load_causal_lm, load_tokenizer
from pacs.rewards import ScoringPool
from pacs.rollout.base import RolloutEngine, SamplingParams
from pacs.rollout.hf import TransformersEngine


@dataclass
class EvalResult:
    """records: one dict per sample; metrics: {data_source: {"pass@k": value}}."""

    records: list[dict]
    metrics: dict[str, dict[str, float]]
    num_filtered: int
    timed_out: int

    def write(self, out_dir: Path) -> None:
        """`eval_rollout.jsonl` (every sample with its score) and `eval_metrics.json`."""
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / "eval_rollout.jsonl", "w") as handle:
            for record in self.records:
                handle.write(json.dumps(record) + "\n")
        (out_dir / "eval_metrics.json").write_text(json.dumps(self.metrics, indent=2) + "\n")


def merge_repeats(rows: list[dict]) -> list[tuple[dict, int]]:
    """(first row, number of copies) per distinct problem, in order of first appearance.

    Rows are copies of one problem when they share `data_source` and `extra_info.index` and carry
    `extra_info.repeat`. Every problem of one data source must have the same number of copies.
    """
    copies: dict[tuple, list[dict]] = {}
    for position, row in enumerate(rows):
        extra_info = row.get("extra_info") or {}
        key = (row["data_source"], extra_info["index"]) if "repeat" in extra_info else ("row", position)
        copies.setdefault(key, []).append(row)
    counts_by_source: dict[str, set[int]] = defaultdict(set)
    for group in copies.values():
        counts_by_source[group[0]["data_source"]].add(len(group))
    for source, counts in counts_by_source.items():
        if len(counts) > 1:
            raise ValueError(
                f"data_source {source!r} repeats its problems unevenly ({sorted(counts)} copies); "
                "prepare every problem with the same --repeat"
            )
    return [(group[0], len(group)) for group in copies.values()]


def evaluate(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict],
    params: SamplingParams,
    scorer: ScoringPool,
    *,
    max_prompt_length: int | None = None,
    context_length: int | None = None,
    sequences_per_call: int = 512,
    show_progress: bool = True,
) -> EvalResult:
    """Sample `params.n` responses per copy of every problem, score them, compute pass@k.

    With `context_length` (the model's), prompts that leave no room to generate are left out and
    counted like over-long ones, and `params.max_new_tokens` is capped by the context length
    minus the longest remaining prompt. A sample counts as correct when its score is 1.
    """
    if context_length is not None:
        max_prompt_length = min(max_prompt_length or context_length - 1, context_length - 1)
    problems = merge_repeats(rows)
    prompts = encode_prompts(tokenizer, [row for row, _ in problems], max_prompt_length)
    if not prompts.rows:
        raise ValueError(f"no prompt is within max_prompt_length={max_prompt_length} tokens; nothing to evaluate")
    if context_length is not None:
        longest_prompt = max(len(ids) for ids in prompts.token_ids)
        params = replace(params, max_new_tokens=min(params.max_new_tokens, context_length - longest_prompt))
    copies_of = {id(row): copies for row, copies in problems}
    by_samples: dict[int, list[int]] = defaultdict(list)
    for position, row in enumerate(prompts.rows):
        by_samples[params.n * copies_of[id(row)]].append(position)
    records: list[dict] = []
    correct_counts: dict[str, list[int]] = defaultdict(list)
    samples_of: dict[str, int] = {}
    timed_out = 0
    progress = tqdm(total=len(prompts.rows), desc="evaluating", unit="prompt", disable=not show_progress)
    for samples, positions in by_samples.items():
        prompts_per_call = max(1, sequences_per_call // samples)
        for start in range(0, len(positions), prompts_per_call):
            chunk = positions[start : start + prompts_per_call]
            rollouts = engine.generate(
                [prompts.token_ids[p] for p in chunk], replace(params, n=samples)
            )
            chunk_rows = [prompts.rows[p] for p in chunk]
            batch = scorer.score([row for row in chunk_rows for _ in range(samples)], rollouts.response_texts)
            timed_out += batch.timed_out
            for problem, row in enumerate(chunk_rows):
                scores = batch.scores[problem * samples : (problem + 1) * samples]
                correct_counts[row["data_source"]].append(sum(score == 1.0 for score in scores))
                samples_of[row["data_source"]] = samples
                for sample, score in enumerate(scores):
                    records.append(
                        {
                            "data_source": row["data_source"],
                            "index": (row.get("extra_info") or {}).get("index", chunk[problem]),
                            "sample": sample,
                            "prompt": row["prompt"],
                            "ground_truth": row["reward_model"]["ground_truth"],
                            "response": rollouts.response_texts[problem * samples + sample],
                            "score": score,
                        }
                    )
            progress.update(len(chunk))
    progress.close()
    metrics = {source: mean_pass_at_k(counts, samples_of[source]) for source, counts in correct_counts.items()}
    return EvalResult(records, metrics, prompts.num_filtered, timed_out)


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
    reward_timeout_s: float = 1.0,
    reward_workers: int = 2,
    show_progress: bool = True,
) -> EvalResult:
    """`pacs eval`: load a model, sample `n` responses per problem (per copy of a repeated
    problem) of every spec (validation split for built-in tasks), score them, and write
    `eval_rollout.jsonl` and `eval_metrics.json`.

    Prompts that do not fit the model's context are left out and counted (`num_filtered`);
    `max_tokens` is capped by the context length minus the longest remaining prompt (`evaluate`).
    """
    torch.manual_seed(seed)
    tokenizer = load_tokenizer(model_path)
    model = load_causal_lm(model_path, dtype=dtype)
    if torch.cuda.is_available():
        model = model.cuda()
    rows = [row for spec in specs for row in load_rows(spec, default_split="val")]
    params = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_tokens)
    engine = TransformersEngine(model, tokenizer)
    with ScoringPool(reward_function, num_workers=reward_workers, timeout_s=reward_timeout_s) as scorer:
        result = evaluate(
            engine,
            tokenizer,
            rows,
            params,
            scorer,
            context_length=getattr(model.config, "max_position_embeddings", None),
            show_progress=show_progress,
        )
    result.write(out_dir)
    return result
