"""Specification of training runs with a tool (`rollout.tools`): the tool's use is reported, a run
whose model never calls it trains what a run without it trains, and a run whose model calls it
trains on trajectories holding the tool's output."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
import torch
from killing import finished, kill_once_checkpointed
from mixed_rewards import EXACT_TWO_STEPS
from safetensors.torch import load_file
from torchrun_jobs import process_env

from pacs.config import ConfigError, load_config
from pacs.models.loading import BUILTIN_MODELS
from pacs.rollout import multiturn
from pacs.train.metrics import read_metrics
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


def test_tools_with_a_tensor_parallel_vllm_engine_are_refused_naming_the_fix():
    """Every rank of a tensor-parallel engine runs the tool itself: outputs that differ between
    ranks would feed the engine's ranks different prompts."""
    with pytest.raises(ConfigError, match=r"rollout.vllm.tensor_parallel_size=2: .*set tensor_parallel_size=1"):
        load_config(None, ["rollout.tools=python", "rollout.engine=vllm", "rollout.vllm.tensor_parallel_size=2"])
    assert load_config(None, ["rollout.tools=python", "rollout.engine=vllm"]).rollout.engine == "vllm"


@pytest.fixture
def calls_after_the_first_token(monkeypatch):
    """The built-in tiny model writes no newline, so no python block: with this, every response's
    first turn counts as a call of `print(2 ** 10)` after its first token (a turn has at least one
    token, so every response calls the tool once, whatever the model samples)."""
    original = multiturn.tool_call_end
    monkeypatch.setattr(
        multiturn, "tool_call_end", lambda ids, tokenizer: (1, "print(2 ** 10)") if len(ids) >= 1 else original(ids, tokenizer)
    )


@pytest.mark.slow
def test_a_run_whose_model_calls_the_tool_trains_on_trajectories_with_its_output(
    tmp_path, tiny_model_dir, calls_after_the_first_token
):
    result, weights = run(
        tmp_path, tiny_model_dir, "calls", "rollout.tools=python", "rollout.max_turns=2", "data.max_response_length=24"
    )
    metrics = result.last_metrics
    assert (metrics["rollout/tool_calls_mean"], metrics["rollout/turns_mean"]) == (1.0, 2.0)
    assert metrics["rollout/tool_errors_fraction"] == 0.0
    assert metrics["response_length/mean"] > 1 + len("\n```output\n1024\n```\n") * metrics["rollout/tool_calls_mean"] - 1e-9
    initial = load_file(tiny_model_dir / "model.safetensors")
    assert max((weights[name] - initial[name]).abs().max().item() for name in initial) > 1e-6
    assert all(math.isfinite(value) for value in metrics.values())


@pytest.mark.slow
def test_a_run_with_a_tool_writes_traces_of_its_trajectories_each_step(tmp_path, tiny_model_dir, calls_after_the_first_token):
    result, _ = run(
        tmp_path,
        tiny_model_dir,
        "traces",
        "rollout.tools=python",
        "rollout.max_turns=2",
        "data.max_response_length=24",
        "train.traces_per_step=3",
    )
    lines = [json.loads(line) for line in (result.output_dir / "traces.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        assert len(line["trajectories"]) == 3
        for trajectory in line["trajectories"]:
            assert trajectory["prompt"] and isinstance(trajectory["reward"], float)
            assert "1024" in trajectory["turns"][1]["tool"]  # the tiny tokenizer drops the block's newlines


@pytest.mark.slow
def test_a_run_in_the_chat_format_appends_the_templates_tool_message(tmp_path, tiny_model_dir, monkeypatch):
    """A turn's first token counts as a call of `print(2 ** 10)` ending it (the random tiny model
    writes no `<tool_call>`); its output comes back as the template's `<|tool|>1024<|end|><|assistant|>`."""
    monkeypatch.setattr(
        multiturn.ChatFormat, "call_in", lambda self, ids: (1, multiturn.ToolCall("print(2 ** 10)")) if ids else None
    )
    result, _ = run(
        tmp_path,
        tiny_model_dir,
        "chat",
        "rollout.tools=python",
        "rollout.tool_format=chat",
        "rollout.max_turns=2",
        "data.max_response_length=24",
        "train.traces_per_step=1",
    )
    assert (result.last_metrics["rollout/tool_calls_mean"], result.last_metrics["rollout/turns_mean"]) == (1.0, 2.0)
    trajectory = json.loads((result.output_dir / "traces.jsonl").read_text().splitlines()[-1])["trajectories"][0]
    assert trajectory["turns"][1] == {"tool": "<|tool|>1024"}  # <|end|> and <|assistant|> are special tokens


def test_a_model_whose_chat_template_cannot_carry_the_chat_format_is_refused_before_anything_is_written(tmp_path, tiny_model_dir):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "chat_template.jinja").write_text("{% for message in messages %}{{ message['content'] }}{% endfor %}")
    config = load_config(
        "builtin:demo",
        [f"output_dir={tmp_path / 'run'}", f"model.path={model_dir}", "rollout.tools=python", "rollout.tool_format=chat"],
    )
    with pytest.raises(ConfigError, match=r"rollout.tool_format: .*does not end an assistant message with the end-of-sequence"):
        train(config, show_progress=False)
    assert not (tmp_path / "run").exists()


def test_a_built_in_model_whose_chat_template_cannot_carry_the_chat_format_is_refused_before_anything_is_written(
    tmp_path, tiny_model_dir, monkeypatch
):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "chat_template.jinja").write_text("{% for message in messages %}{{ message['content'] }}{% endfor %}")
    monkeypatch.setitem(BUILTIN_MODELS, "builtin:no-end-of-turn", lambda: model_dir)
    config = load_config(
        "builtin:demo",
        [
            f"output_dir={tmp_path / 'run'}",
            "model.path=builtin:no-end-of-turn",
            "rollout.tools=python",
            "rollout.tool_format=chat",
        ],
    )
    with pytest.raises(ConfigError, match=r"rollout.tool_format: .*does not end an assistant message with the end-of-sequence"):
        train(config, show_progress=False)
    assert not (tmp_path / "run").exists()


def pacs_train(output_dir, model_dir, *options: str) -> subprocess.Popen:
    """`pacs train` of the demo with the python tool, float64, in a new process group."""
    overrides = [f"output_dir={output_dir}", f"model.path={model_dir}", *EXACT_TWO_STEPS, "rollout.tools=python", *options]
    command = [sys.executable, "-m", "pacs.cli", "train", "--config", "builtin:demo", *overrides]
    return subprocess.Popen(
        command, env=process_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


@pytest.mark.slow
def test_a_killed_run_with_a_tool_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path, tiny_model_dir):
    options = ("train.steps=4", "train.save_every=1")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    finished(pacs_train(straight, tiny_model_dir, *options), timeout=600)
    job = pacs_train(killed, tiny_model_dir, *options)
    kill_once_checkpointed(job, killed)
    finished(pacs_train(killed, tiny_model_dir, *options, "resume=auto"), timeout=600)
    expected = load_file(straight / "checkpoints" / "final" / "model.safetensors")
    got = load_file(killed / "checkpoints" / "final" / "model.safetensors")
    assert all(torch.equal(got[name], expected[name]) for name in expected)
    assert [row["step"] for row in read_metrics(killed)] == [1, 2, 3, 4]
    assert all("rollout/tool_calls_mean" in row for row in read_metrics(killed))
    assert [json.loads(line)["step"] for line in (killed / "traces.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


@pytest.mark.slow
def test_a_tool_that_prints_the_answer_earns_no_reward_when_the_models_last_turn_does_not_give_it(
    tmp_path, tiny_model_dir, monkeypatch
):
    """Every response's first token calls a program printing the ground truth in `\\boxed{}`;
    the model's last turn is at most 2 tokens, too short to write it: each reward is 0 (it would be
    1 if the verifier read the tool's output)."""
    data = tmp_path / "sevens.jsonl"
    row = {"data_source": "arithmetic", "prompt": [{"role": "user", "content": "What is 3+4?"}]}
    data.write_text("".join(json.dumps({**row, "reward_model": {"ground_truth": "7"}}) + "\n" for _ in range(8)))
    original = multiturn.tool_call_end
    monkeypatch.setattr(
        multiturn, "tool_call_end", lambda ids, tokenizer: (1, "print('\\\\boxed{7}')") if ids else original(ids, tokenizer)
    )
    block = len(multiturn.output_block("x", "\\boxed{7}"))  # the tiny tokenizer: a token per character
    result, _ = run(
        tmp_path,
        tiny_model_dir,
        "forged",
        f"data.train={data}",
        "rollout.tools=python",
        "rollout.max_turns=2",
        f"data.max_response_length={1 + block + 2}",
        "train.traces_per_step=1",
        "reward.function=null",  # the data's own verifier, not the helpers' alternating scores
    )
    trajectory = json.loads((result.output_dir / "traces.jsonl").read_text().splitlines()[-1])["trajectories"][0]
    assert "\\boxed{7}" in trajectory["turns"][1]["tool"]
    assert all(row["reward/mean"] == 0.0 for row in read_metrics(result.output_dir))
