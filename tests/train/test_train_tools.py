"""Specification of training runs with a tool (`rollout.tools`): the tool's use is reported, a run
whose model never calls it trains what a run without it trains, and a run whose model calls it
trains on trajectories holding the tool's output."""

from __future__ import annotations

import math

import pytest
import torch
from mixed_rewards import EXACT_TWO_STEPS
from safetensors.torch import load_file

from pacs.config import load_config
from pacs.rollout import multiturn
from pacs.train.trainer import train

TOOL_METRICS = ("rollout/tool_calls_mean", "rollout/tool_errors_fraction", "rollout/turns_mean", "time/tool_s")


def run(tmp_path, tiny_model_dir, name: str, *overrides: str):
    config = load_config(
        "builtin:demo", [f"output_dir={tmp_path / name}", f"model.path={tiny_model_dir}", *EXACT_TWO_STEPS, *overrides]
    )
    result = train(config, show_progress=False)
    return result, load_file(result.final_checkpoint / "model.safetensors")


@pytest.mark.slow
def test_a_run_whose_model_never_calls_the_tool_trains_the_weights_of_the_run_without_it(tmp_path, tiny_model_dir):
    with_tool, tool_weights = run(tmp_path, tiny_model_dir, "tool", "rollout.tools=python")
    _, plain_weights = run(tmp_path, tiny_model_dir, "plain")
    assert all(torch.equal(tool_weights[name], plain_weights[name]) for name in plain_weights)
    metrics = with_tool.last_metrics
    assert all(name in metrics for name in TOOL_METRICS)
    assert (metrics["rollout/tool_calls_mean"], metrics["rollout/turns_mean"]) == (0.0, 1.0)


@pytest.mark.slow
def test_a_run_whose_model_calls_the_tool_trains_on_trajectories_with_its_output(tmp_path, tiny_model_dir, monkeypatch):
    """The built-in tiny model writes no newline, so no python block: here every response's first
    turn counts as a call of `print(2 ** 10)` after its first two tokens."""
    original = multiturn.tool_call_end
    monkeypatch.setattr(
        multiturn, "tool_call_end", lambda ids, tokenizer: (2, "print(2 ** 10)") if len(ids) > 2 else original(ids, tokenizer)
    )
    result, weights = run(
        tmp_path, tiny_model_dir, "calls", "rollout.tools=python", "rollout.max_turns=2", "data.max_response_length=24"
    )
    metrics = result.last_metrics
    assert metrics["rollout/tool_calls_mean"] > 0 and metrics["rollout/turns_mean"] > 1
    assert metrics["rollout/tool_errors_fraction"] == 0.0
    assert metrics["response_length/mean"] > 2 + len("\n```output\n1024\n```\n") * metrics["rollout/tool_calls_mean"] - 1e-9
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert max((weights[name] - initial[name]).abs().max().item() for name in initial) > 1e-6
    assert all(math.isfinite(value) for value in metrics.values())
