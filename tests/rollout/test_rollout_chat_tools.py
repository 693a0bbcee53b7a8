"""Specification of multi-turn rollouts in the chat-template tool format (`rollout.tool_format: chat`,
`pacs.rollout.multiturn.ChatFormat`): a turn that ends with the end-of-sequence token and holds a
`<tool_call>` makes the call, the tool's output is appended as the tokenizer's own chat template
renders a tool message, and a malformed call is answered with its error."""

from __future__ import annotations

import json

import pytest
import torch
from qwen_style import qwen_style_tokenizer
from scripted_engines import ScriptedEngine

from pacs.config.sections import RolloutConfig
from pacs.models.tiny import build_char_tokenizer
from pacs.rollout.base import SamplingParams
from pacs.rollout.multiturn import ChatFormat, ToolCallingEngine, with_tools
from pacs.rollout.tools import PYTHON_TOOL, ToolRunner

QUESTION = "What is 2 ** 10?"
CALL = '<tool_call>{"name": "python", "arguments": {"code": "print(2 ** 10)"}}</tool_call>'
ANSWER = "The answer is 1024."


@pytest.fixture(scope="module")
def tiny_tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def python_tool():
    with ToolRunner(PYTHON_TOOL, num_workers=1, timeout_s=2.0, memory_limit_mib=512, max_output_chars=100) as runner:
        yield runner


def prompt_ids(tokenizer) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True)
    return tokenizer.encode(text, add_special_tokens=False)


def chat_engine(tokenizer, turns: list[list[str]], tools: ToolRunner, *, max_turns: int = 4, tool: str = PYTHON_TOOL):
    scripted = ScriptedEngine(tokenizer, turns)
    return scripted, ToolCallingEngine(scripted, tokenizer, tools, max_turns=max_turns, tool_format=ChatFormat(tokenizer, tool))


def conversation(*, call: str, output: str, answer: str) -> list[dict]:
    return [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": call},
        {"role": "tool", "content": output},
        {"role": "assistant", "content": answer},
    ]


def test_a_call_keeps_its_end_token_and_the_tool_message_is_appended_as_tool_tokens(tiny_tokenizer, python_tool):
    end = tiny_tokenizer.eos_token
    scripted, engine = chat_engine(tiny_tokenizer, [[CALL + end], [ANSWER + end]], python_tool)
    rollouts = engine.generate([prompt_ids(tiny_tokenizer)], SamplingParams(max_new_tokens=200))
    turn = tiny_tokenizer.encode(CALL + end, add_special_tokens=False)
    tool_message = tiny_tokenizer.encode("<|tool|>1024<|end|><|assistant|>", add_special_tokens=False)
    answer = tiny_tokenizer.encode(ANSWER + end, add_special_tokens=False)
    assert rollouts.response_ids[0].tolist() == turn + tool_message + answer
    assert rollouts.model_token_mask[0].tolist() == [1] * len(turn) + [0] * len(tool_message) + [1] * len(answer)
    assert scripted.prompts[1] == [prompt_ids(tiny_tokenizer) + turn + tool_message]
    assert (engine.last_stats.calls, engine.last_stats.errors, engine.last_stats.turns) == ([1], [0], [2])


def test_a_tiny_model_trajectory_is_the_templates_rendering_of_its_conversation(tiny_tokenizer, python_tool):
    """What the tools-demo warm start trains on: the template applied to [user, assistant(call),
    tool(output), assistant(answer)], token for token."""
    end = tiny_tokenizer.eos_token
    _, engine = chat_engine(tiny_tokenizer, [[CALL + end], [ANSWER + end]], python_tool)
    rollouts = engine.generate([prompt_ids(tiny_tokenizer)], SamplingParams(max_new_tokens=200))
    rendered = tiny_tokenizer.apply_chat_template(conversation(call=CALL, output="1024", answer=ANSWER), tokenize=False)
    trajectory = prompt_ids(tiny_tokenizer) + rollouts.response_ids[0].tolist()
    assert tiny_tokenizer.decode(trajectory) == rendered
    assert trajectory == tiny_tokenizer.encode(rendered, add_special_tokens=False)


def test_a_qwen_template_trajectory_reads_as_the_templates_rendering_of_its_conversation(python_tool):
    """Qwen2.5's template puts a newline after `<|im_end|>` and the tool's output in a user turn's
    `<tool_response>`; the model's last turn ends at its `<|im_end|>`, before that newline."""
    tokenizer = qwen_style_tokenizer()
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(2 ** 10)"}}\n</tool_call>'
    _, engine = chat_engine(tokenizer, [[call + "<|im_end|>"], [ANSWER + "<|im_end|>"]], python_tool)
    rollouts = engine.generate([prompt_ids(tokenizer)], SamplingParams(max_new_tokens=200))
    trajectory = tokenizer.decode(prompt_ids(tokenizer) + rollouts.response_ids[0].tolist())
    rendered = tokenizer.apply_chat_template(conversation(call=call, output="1024", answer=ANSWER), tokenize=False)
    assert trajectory + "\n" == rendered
    assert (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\n1024\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in trajectory
    )


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (
            '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}</tool_call>',
            "the call is not valid JSON (Expecting ',' delimiter",
        ),
        (
            '<tool_call>{"name": "calculator", "arguments": {"code": "print(1)"}}</tool_call>',
            "the call names the tool 'calculator'; the tool is 'python'",
        ),
        (
            '<tool_call>{"name": "python", "arguments": {"program": "print(1)"}}</tool_call>',
            "the python tool's arguments must hold the program",
        ),
        ('<tool_call>["python", "print(1)"]</tool_call>', "the call must be a JSON object with an object of arguments"),
    ],
)
def test_a_malformed_call_is_answered_with_its_error_and_counted_as_one(tiny_tokenizer, python_tool, call, error):
    end = tiny_tokenizer.eos_token
    _, engine = chat_engine(tiny_tokenizer, [[call + end], [ANSWER + end]], python_tool)
    rollouts = engine.generate([prompt_ids(tiny_tokenizer)], SamplingParams(max_new_tokens=400))
    response = tiny_tokenizer.decode(rollouts.response_ids[0].tolist())
    assert response.startswith(f"{call}<|end|><|tool|>ToolCallError: {error}")
    assert response.endswith(f"<|end|><|assistant|>{ANSWER}<|end|>")
    assert (engine.last_stats.calls, engine.last_stats.errors) == ([1], [1])


def test_only_a_turn_ended_by_the_end_token_with_a_complete_call_calls_the_tool(tiny_tokenizer, python_tool):
    end = tiny_tokenizer.eos_token
    no_end = CALL  # stopped by the length limit of its turn, not by the model
    unclosed = '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}' + end
    no_call = "The answer is 1024." + end
    _, engine = chat_engine(tiny_tokenizer, [[no_end, unclosed, no_call]], python_tool)
    rollouts = engine.generate([prompt_ids(tiny_tokenizer)], SamplingParams(n=3, max_new_tokens=200))
    assert rollouts.response_texts == [no_end, unclosed.removesuffix(end), "The answer is 1024."]
    assert engine.last_stats.calls == [0, 0, 0] and rollouts.model_token_mask.equal(rollouts.response_mask)


def test_a_turn_makes_its_first_call_only_and_the_last_turn_makes_none(tiny_tokenizer, python_tool):
    end = tiny_tokenizer.eos_token
    second = CALL.replace("2 ** 10", "3 ** 3")
    _, engine = chat_engine(tiny_tokenizer, [[CALL + second + end], [second + end]], python_tool, max_turns=2)
    rollouts = engine.generate([prompt_ids(tiny_tokenizer)], SamplingParams(max_new_tokens=400))
    assert rollouts.response_texts == [f"{CALL}{second}<|tool|>1024{second}"]
    assert engine.last_stats.calls == [1] and engine.last_stats.turns == [2]


def test_a_users_tool_is_called_by_its_function_name_with_the_arguments_as_json_text(tiny_tokenizer):
    end = tiny_tokenizer.eos_token
    arguments = {"text": "abc", "times": 2}
    call = f"<tool_call>{json.dumps({'name': 'reversed_text', 'arguments': arguments})}</tool_call>"
    with ToolRunner(
        "tool_functions:reversed_text", num_workers=1, timeout_s=2.0, memory_limit_mib=512, max_output_chars=100
    ) as tool:
        _, engine = chat_engine(tiny_tokenizer, [[call + end], [ANSWER + end]], tool, tool="tool_functions:reversed_text")
        rollouts = engine.generate([prompt_ids(tiny_tokenizer)], SamplingParams(max_new_tokens=400))
    assert rollouts.response_texts == [f"{call}<|tool|>{json.dumps(arguments)[::-1]}{ANSWER}"]


def test_the_tools_output_is_the_tool_messages_content_without_trailing_newlines(tiny_tokenizer):
    assert ChatFormat(tiny_tokenizer, PYTHON_TOOL).output_text("a b\n\n") == "<|tool|>a b<|end|><|assistant|>"


def test_a_template_that_does_not_end_an_assistant_message_with_the_end_token_is_refused_before_the_tools_start(
    tiny_tokenizer, monkeypatch
):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

    def no_workers(*args, **kwargs):
        raise AssertionError("the tool's workers were started")

    monkeypatch.setattr("pacs.rollout.multiturn.ToolRunner", no_workers)
    with pytest.raises(ValueError, match=r"does not end an assistant message with the end-of-sequence token '<\|end\|>'"):
        with_tools(object(), tokenizer, RolloutConfig(tools="python", tool_format="chat"))


def test_the_tool_format_setting_is_tir_or_chat():
    assert RolloutConfig().tool_format == "tir" and RolloutConfig(tool_format="chat").tool_format == "chat"
    with pytest.raises(ValueError, match=r"tool_format\n  Input should be 'tir' or 'chat'"):
        RolloutConfig(tool_format="hermes")


@pytest.mark.slow
def test_the_transformers_engine_takes_the_turns_of_a_model_that_learnt_the_conversation(tmp_path, tiny_model_dir, python_tool):
    """The tiny model fitted to one tool-using conversation (as the tools-demo warm start renders
    it) writes the call, reads the tool's output from the appended tokens and answers."""
    from pacs.models.loading import load_causal_lm, load_tokenizer
    from pacs.rollout.hf import TransformersEngine
    from pacs.train.sft import supervised_warm_start

    tokenizer = load_tokenizer(str(tiny_model_dir))
    demonstration = tokenizer.apply_chat_template(conversation(call=CALL, output="1024", answer=ANSWER), tokenize=False)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True)
    row = {"prompt": [{"role": "user", "content": QUESTION}], "answer": demonstration[len(prompt) :].removesuffix("<|end|>")}
    fitted = supervised_warm_start(
        str(tiny_model_dir), [row], lambda row: row["answer"], tmp_path / "fitted", steps=150, batch_size=1, show_progress=False
    )
    engine = TransformersEngine(load_causal_lm(str(fitted), dtype="float32"), tokenizer)
    tools = ToolCallingEngine(engine, tokenizer, python_tool, max_turns=3, tool_format=ChatFormat(tokenizer, PYTHON_TOOL))
    rollouts = tools.generate([prompt_ids(tokenizer)], SamplingParams(temperature=0.0, max_new_tokens=200))
    assert prompt_ids(tokenizer) + rollouts.response_ids[0].tolist() == tokenizer.encode(demonstration, add_special_tokens=False)
    tool_tokens = tokenizer.encode("<|tool|>1024<|end|><|assistant|>", add_special_tokens=False)
    assert rollouts.model_token_mask[0].tolist().count(0) == len(tool_tokens)
    assert tools.last_stats.calls == [1] and tools.last_stats.turns == [2]
    assert torch.equal(rollouts.response_mask, torch.ones_like(rollouts.response_mask))
