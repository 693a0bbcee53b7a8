"""Specification of `pacs eval` with tools: it generates as training does with `rollout.tools`
(the `--tools` option, or the settings of the run whose checkpoint it evaluates), reports each
data source's tool use, and refuses what cannot run before the model loads."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from pacs.cli import main
from pacs.eval.evaluate import eval_tool_settings
from pacs.rollout import multiturn

DATA = "builtin:arithmetic?size=2"


@pytest.fixture
def calls_after_two_tokens(monkeypatch):
    """The built-in tiny model writes no newline, so no python block: with this, every response's
    first turn counts as a call of `print(2 ** 10)` after its first two tokens."""
    original = multiturn.tool_call_end
    monkeypatch.setattr(
        multiturn, "tool_call_end", lambda ids, tokenizer: (2, "print(2 ** 10)") if len(ids) > 2 else original(ids, tokenizer)
    )


def trained_run(tmp_path, tiny_model_dir, rollout: dict):
    """A folder laid out as `pacs train` leaves it: config.yaml with `rollout`, and the model as
    checkpoints/final."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "final").symlink_to(tiny_model_dir)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"rollout": {"n": 4, **rollout}}))
    return run_dir / "checkpoints" / "final"


def pacs_eval(model, out, *options: str) -> None:
    main(
        [
            "eval",
            "--model",
            str(model),
            "--data",
            DATA,
            "-n",
            "4",
            "--max-tokens",
            "24",
            "--reward-workers",
            "0",
            "--out",
            str(out),
            *options,
        ]
    )


def test_eval_with_tools_generates_trajectories_and_reports_their_tool_use(
    tmp_path, tiny_model_dir, calls_after_two_tokens, capsys
):
    pacs_eval(tiny_model_dir, tmp_path / "eval", "--tools", "python", "--max-turns", "2")
    metrics = json.loads((tmp_path / "eval" / "eval_metrics.json").read_text())
    assert metrics["settings"]["tools"]["tools"] == "python" and metrics["settings"]["tools"]["max_turns"] == 2
    tool_use = metrics["data_sources"]["arithmetic"]["tools"]
    assert tool_use["tool_calls_mean"] > 0 and tool_use["turns_mean"] == 1 + tool_use["tool_calls_mean"]
    assert tool_use["tool_errors_fraction"] == 0.0
    samples = [json.loads(line) for line in (tmp_path / "eval" / "eval_rollout.jsonl").read_text().splitlines()]
    assert any("1024" in sample["response"] for sample in samples)
    assert "tool calls" in capsys.readouterr().out


def test_eval_of_a_tool_runs_checkpoint_generates_with_the_runs_tools(tmp_path, tiny_model_dir, calls_after_two_tokens, capsys):
    checkpoint = trained_run(tmp_path, tiny_model_dir, {"tools": "python", "max_turns": 2, "tool_timeout_s": 3.0})
    pacs_eval(checkpoint, tmp_path / "eval")
    metrics = json.loads((tmp_path / "eval" / "eval_metrics.json").read_text())
    assert metrics["settings"]["tools"] == {"tools": "python", "max_turns": 2, "tool_timeout_s": 3.0}
    assert metrics["data_sources"]["arithmetic"]["tools"]["tool_calls_mean"] > 0
    assert f"generating with the tools of {checkpoint.parent.parent / 'config.yaml'}" in capsys.readouterr().err


def test_tools_none_evaluates_a_tool_runs_checkpoint_single_turn(tmp_path, tiny_model_dir):
    checkpoint = trained_run(tmp_path, tiny_model_dir, {"tools": "python", "max_turns": 2})
    assert eval_tool_settings(str(checkpoint), "none", None) == (None, None)


def test_the_options_replace_the_runs_tool_and_turns_and_keep_its_limits(tmp_path, tiny_model_dir):
    checkpoint = trained_run(tmp_path, tiny_model_dir, {"tools": "python", "max_turns": 2, "tool_workers": 3})
    settings, source = eval_tool_settings(str(checkpoint), "mytools:calculator", 5)
    assert settings == {"tools": "mytools:calculator", "max_turns": 5, "tool_workers": 3}
    assert source == checkpoint.parent.parent / "config.yaml"


def test_a_model_outside_a_tool_run_is_evaluated_single_turn(tmp_path, tiny_model_dir):
    checkpoint = trained_run(tmp_path, tiny_model_dir, {"tools": None})
    assert eval_tool_settings(str(checkpoint), None, None) == (None, None)
    assert eval_tool_settings(str(tiny_model_dir), None, None) == (None, None)


def test_max_turns_without_tools_is_refused_naming_the_fix(tiny_model_dir):
    with pytest.raises(ValueError, match=r"--max-turns 3 without tools: give --tools python"):
        eval_tool_settings(str(tiny_model_dir), None, 3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--tools", "pacs_no_such_module:tool"], "--tools: Cannot import module 'pacs_no_such_module'"),
        (["--tools", "not_a_spec"], "tools='not_a_spec': Value error, 'not_a_spec' is neither 'python'"),
    ],
)
def test_tools_that_cannot_run_are_refused_before_the_model_loads(
    tmp_path, tiny_model_dir, capsys, monkeypatch, options, message
):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("pacs.eval.evaluate.load_causal_lm", no_model)
    with pytest.raises(SystemExit) as exit_info:
        pacs_eval(tiny_model_dir, tmp_path / "eval", *options)
    assert exit_info.value.code != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()


def test_the_tool_format_option_replaces_the_runs_and_needs_tools(tmp_path, tiny_model_dir):
    checkpoint = trained_run(tmp_path, tiny_model_dir, {"tools": "python", "tool_format": "tir"})
    assert eval_tool_settings(str(checkpoint), None, None, "chat")[0] == {"tools": "python", "tool_format": "chat"}
    with pytest.raises(ValueError, match=r"--tool-format chat without tools: give --tools python"):
        eval_tool_settings(str(tiny_model_dir), None, None, "chat")


def test_eval_in_the_chat_format_records_it_and_generates(tmp_path, tiny_model_dir):
    pacs_eval(tiny_model_dir, tmp_path / "eval", "--tools", "python", "--tool-format", "chat", "--max-turns", "2")
    metrics = json.loads((tmp_path / "eval" / "eval_metrics.json").read_text())
    assert metrics["settings"]["tools"] == {"tools": "python", "tool_format": "chat", "max_turns": 2}
    assert metrics["data_sources"]["arithmetic"]["tools"]["turns_mean"] >= 1


def test_a_chat_template_the_chat_format_cannot_use_is_refused_before_the_model_loads(
    tmp_path, tiny_model_dir, capsys, monkeypatch
):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    (model_dir / "chat_template.jinja").write_text("{% for message in messages %}{{ message['content'] }}{% endfor %}")

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("pacs.eval.evaluate.load_causal_lm", no_model)
    with pytest.raises(SystemExit):
        pacs_eval(model_dir, tmp_path / "eval", "--tools", "python", "--tool-format", "chat")
    assert "does not end an assistant message with the end-of-sequence token '<|end|>'" in capsys.readouterr().err
    assert not (tmp_path / "eval").exists()
