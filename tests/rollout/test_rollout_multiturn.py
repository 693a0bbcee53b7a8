"""Specification of multi-turn rollouts in Qwen2.5-Math's tool-integrated format
(`pacs.rollout.multiturn`): turns cut at a python block's closing fence, the tool's output appended
as tokens marked 0, the model's own tokens kept as sampled, the turn and length limits."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from scripted_engines import ScriptedEngine
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from pacs.rollout import multiturn
from pacs.rollout.base import Rollouts, SamplingParams, rollouts_from_rows
from pacs.rollout.hf import TransformersEngine
from pacs.rollout.multiturn import ToolCallingEngine, output_block, tool_call_end, trajectory_turns
from pacs.rollout.tools import PYTHON_TOOL, ToolRunner
from pacs.train.batch import PolicyBatch
from pacs.train.logprobs import response_logprobs

END = "<|end|>"
CORPUS = ["Let me compute.\n```python\nprint(6 * 7)\n```\n```output\n42\n```\nThe answer is 42.", "x = 12345 * 6789\n"]


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE tokenizer with multi-character tokens ("```", "python", " me")."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    backend.train_from_iterator(
        CORPUS * 20, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|pad|>", END], initial_alphabet=alphabet)
    )
    return transformers.PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=END, pad_token="<|pad|>")


@pytest.fixture(scope="module")
def python_tool():
    with ToolRunner(PYTHON_TOOL, num_workers=1, timeout_s=2.0, memory_limit_mib=512, max_output_chars=100) as runner:
        yield runner


def encoded(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_call_is_cut_at_its_closing_fence_and_the_output_is_appended_as_tool_tokens(tokenizer, python_tool):
    first = "Let me compute.\n```python\nprint(6 * 7)\n```\n```output\n41\n```\nlater text"
    engine = ScriptedEngine(tokenizer, [[first], ["The answer is 42." + END]])
    rollouts = ToolCallingEngine(engine, tokenizer, python_tool, max_turns=4).generate(
        [encoded(tokenizer, "Q:")], SamplingParams(max_new_tokens=200)
    )
    turn = encoded(tokenizer, first)[: len(encoded(tokenizer, "Let me compute.\n```python\nprint(6 * 7)\n```"))]
    block = encoded(tokenizer, "\n```output\n42\n```\n")
    answer = encoded(tokenizer, "The answer is 42." + END)
    assert rollouts.response_ids[0].tolist() == turn + block + answer
    assert rollouts.model_token_mask[0].tolist() == [1] * len(turn) + [0] * len(block) + [1] * len(answer)
    assert engine.prompts[1] == [encoded(tokenizer, "Q:") + turn + block]
    assert rollouts.answer_texts == ["The answer is 42."]  # what the reward scores: the model's last turn


def test_a_trace_gives_the_models_turns_and_the_tools_outputs_in_order(tokenizer, python_tool):
    engine = ScriptedEngine(
        tokenizer, [["```python\nprint(6 * 7)\n```", "```python\nprint(1 / 0)\n```"], ["Done." + END, "Oops." + END]]
    )
    rollouts = ToolCallingEngine(engine, tokenizer, python_tool, max_turns=4).generate(
        [encoded(tokenizer, "Q:")], SamplingParams(max_new_tokens=200, n=2)
    )
    assert trajectory_turns(rollouts, 0, tokenizer) == [
        {"model": "```python\nprint(6 * 7)\n```"},
        {"tool": "\n```output\n42\n```\n"},
        {"model": "Done."},
    ]
    assert trajectory_turns(rollouts, 1, tokenizer)[1] == {"tool": "\n```output\nZeroDivisionError: division by zero\n```\n"}


def test_a_single_turn_response_traces_as_one_model_turn(tokenizer):
    rollouts = rollouts_from_rows(
        [torch.tensor(encoded(tokenizer, "Q:"))],
        [torch.tensor(encoded(tokenizer, "The answer is 42." + END))],
        None,
        tokenizer,
        1,
    )
    assert trajectory_turns(rollouts, 0, tokenizer) == [{"model": "The answer is 42."}]


def test_the_models_tokens_are_kept_as_sampled_not_encoded_again(tokenizer, python_tool):
    """ "```" sampled as three "`" tokens stays three tokens, though encoding the text gives one."""
    backtick = encoded(tokenizer, "`")
    assert len(backtick) == 1 and len(encoded(tokenizer, "```")) == 1
    sampled = encoded(tokenizer, "```python\nprint(1)\n") + backtick * 3 + encoded(tokenizer, END)

    class SampledEngine(ScriptedEngine):
        def generate(self, prompt_token_ids, params):
            self.prompts.append(prompt_token_ids)
            row = sampled if len(self.prompts) == 1 else encoded(self.tokenizer, END)
            return rollouts_from_rows([torch.tensor(prompt_token_ids[0])], [torch.tensor(row)], None, self.tokenizer, 1)

    rollouts = ToolCallingEngine(SampledEngine(tokenizer, []), tokenizer, python_tool, max_turns=4).generate(
        [encoded(tokenizer, "Q:")], SamplingParams(max_new_tokens=200)
    )
    turn_length = len(sampled) - 1
    assert rollouts.response_ids[0, :turn_length].tolist() == sampled[:-1]
    assert trajectory_turns(rollouts, 0, tokenizer)[1] == {"tool": "\n```output\n1\n```\n"}


def test_every_row_of_a_group_takes_its_own_turns_and_errors_are_counted(tokenizer, python_tool):
    turns = [
        ["```python\nprint(1 / 0)\n```", "No tool." + END, "```python\nprint(2)\n```"],
        ["```python\nprint(3)\n```", "Two." + END],
        ["Three." + END],
    ]
    engine = ToolCallingEngine(ScriptedEngine(tokenizer, turns), tokenizer, python_tool, max_turns=4)
    rollouts = engine.generate([encoded(tokenizer, "Q:")], SamplingParams(n=3, max_new_tokens=200))
    assert [turn for turn in trajectory_turns(rollouts, 0, tokenizer) if "tool" in turn] == [
        {"tool": "\n```output\nZeroDivisionError: division by zero\n```\n"},
        {"tool": "\n```output\n3\n```\n"},
    ]
    assert rollouts.answer_texts == ["Three.", "No tool.", "Two."]
    assert (engine.last_stats.calls, engine.last_stats.errors, engine.last_stats.turns) == ([2, 0, 1], [1, 0, 0], [3, 1, 2])
    assert rollouts.model_token_mask.shape == rollouts.response_mask.shape
    assert rollouts.model_token_mask[1].tolist() == rollouts.response_mask[1].tolist()


def test_the_last_turn_is_not_stopped_at_a_block_and_its_block_is_not_run(tokenizer, python_tool):
    turns = [["```python\nprint(1)\n```"], ["```python\nprint(2)\n```\nDone." + END]]
    engine = ToolCallingEngine(ScriptedEngine(tokenizer, turns), tokenizer, python_tool, max_turns=2)
    rollouts = engine.generate([encoded(tokenizer, "Q:")], SamplingParams(max_new_tokens=200))
    assert rollouts.answer_texts == ["```python\nprint(2)\n```\nDone."]
    assert engine.last_stats.calls == [1] and engine.last_stats.turns == [2]


def test_a_tool_output_past_the_length_limit_is_cut_there_and_ends_the_response(tokenizer, python_tool):
    call = "```python\nprint('a' * 50)\n```"
    engine = ScriptedEngine(tokenizer, [[call]])
    limit = len(encoded(tokenizer, call)) + 10
    rollouts = ToolCallingEngine(engine, tokenizer, python_tool, max_turns=4).generate(
        [encoded(tokenizer, "Q:")], SamplingParams(max_new_tokens=limit)
    )
    assert rollouts.response_ids.shape[1] == limit and len(engine.prompts) == 1
    assert rollouts.model_token_mask[0, -10:].tolist() == [0] * 10


def test_a_turn_ends_at_the_token_that_completes_the_first_closing_fence(tokenizer):
    ids = encoded(tokenizer, "a\n```python\nx = 1\n```\n```python\ny\n```")
    end, program = tool_call_end(ids, tokenizer)
    assert tokenizer.decode(ids[:end]) == "a\n```python\nx = 1\n```"
    assert program == "x = 1\n"
    assert tool_call_end(encoded(tokenizer, "```python\nx = 1\n``"), tokenizer) is None


def test_a_tir_turn_is_stopped_at_the_token_that_completes_its_first_closing_fence(tokenizer):
    """`TirFormat.turn_stop`, asked after each token, is first true at the token `call_in` cuts at."""
    ids = encoded(tokenizer, CORPUS[0])
    end, _ = tool_call_end(ids, tokenizer)
    stop = multiturn.TirFormat(tokenizer).turn_stop
    assert [stop(ids[:length]) for length in range(1, end + 1)] == [False] * (end - 1) + [True]


def test_the_chat_format_asks_for_no_stop_its_turn_ends_at_the_end_of_sequence_token(tokenizer):
    assert multiturn.ChatFormat.turn_stop is None


def test_the_output_block_strings():
    assert output_block("```", "42\n") == "\n```output\n42\n```\n"
    assert output_block("```\n", "a\nb\n\n") == "```output\na\nb\n```\n"


def test_with_no_call_the_transformers_engine_gives_the_single_turn_rollouts(tiny_model_dir, python_tool):
    from pacs.models.loading import load_causal_lm, load_tokenizer

    model, tiny_tokenizer = load_causal_lm(str(tiny_model_dir), dtype="float32"), load_tokenizer(str(tiny_model_dir))
    engine = TransformersEngine(model, tiny_tokenizer)
    prompts, params = [encoded(tiny_tokenizer, "12+3="), encoded(tiny_tokenizer, "7*8=")], SamplingParams(n=2, max_new_tokens=12)
    torch.manual_seed(0)
    single = engine.generate(prompts, params)
    torch.manual_seed(0)
    multi = ToolCallingEngine(engine, tiny_tokenizer, python_tool, max_turns=3).generate(prompts, params)
    assert torch.equal(multi.response_ids, single.response_ids) and multi.response_texts == single.response_texts
    assert torch.equal(multi.model_token_mask, single.response_mask)


class LogprobEngine(ScriptedEngine):
    """`ScriptedEngine` that reports, when asked, the log-prob -(c + j / 100) for the j-th token of
    every row of its c-th call (c from 1), in float64."""

    def generate(self, prompt_token_ids, params: SamplingParams) -> Rollouts:
        rollouts = super().generate(prompt_token_ids, params)
        if not params.return_logprobs:
            return rollouts
        positions = torch.arange(rollouts.response_ids.shape[1], dtype=torch.float64)
        logprobs = -(len(self.prompts) + positions / 100) * rollouts.response_mask
        return dataclasses.replace(rollouts, response_logprobs=logprobs)


def test_each_model_token_keeps_its_turns_sampler_logprob_and_tool_tokens_get_zero(tokenizer, python_tool):
    first = "Let me compute.\n```python\nprint(6 * 7)\n```\nlater text"
    engine = LogprobEngine(tokenizer, [[first], ["The answer is 42." + END]])
    rollouts = ToolCallingEngine(engine, tokenizer, python_tool, max_turns=4).generate(
        [encoded(tokenizer, "Q:")], SamplingParams(max_new_tokens=200, return_logprobs=True)
    )
    turn = len(encoded(tokenizer, "Let me compute.\n```python\nprint(6 * 7)\n```"))
    block = len(encoded(tokenizer, "\n```output\n42\n```\n"))
    answer = len(encoded(tokenizer, "The answer is 42." + END))
    expected = [-(1 + j / 100) for j in range(turn)] + [0.0] * block + [-(2 + j / 100) for j in range(answer)]
    assert rollouts.response_logprobs.dtype == torch.float64
    assert rollouts.response_logprobs[0].tolist() == expected


def test_the_sampler_logprobs_of_a_trajectorys_model_tokens_are_the_trainers_recomputation(
    tiny_model_dir, python_tool, calls_after_the_first_token
):
    """float64, temperature 0.7: the transformers engine's log-probs of every turn's tokens, each
    sampled from its own context (the prompt, the earlier turns and the tool's outputs), equal the
    trainer's recomputation over the whole trajectory within the single-turn tests' bound
    (tests/rollout/test_rollout.py)."""
    from pacs.models.loading import load_causal_lm, load_tokenizer

    model, tiny_tokenizer = load_causal_lm(str(tiny_model_dir), dtype="float64"), load_tokenizer(str(tiny_model_dir))
    engine = ToolCallingEngine(TransformersEngine(model, tiny_tokenizer), tiny_tokenizer, python_tool, max_turns=3)
    prompts = [encoded(tiny_tokenizer, "12+3="), encoded(tiny_tokenizer, "7*8=")]
    torch.manual_seed(3)
    rollouts = engine.generate(prompts, SamplingParams(n=2, temperature=0.7, max_new_tokens=40, return_logprobs=True))
    batch = PolicyBatch.from_rollouts(rollouts, torch.zeros(len(rollouts.response_texts)), torch.float64)
    with torch.no_grad():
        recomputed = response_logprobs(model, batch, temperature=0.7)
    model_tokens, tool_tokens = batch.loss_mask.bool(), (batch.response_mask - batch.loss_mask).bool()
    assert engine.last_stats.calls == [2, 2, 2, 2] and tool_tokens.any()
    assert torch.allclose(recomputed[model_tokens], rollouts.response_logprobs[model_tokens].double(), atol=1e-5)
    assert (rollouts.response_logprobs[tool_tokens] == 0).all()


class RecordingEngine:
    """Wraps an engine and keeps each `generate` call's sampling parameters and rollouts."""

    holds_own_weights = False
    has_weights = True

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompt_token_ids, params: SamplingParams) -> Rollouts:
        rollouts = self.engine.generate(prompt_token_ids, params)
        self.calls.append((params, rollouts))
        return rollouts


def call_length(ids) -> int:
    """Where the scripted calls of `calls_after_two_to_four_tokens` end: after 2 + (first token mod 3) tokens."""
    return 2 + ids[0] % 3


@pytest.fixture
def calls_after_two_to_four_tokens(monkeypatch):
    """Every turn but the last counts as a call of `print(2 ** 10)` after its first `call_length`
    tokens (the tiny model writes no python block): `tool_call_end` and the stop check replaced alike."""
    monkeypatch.setattr(
        multiturn, "tool_call_end", lambda ids, tokenizer: (call_length(ids), "print(2 ** 10)") if len(ids) >= 2 else None
    )
    monkeypatch.setattr(multiturn.TirFormat, "call_completed", lambda self, ids: len(ids) >= 2 and len(ids) >= call_length(ids))


def test_a_turn_stops_generating_at_its_call_and_keeps_the_tokens_of_a_turn_sampled_to_the_end(
    tiny_model_dir, python_tool, calls_after_two_to_four_tokens, monkeypatch
):
    """The first turn of every row, stopped at its call, keeps the tokens the same seed gives when
    the turn is sampled to `max_new_tokens` and cut afterwards (one chunk of rows: transformers
    draws every row at each step), and the engine generates only through the last row's call; every
    turn but the last is asked to stop (a response's two calls and their outputs fit its 64 tokens)."""
    from pacs.models.loading import load_causal_lm, load_tokenizer

    model, tiny_tokenizer = load_causal_lm(str(tiny_model_dir), dtype="float32"), load_tokenizer(str(tiny_model_dir))
    prompts, params = [encoded(tiny_tokenizer, "12+3="), encoded(tiny_tokenizer, "7*8=")], SamplingParams(n=3, max_new_tokens=64)

    def first_turns(engine: RecordingEngine) -> list[list[int]]:
        torch.manual_seed(11)
        rollouts = ToolCallingEngine(engine, tiny_tokenizer, python_tool, max_turns=3).generate(prompts, params)
        return [
            row[: mask.tolist().index(0)] if 0 in mask.tolist() else row
            for row, mask in zip(rollouts.response_ids.tolist(), rollouts.model_token_mask)
        ]

    stopped_engine = RecordingEngine(TransformersEngine(model, tiny_tokenizer))
    stopped = first_turns(stopped_engine)
    monkeypatch.setattr(ToolCallingEngine, "_stop", lambda self, turn: None)
    sampled_to_the_end = RecordingEngine(TransformersEngine(model, tiny_tokenizer))
    cut_afterwards = first_turns(sampled_to_the_end)
    assert stopped == cut_afterwards
    first_rollouts = stopped_engine.calls[0][1]
    assert [params.stop is not None for params, _ in stopped_engine.calls] == [True, True, False]  # the last turn makes no call
    assert first_rollouts.response_ids.shape[1] == max(len(turn) for turn in stopped) <= 4
