"""Specification of `evaluate`: which rows are one problem (repeats merged), each prompt's own
generation cap, prompts too long for the context, and scoring failures, all per data source."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from pacs.data.loading import render_prompt
from pacs.distributed.world import World
from pacs.eval.evaluate import evaluate, evaluate_model, merge_repeats
from pacs.models.tiny import build_char_tokenizer
from pacs.rewards import ScoringPool
from pacs.rollout.base import Rollouts, SamplingParams

PLUGIN_MODULE = "pacs_test_eval_plugin"
PLUGIN_SOURCE = """
import os
import time


def fail_on_request(data_source, solution_str, ground_truth, extra_info=None):
    if "sleep" in solution_str:
        time.sleep(3600)
    if "exit" in solution_str:
        os._exit(3)
    return 1.0
"""


def math_row(index: int | None, repeat: int | None, source: str = "aime2025", text: str | None = None) -> dict:
    extra_info = {"split": "test", "index": index}
    if repeat is not None:
        extra_info["repeat"] = repeat
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": text or f"problem {index}"}],
        "reward_model": {"style": "rule", "ground_truth": str(index)},
        "extra_info": extra_info,
    }


class AnsweringEngine:
    """Answers "problem I" with \\boxed{I} on every other sample (a prompt without a number gets its
    text back); records (prompts, n, max_new_tokens) of every generate call."""

    def __init__(self, tokenizer):
        self.tokenizer, self.calls = tokenizer, []

    def generate(self, prompt_token_ids, params: SamplingParams) -> Rollouts:
        self.calls.append((len(prompt_token_ids), params.n, params.max_new_tokens))
        texts = []
        for ids in prompt_token_ids:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            answer = text.split("problem ")[1] if "problem " in text else text
            texts += [f"\\boxed{{{answer}}}" if sample % 2 == 0 else "\\boxed{-1}" for sample in range(params.n)]
        rows = len(texts)
        return Rollouts(torch.zeros(rows, 1), torch.ones(rows, 1), torch.zeros(rows, 1), torch.ones(rows, 1), texts, params.n)


def run(rows: list[dict], params: SamplingParams = SamplingParams(n=2), **options):
    tokenizer = build_char_tokenizer()
    engine = AnsweringEngine(tokenizer)
    with ScoringPool(num_workers=0) as scorer:
        result = evaluate(engine, tokenizer, rows, params, scorer, show_progress=False, **options)
    return result, engine.calls


def prompt_length(row: dict) -> int:
    tokenizer = build_char_tokenizer()
    return len(tokenizer(render_prompt(tokenizer, row), add_special_tokens=False)["input_ids"])


def test_copies_of_a_problem_are_merged_in_order():
    rows = [math_row(0, 0), math_row(0, 1), math_row(1, 0), math_row(1, 1)]
    assert merge_repeats(rows) == [(rows[0], 2), (rows[2], 2)]


def test_rows_without_a_repeat_field_are_separate_problems():
    rows = [math_row(0, None), math_row(0, None)]
    assert merge_repeats(rows) == [(rows[0], 1), (rows[1], 1)]


@pytest.mark.parametrize("index", [None, "missing"])
def test_rows_without_an_index_are_separate_problems(index):
    rows = [math_row(None, 0), math_row(None, 0)]
    if index == "missing":
        for row in rows:
            del row["extra_info"]["index"]
    assert merge_repeats(rows) == [(rows[0], 1), (rows[1], 1)]


def test_uneven_repeats_within_a_data_source_are_refused():
    with pytest.raises(ValueError, match="'aime2025' repeats its problems unevenly .*row 2 has 1; row 0 has 2"):
        merge_repeats([math_row(0, 0), math_row(0, 1), math_row(1, 0)])


def test_different_problems_that_share_a_data_source_and_index_are_refused_naming_both_rows():
    aime2024 = [math_row(0, 0, text="an AIME 2024 problem"), math_row(1, 0, text="another")]
    aime2025 = [math_row(0, 0, text="an AIME 2025 problem"), math_row(1, 0, text="one more")]
    locations = ["a.parquet: row 0", "a.parquet: row 1", "b.parquet: row 0", "b.parquet: row 1"]
    with pytest.raises(
        ValueError,
        match=r"a\.parquet: row 0 and b\.parquet: row 0 share data_source 'aime2025', extra_info\.index 0 but their "
        r"prompts differ.*Prepare each benchmark with its own --source",
    ):
        merge_repeats(aime2024 + aime2025, locations)


def test_copies_with_different_ground_truths_are_refused():
    second = math_row(0, 1)
    second["reward_model"]["ground_truth"] = "7"
    with pytest.raises(ValueError, match="row 0 and row 1 share .* but their ground truths differ"):
        merge_repeats([math_row(0, 0), second])


def test_a_file_given_twice_is_refused_naming_the_copy_numbers():
    rows = [math_row(0, 0), math_row(0, 1)]
    with pytest.raises(ValueError, match=r"\(row 0, row 1, row 2, row 3\) are numbered extra_info.repeat = \[0, 0, 1, 1\]"):
        merge_repeats(rows + rows)


def test_repeated_prompts_are_generated_once_with_n_times_r_samples():
    rows = [math_row(index, repeat) for index in range(3) for repeat in range(4)]
    result, calls = run(rows)
    assert calls == [(3, 8, 32)]
    assert len(result.records) == 24
    assert result.metrics["aime2025"]["pass@1"] == pytest.approx(0.5)
    assert set(result.metrics["aime2025"]) == {"pass@1", "pass@2", "pass@4", "pass@8"}


def test_each_prompt_gets_its_own_generation_cap_from_the_context_length():
    long_row = math_row(1, None, source="amc23", text="problem 1 " + "x" * 40)
    rows = [math_row(0, None, source="arithmetic"), long_row, math_row(2, None, source="arithmetic")]
    context_length = prompt_length(long_row) + 3
    result, calls = run(rows, SamplingParams(n=2, max_new_tokens=8), context_length=context_length)
    assert sorted(calls) == [(1, 2, 3), (2, 2, 8)]
    assert result.sources["arithmetic"].summary()["max_new_tokens"] == {
        "requested": 8,
        "min": 8,
        "max": 8,
        "prompts_below_requested": 0,
    }
    assert result.sources["amc23"].summary()["max_new_tokens"] == {
        "requested": 8,
        "min": 3,
        "max": 3,
        "prompts_below_requested": 1,
    }


def test_samples_come_back_in_the_rows_order_whatever_the_generation_groups():
    rows = [math_row(0, None, source="gsm8k"), math_row(1, 0), math_row(1, 1), math_row(2, None, source="gsm8k")]
    result, _ = run(rows)
    assert [(record["index"], record["sample"]) for record in result.records] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (1, 2),
        (1, 3),
        (2, 0),
        (2, 1),
    ]


def test_prompts_too_long_are_left_out_of_pass_at_k_and_counted_and_their_source_still_reported():
    rows = [math_row(0, None, source="arithmetic"), math_row(1, None, source="amc23", text="problem 1 " + "x" * 40)]
    result, _ = run(rows, context_length=prompt_length(rows[1]))
    assert result.sources["amc23"].summary() == {
        "problems": 0,
        "samples_per_problem": 2,
        "prompts_dropped_too_long": 1,
        "timeouts": 0,
        "crashes": 0,
        "max_new_tokens": {"requested": 32, "min": None, "max": None, "prompts_below_requested": 0},
        "pass@k": None,
        "problem_indices": [],
        "correct_counts": [],
    }
    assert result.sources["arithmetic"].summary()["pass@k"] == {"pass@1": 0.5, "pass@2": 1.0}
    assert "amc23" not in result.metrics
    assert result.warnings() == [
        "amc23: 1 of 1 prompts leave no room to generate within the model's context and are left out of pass@k"
    ]


def test_each_problem_is_reported_with_its_position_and_correct_samples():
    rows = [math_row(0, None, source="arithmetic"), math_row(1, None, source="gsm8k"), math_row(2, None, source="arithmetic")]
    result, _ = run(rows)
    arithmetic = result.sources["arithmetic"].summary()
    assert (arithmetic["problem_indices"], arithmetic["correct_counts"]) == ([0, 2], [1, 1])
    assert result.sources["gsm8k"].summary()["problem_indices"] == [1]


def test_scoring_timeouts_and_crashes_are_counted_per_data_source(tmp_path, monkeypatch):
    (tmp_path / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, PLUGIN_MODULE, raising=False)
    rows = [math_row(0, None, source="slow", text="sleep"), math_row(1, None, source="broken", text="exit")]
    tokenizer = build_char_tokenizer()
    with ScoringPool(f"{PLUGIN_MODULE}:fail_on_request", num_workers=1, timeout_s=0.5) as scorer:
        result = evaluate(AnsweringEngine(tokenizer), tokenizer, rows, SamplingParams(n=1), scorer, show_progress=False)
    assert (result.sources["slow"].timeouts, result.sources["slow"].crashes) == (1, 0)
    assert (result.sources["broken"].timeouts, result.sources["broken"].crashes) == (0, 1)
    assert result.timed_out == 1


def test_eval_metrics_file_holds_the_settings_and_every_data_source(tmp_path, tiny_model_dir, capsys):
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps(math_row(0, None, source="arithmetic")) + "\n")
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps(math_row(0, None, source="amc23", text="x" * 2100)) + "\n")
    evaluate_model(
        str(tiny_model_dir),
        [str(short), str(long)],
        processes=World.single(),
        n=2,
        out_dir=tmp_path / "eval",
        max_tokens=4,
        reward_workers=0,
        show_progress=False,
    )
    metrics = json.loads((tmp_path / "eval" / "eval_metrics.json").read_text())
    assert metrics["settings"] == {
        "model_path": str(tiny_model_dir),
        "specs": [str(short), str(long)],
        "n": 2,
        "temperature": 0.6,
        "top_p": 0.95,
        "max_tokens": 4,
        "seed": 0,
        "dtype": "float32",
        "reward_function": None,
        "reward_timeout_s": 1.0,
        "reward_workers": 0,
        "engine": "hf",
        "continuous_batching": "auto",
        "tools": None,
    }
    assert list(metrics["data_sources"]) == ["arithmetic", "amc23"]
    arithmetic = metrics["data_sources"]["arithmetic"]
    assert {key: arithmetic[key] for key in ("problems", "samples_per_problem", "prompts_dropped_too_long")} == {
        "problems": 1,
        "samples_per_problem": 2,
        "prompts_dropped_too_long": 0,
    }
    assert set(arithmetic["pass@k"]) == {"pass@1", "pass@2"}
    assert metrics["data_sources"]["amc23"]["pass@k"] is None
    assert "warning: amc23: 1 of 1 prompts leave no room to generate" in capsys.readouterr().err
