"""Repeated problems are generated once with n*R samples and reported as pass@k up to k = n*R."""

from __future__ import annotations

import pytest
import torch

from pacs.eval.evaluate import evaluate, merge_repeats
from pacs.models.tiny import build_char_tokenizer
from pacs.rewards import ScoringPool
from pacs.rollout.base import Rollouts, SamplingParams


def math_row(index: int, repeat: int | None, source: str = "aime2025") -> dict:
    extra_info = {"split": "test", "index": index}
    if repeat is not None:
        extra_info["repeat"] = repeat
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": f"problem {index}"}],
        "reward_model": {"style": "rule", "ground_truth": str(index)},
        "extra_info": extra_info,
    }


class AnsweringEngine:
    """Answers prompt i correctly on every other sample; records every generate call."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def generate(self, prompt_token_ids, params: SamplingParams) -> Rollouts:
        self.calls.append((len(prompt_token_ids), params.n))
        texts = []
        for ids in prompt_token_ids:
            index = self.tokenizer.decode(ids, skip_special_tokens=True).split("problem ")[1]
            texts += [f"\\boxed{{{index}}}" if sample % 2 == 0 else "\\boxed{-1}" for sample in range(params.n)]
        rows = len(texts)
        return Rollouts(torch.zeros(rows, 1), torch.ones(rows, 1), torch.zeros(rows, 1), torch.ones(rows, 1), texts, params.n)


def test_copies_of_a_problem_are_merged_in_order():
    rows = [math_row(0, 0), math_row(0, 1), math_row(1, 0), math_row(1, 1)]
    assert merge_repeats(rows) == [(rows[0], 2), (rows[2], 2)]


def test_rows_without_a_repeat_field_are_separate_problems():
    rows = [math_row(0, None), math_row(0, None)]
    assert merge_repeats(rows) == [(rows[0], 1), (rows[1], 1)]


def test_uneven_repeats_within_a_data_source_are_refused():
    with pytest.raises(ValueError, match="'aime2025' repeats its problems unevenly"):
        merge_repeats([math_row(0, 0), math_row(0, 1), math_row(1, 0)])


def test_repeated_prompts_are_generated_once_with_n_times_r_samples():
    tokenizer = build_char_tokenizer()
    engine = AnsweringEngine(tokenizer)
    rows = [math_row(index, repeat) for index in range(3) for repeat in range(4)]
    with ScoringPool(num_workers=0) as scorer:
        result = evaluate(engine, tokenizer, rows, SamplingParams(n=2), scorer, show_progress=False)
    assert engine.calls == [(3, 8)]
    assert len(result.records) == 24
    assert result.metrics["aime2025"]["pass@1"] == pytest.approx(0.5)
    assert set(result.metrics["aime2025"]) == {"pass@1", "pass@2", "pass@4", "pass@8"}
