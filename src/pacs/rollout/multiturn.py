"""Multi-turn rollouts: the model writes a tool call, the tool's output is appended to its response,
and the model goes on (`rollout.tools`, `rollout.max_turns`, `rollout.tool_format`; docs/tools.md).

A `ToolFormat` says where a turn makes a call and which tokens carry the tool's output back; the
engine's loop (`ToolCallingEngine`) is the same for both formats.

`tir` (`TirFormat`) is Qwen2.5-Math's tool-integrated reasoning (`TIR_CALL`): the model writes a
Python block

    ```python
    print(12345 * 6789)
    ```

and a turn ends at the first token that completes the block's closing fence. The program between
the fences runs in the tool (`pacs.rollout.tools`), and its output is appended as

    ```output
    83810205
    ```

(`output_block`: the tool's text without its trailing newlines, after a newline if the model's turn
did not end with one, and followed by one).

`chat` (`ChatFormat`) is the chat template's tool calls, as Hermes and Qwen2.5-Instruct write them:
the model writes

    <tool_call>{"name": "python", "arguments": {"code": "print(12345 * 6789)"}}</tool_call>

and ends its turn with its end-of-sequence token; the output is appended as the tokenizer's own chat
template renders a ``{"role": "tool"}`` message and the generation prompt after it (`ChatFormat`).

The model then generates its next turn from the whole trajectory, until it ends the response (an
end-of-sequence token ending a turn without a call), the response reaches `max_new_tokens`
(`data.max_response_length`: model and tool tokens together; a tool output that would pass it is
cut there), or it has had `max_turns` turns: the last one is not stopped at a call and makes none.

Trajectories are token ids end to end: each turn's tokens are the ones the model sampled, kept as
they are (never decoded and encoded again, which could change what the trainer scores), and each
tool output is tokenised once and marked 0 in `Rollouts.model_token_mask`, so that no algorithm
scores it (`pacs.train.batch.PolicyBatch.loss_mask`). Cutting a turn at its call (a fence, an
end-of-sequence token), or at the length limit, decides from the tokens sampled so far only, so
the kept tokens are exactly the policy's samples; the tokens sampled after the cut are dropped.
Every turn but the last asks the engine to stop a row at its call (`SamplingParams.stop`, the
format's `ToolFormat.turn_stop`: TIR's fence, `TirFormat.call_completed`), so that the tokens after
it are not sampled at all where the engine applies it (the transformers engine without continuous
batching; elsewhere they are sampled and dropped); the cut stays here, so the kept tokens are the
same either way. The chat format needs no such check: its turn ends at the end-of-sequence token,
where every engine stops already.

Any engine generates the turns: the transformers engine, or vLLM's (`rollout.engine=vllm`), whose
weights the trainer pushes through the wrapper as into a bare engine. Asked for the sampler's
log-probs (`SamplingParams.return_logprobs`, which training asks a vLLM engine for), each model
token keeps the log-prob its turn's sampler reported, from the context it was sampled in (the
prompt, the earlier turns and the tool's outputs): the context the trainer scores it in.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import torch

from pacs.config.sections import RolloutConfig
from pacs.plugins import PYTHON_TOOL
from pacs.rollout.base import RolloutEngine, Rollouts, SamplingParams, pad_rows, rollouts_from_rows
from pacs.rollout.tools import ToolOutput, ToolRunner

TIR_CALL = re.compile(r"```python\n(.*?)```", re.DOTALL)
"""A completed tool call of the TIR format; group 1 is the program."""
FENCE = "```"


def output_block(turn_text: str, output: str) -> str:
    """The text appended after a turn whose text is `turn_text` and whose program printed `output`:
    ``"```output\\n{output without trailing newlines}\\n```\\n"``, after a newline when the turn
    did not end with one."""
    separator = "" if turn_text.endswith("\n") else "\n"
    return f"{separator}```output\n{output.rstrip(chr(10))}\n```\n"


TOOL_OUTPUT_SLOT = "\x00pacs-tool-output\x00"
"""Stands in a format's text for the tool's output, to find the text around it."""


def tool_output_ids(tokenizer, markers: re.Pattern | None, before: str, output: str, after: str) -> list[int]:
    """The token ids of ``before + output + after``, the text a format appends, where `output`, the
    tool's, is data, never structure: a special or added token's text in it (``<|im_end|>``,
    ``<tool_call>``) is tokenised as the characters it is made of, so that a program cannot write
    a turn, a role or a call into the context. An output without such text is tokenised with the
    rest as one text, as the chat template's own tokenisation would. `markers`: the tokenizer's
    `token_markers`, found once per format."""
    if markers is None or not markers.search(output):
        return tokenizer.encode(before + output + after, add_special_tokens=False)
    return [
        *tokenizer.encode(before, add_special_tokens=False),
        *_plain_text_ids(tokenizer, output, markers),
        *tokenizer.encode(after, add_special_tokens=False),
    ]


def token_markers(tokenizer) -> re.Pattern | None:
    """A pattern of the texts of the tokenizer's special and added tokens, longest first (None: it has none)."""
    texts = sorted({text for text in tokenizer.get_added_vocab() if text}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, texts))) if texts else None


def _plain_text_ids(tokenizer, text: str, markers: re.Pattern) -> list[int]:
    """`text`'s token ids with every token marker in it split after its first character, so that
    none is matched as its token."""
    ids: list[int] = []
    start = 0
    for match in markers.finditer(text):
        ids += tokenizer.encode(text[start : match.start()], add_special_tokens=False, split_special_tokens=True)
        marker = match.group()
        ids += tokenizer.encode(marker[0], add_special_tokens=False, split_special_tokens=True)
        ids += _plain_text_ids(tokenizer, marker[1:], markers)
        start = match.end()
    return ids + tokenizer.encode(text[start:], add_special_tokens=False, split_special_tokens=True)


def tool_call_end(token_ids: Sequence[int], tokenizer) -> tuple[int, str] | None:
    """(k, program): the first k tokens of a turn's `token_ids` run through the token that
    completes the closing fence of its first python block, and that block's program; None when no
    block closes. Only a token whose vocabulary string holds a backtick can complete a fence (a
    backtick is itself in byte-level BPE and SentencePiece vocabularies), so the turn's prefix is
    decoded, whole, at those tokens only."""
    pieces = tokenizer.convert_ids_to_tokens(list(token_ids))
    for position, piece in enumerate(pieces):
        if piece is not None and "`" in piece:
            match = TIR_CALL.search(tokenizer.decode(list(token_ids[: position + 1])))
            if match:
                return position + 1, match.group(1)
    return None


CHAT_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
"""A completed tool call of the chat format; group 1 is the call's JSON."""
CALL_ERROR = "ToolCallError"
"""The name a malformed chat call's output starts with (`ChatFormat.parsed`)."""
TEMPLATE_PROBE = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "X"}]
"""The conversation `ChatFormat` renders to find what its template puts around a tool message."""


@dataclass(frozen=True)
class ToolCall:
    """A call a turn makes: `text`, what the tool runs on (TIR: the program; chat: `arguments.code`
    for python, the arguments object as JSON text for a user's tool); or, for a malformed call,
    `error`, the text the model reads back instead of an output (the tool does not run)."""

    text: str
    error: str | None = None


class ToolFormat(Protocol):
    """Where a turn calls the tool and which tokens carry the output back (`TirFormat`, `ChatFormat`)."""

    def call_in(self, turn_token_ids: Sequence[int]) -> tuple[int, ToolCall] | None:
        """(k, call): the turn's first k tokens stay in the response and `call` is made; None: the
        turn makes no call (it ends the response)."""
        ...

    def output_tokens(self, response_token_ids: Sequence[int], output: str) -> list[int]:
        """The token ids appended for the tool's output text `output` after `response_token_ids`,
        the response so far (it ends with the turn that made the call)."""
        ...

    @property
    def turn_stop(self) -> Callable[[Sequence[int]], bool] | None:
        """The check that ends a turn's generation at its call (`SamplingParams.stop`): True on
        the turn's tokens so far exactly when `call_in` of them first finds a call ending at their
        newest token; None where the engine stops there already (at an end-of-sequence token)."""
        ...


class TirFormat:
    """`rollout.tool_format: tir`, Qwen2.5-Math's python blocks (module docstring): a turn is cut at
    the token that closes its first block (`tool_call_end`), and the output block is appended
    (`output_block`)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.markers = token_markers(tokenizer)

    def call_in(self, turn_token_ids: Sequence[int]) -> tuple[int, ToolCall] | None:
        call = tool_call_end(turn_token_ids, self.tokenizer)
        return None if call is None else (call[0], ToolCall(call[1]))

    def output_tokens(self, response_token_ids: Sequence[int], output: str) -> list[int]:
        last_token = self.tokenizer.decode(list(response_token_ids[-1:]))
        before, after = output_block(last_token, TOOL_OUTPUT_SLOT).split(TOOL_OUTPUT_SLOT)
        return tool_output_ids(self.tokenizer, self.markers, before, output.rstrip("\n"), after)

    def call_completed(self, turn_token_ids: Sequence[int]) -> bool:
        """Whether the turn's tokens so far hold a closed python block (`tool_call_end`), asked
        only when the newest token's vocabulary string holds a backtick, the only token that can
        complete a fence: asked after each token, it is first true at the token `call_in` cuts at."""
        if not turn_token_ids:
            return False
        piece = self.tokenizer.convert_ids_to_tokens(int(turn_token_ids[-1]))
        return piece is not None and "`" in piece and tool_call_end(turn_token_ids, self.tokenizer) is not None

    @property
    def turn_stop(self) -> Callable[[Sequence[int]], bool]:
        return self.call_completed


class ChatFormat:
    """`rollout.tool_format: chat`, the chat template's tool calls (docs/tools.md).

    A turn makes a call when its last token is the tokenizer's end-of-sequence token and its other
    tokens, decoded (special tokens kept), hold ``<tool_call>JSON</tool_call>``: the first such,
    parsed by `parsed`. The whole turn stays, its end-of-sequence token included, as the model
    sampled it. The tool's output OUTPUT (its text without trailing newlines) is appended as the
    text the tokenizer's chat template puts after the model's end-of-sequence token, tokenised once:

        prefix   = template([user, assistant])
        full     = template([user, assistant, {"role": "tool", "content": OUTPUT}], add_generation_prompt=True)
        appended = (prefix after its last end-of-sequence text) + full[len(prefix):]

    so that a trajectory reads as the template renders the conversation of its turns. `tool` is
    `rollout.tools`: a call must name ``python`` for the built-in tool, the function's name for
    ``package.module:function``. ValueError, naming the tokenizer, when its template does not end
    an assistant message with the end-of-sequence token or renders no tool message after it.
    """

    def __init__(self, tokenizer, tool: str):
        self.tokenizer = tokenizer
        self.markers = token_markers(tokenizer)
        self.tool_name = tool if tool == PYTHON_TOOL else tool.rpartition(":")[2]
        arguments = '{"code": "print(1 + 1)"}' if tool == PYTHON_TOOL else "{...}"
        self.example = f'<tool_call>{{"name": "{self.tool_name}", "arguments": {arguments}}}</tool_call>'
        """A well-formed call, for the errors a malformed one reads."""
        self.end_id = tokenizer.eos_token_id
        prefix = self._render(TEMPLATE_PROBE, add_generation_prompt=False)
        end_at = -1 if tokenizer.eos_token is None else prefix.rfind(tokenizer.eos_token)
        if end_at < prefix.rfind(TEMPLATE_PROBE[-1]["content"]):
            raise ValueError(
                f"rollout.tool_format=chat: the chat template of {tokenizer.name_or_path!r} does not end an assistant "
                f"message with the end-of-sequence token {tokenizer.eos_token!r} (it renders {prefix!r}); the chat "
                "format ends a turn there: use rollout.tool_format=tir, or a tokenizer whose template does"
            )
        self._prefix, self._after_end = prefix, prefix[end_at + len(tokenizer.eos_token) :]
        around = self.output_text(TOOL_OUTPUT_SLOT).split(TOOL_OUTPUT_SLOT)  # fails here for a template with no tool message
        if len(around) != 2:
            raise ValueError(
                f"rollout.tool_format=chat: the chat template of {tokenizer.name_or_path!r} does not render a tool "
                "message's content as it is, so the tool's output cannot be kept as plain text: use rollout.tool_format=tir"
            )
        self._around_output = (around[0], around[1])
        """The text the template puts before and after a tool message's content."""

    def _render(self, messages: list[dict], *, add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        except Exception as error:  # no template, or one that refuses these messages: both are the tokenizer's
            raise ValueError(
                f"rollout.tool_format=chat: the chat template of {self.tokenizer.name_or_path!r} cannot render "
                f"{[message['role'] for message in messages]} ({type(error).__name__}: {error}); use "
                "rollout.tool_format=tir, or a tokenizer whose template renders a tool message"
            ) from None

    def output_text(self, output: str) -> str:
        """The text appended for the tool's output text `output` (class docstring)."""
        tool_message = {"role": "tool", "content": output.rstrip("\n")}
        full = self._render([*TEMPLATE_PROBE, tool_message], add_generation_prompt=True)
        if not full.startswith(self._prefix):
            raise ValueError(
                f"rollout.tool_format=chat: the chat template of {self.tokenizer.name_or_path!r} renders the "
                f"conversation before a tool message differently ({full!r} does not start with {self._prefix!r}), "
                "so the tool's output cannot be appended to the turns: use rollout.tool_format=tir"
            )
        return self._after_end + full[len(self._prefix) :]

    def call_in(self, turn_token_ids: Sequence[int]) -> tuple[int, ToolCall] | None:
        if not turn_token_ids or turn_token_ids[-1] != self.end_id:
            return None
        text = self.tokenizer.decode(list(turn_token_ids[:-1]), clean_up_tokenization_spaces=False)
        match = CHAT_CALL.search(text)
        return None if match is None else (len(turn_token_ids), self.parsed(match.group(1)))

    def parsed(self, call_json: str) -> ToolCall:
        """The call written `call_json` (`{"name": NAME, "arguments": {...}}`): `arguments.code` for
        the python tool, the arguments object as JSON text for a user's tool; a malformed call's
        error (`CALL_ERROR`) otherwise."""
        try:
            call = json.loads(call_json)
        except json.JSONDecodeError as error:
            return ToolCall("", f"{CALL_ERROR}: the call is not valid JSON ({error}); write {self.example}")
        if not isinstance(call, dict) or not isinstance(call.get("arguments"), dict):
            return ToolCall("", f"{CALL_ERROR}: the call must be a JSON object with an object of arguments, as {self.example}")
        if call.get("name") != self.tool_name:
            return ToolCall("", f"{CALL_ERROR}: the call names the tool {call.get('name')!r}; the tool is {self.tool_name!r}")
        arguments = call["arguments"]
        if self.tool_name != PYTHON_TOOL:
            return ToolCall(json.dumps(arguments, ensure_ascii=False))
        if not isinstance(arguments.get("code"), str):
            return ToolCall("", f"{CALL_ERROR}: the python tool's arguments must hold the program as a string, as {self.example}")
        return ToolCall(arguments["code"])

    def output_tokens(self, response_token_ids: Sequence[int], output: str) -> list[int]:
        before, after = self._around_output
        return tool_output_ids(self.tokenizer, self.markers, before, output.rstrip("\n"), after)

    turn_stop = None
    """No check: a turn that calls ends at the end-of-sequence token, where generation stops already."""


@dataclass
class ToolStats:
    """Per response of one or more `generate` calls: tool calls, calls whose output is an error
    (an exception, a time-out, a crash) and turns; and the seconds spent running the tool."""

    calls: list[int] = field(default_factory=list)
    errors: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    tool_seconds: float = 0.0

    def __add__(self, other: ToolStats) -> ToolStats:
        return ToolStats(
            self.calls + other.calls, self.errors + other.errors, self.turns + other.turns, self.tool_seconds + other.tool_seconds
        )


def tool_metrics(stats: ToolStats, sum_over_ranks: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, float]:
    """The responses' tool use over every process (`sum_over_ranks` sums a tensor over them):

    rollout/tool_calls_mean       = Σ calls / responses
    rollout/tool_errors_fraction  = Σ failed calls / max(Σ calls, 1)
    rollout/turns_mean            = Σ turns / responses
    """
    calls, errors, turns, responses = sum_over_ranks(
        torch.tensor([sum(stats.calls), sum(stats.errors), sum(stats.turns), len(stats.calls)], dtype=torch.float64)
    ).tolist()
    responses = max(responses, 1.0)
    return {
        "rollout/tool_calls_mean": calls / responses,
        "rollout/tool_errors_fraction": errors / max(calls, 1.0),
        "rollout/turns_mean": turns / responses,
    }


@dataclass
class _Trajectory:
    """One response being generated: its tokens so far, 1 where the model sampled them, and (when
    the sampler's log-probs are asked for) one log-prob per token recorded so far (`add_logprobs`)."""

    prompt: list[int]
    response: list[int] = field(default_factory=list)
    model_tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    calls: int = 0
    errors: int = 0
    turns: int = 0
    done: bool = False

    def extend(self, token_ids: Sequence[int], *, by_model: bool) -> None:
        self.response.extend(token_ids)
        self.model_tokens.extend([int(by_model)] * len(token_ids))

    def add_logprobs(self, turn_logprobs: Sequence[float]) -> None:
        """The log-probs of the tokens added since the last call (one turn: the model's tokens,
        then whatever was appended after them): the model's tokens, the first of the turn's sampled
        tokens, take the sampler's `turn_logprobs` in order; every other token takes 0.0, a value no
        one reads: its `model_token_mask` 0 keeps it out of every sum over log-probs (the trainer's
        `PolicyBatch.loss_mask`, the sampler checks and the correction)."""
        sampled = iter(turn_logprobs)
        self.logprobs.extend(next(sampled) if by_model else 0.0 for by_model in self.model_tokens[len(self.logprobs) :])


class ToolCallingEngine:
    """A `RolloutEngine` whose responses call a tool (module docstring): `engine` generates each
    turn (the transformers engine, or vLLM's with its own weights, which `load_weights` and `sleep`
    reach), `tools` runs the calls, at most `max_turns` turns per response, written in
    `tool_format` (None: `TirFormat`). `take_stats` gives the tool use of the `generate` calls since
    it was last called."""

    def __init__(
        self, engine: RolloutEngine, tokenizer, tools: ToolRunner, *, max_turns: int, tool_format: ToolFormat | None = None
    ):
        self.engine, self.tokenizer, self.tools, self.max_turns = engine, tokenizer, tools, max_turns
        self.holds_own_weights = engine.holds_own_weights
        """`engine`'s: the trainer pushes the weights into a wrapped vLLM engine as into a bare one."""
        self.format = TirFormat(tokenizer) if tool_format is None else tool_format
        self.last_stats = ToolStats()
        """The latest `generate`'s tool use."""
        self._untaken = ToolStats()

    def take_stats(self) -> ToolStats:
        """The tool use of every `generate` since the last `take_stats`."""
        stats, self._untaken = self._untaken, ToolStats()
        return stats

    @property
    def has_weights(self) -> bool:
        return self.engine.has_weights

    def generate(self, prompt_token_ids: Sequence[Sequence[int]], params: SamplingParams) -> Rollouts:
        """`params.n` multi-turn responses per prompt, grouped as `RolloutEngine.generate`'s, with
        `Rollouts.model_token_mask` marking the tool's outputs; `params.max_new_tokens` bounds each
        whole response. With `params.return_logprobs`, `Rollouts.response_logprobs` holds the
        sampler's log-prob of each model token, as `engine` reported it in that token's turn, and
        0.0 at the tool's tokens (ignored: `_Trajectory.add_logprobs`)."""
        trajectories = [_Trajectory(list(prompt)) for prompt in prompt_token_ids for _ in range(params.n)]
        tool_seconds = 0.0
        first = self.engine.generate(prompt_token_ids, replace(params, stop=self._stop(turn=1)))
        logprob_dtype = None if first.response_logprobs is None else first.response_logprobs.dtype
        new_tokens, new_logprobs = _response_rows(first)
        active = list(range(len(trajectories)))
        while active:
            calls = self._take_turn([trajectories[i] for i in active], new_tokens, params.max_new_tokens)
            started = time.perf_counter()
            outputs = self._run(calls)
            tool_seconds += time.perf_counter() - started
            for (trajectory, _), output in zip(calls, outputs):
                self._append_output(trajectory, output, params.max_new_tokens)
            if logprob_dtype is not None:
                for i, turn_logprobs in zip(active, new_logprobs):
                    trajectories[i].add_logprobs(turn_logprobs)
            active = [i for i in active if not trajectories[i].done]
            if active:
                contexts = [trajectories[i].prompt + trajectories[i].response for i in active]
                budget = max(params.max_new_tokens - len(trajectories[i].response) for i in active)
                turn_params = replace(params, n=1, max_new_tokens=budget, stop=self._stop(trajectories[active[0]].turns + 1))
                new_tokens, new_logprobs = _response_rows(self.engine.generate(contexts, turn_params))
        self.last_stats = ToolStats(
            calls=[t.calls for t in trajectories],
            errors=[t.errors for t in trajectories],
            turns=[t.turns for t in trajectories],
            tool_seconds=tool_seconds,
        )
        self._untaken = self._untaken + self.last_stats
        rollouts = rollouts_from_rows(
            [torch.tensor(t.prompt, dtype=torch.long) for t in trajectories],
            [torch.tensor(t.response, dtype=torch.long) for t in trajectories],
            None if logprob_dtype is None else [torch.tensor(t.logprobs, dtype=logprob_dtype) for t in trajectories],
            self.tokenizer,
            params.n,
        )
        model_tokens = pad_rows([torch.tensor(t.model_tokens, dtype=torch.long) for t in trajectories], 0, left=False)
        return replace(rollouts, model_token_mask=model_tokens, answer_texts=[self._final_turn_text(t) for t in trajectories])

    def _final_turn_text(self, trajectory: _Trajectory) -> str:
        """The text a reward scores: the model's own last turn, the tokens it sampled after the
        last tool output (decoded, special tokens removed); empty for a response that ends in a
        tool output (cut at the length limit: the model never answered). Never a tool's text, so a
        program that prints an answer does not earn its reward."""
        last_tool_token = max((i for i, by_model in enumerate(trajectory.model_tokens) if not by_model), default=-1)
        return self.tokenizer.decode(trajectory.response[last_tool_token + 1 :], skip_special_tokens=True)

    def _stop(self, turn: int) -> Callable[[Sequence[int]], bool] | None:
        """`SamplingParams.stop` for turn `turn` (from 1) of every active trajectory (they all take
        their turns together): the format's `turn_stop`, or None for the last turn, which makes no call."""
        return self.format.turn_stop if turn < self.max_turns else None

    def _take_turn(
        self, trajectories: list[_Trajectory], new_tokens: list[list[int]], max_length: int
    ) -> list[tuple[_Trajectory, ToolCall]]:
        """Add each trajectory's new turn (cut where it makes its call, `ToolFormat.call_in`, unless it
        is the last turn, and at the length limit); the (trajectory, call) of each call to make. A
        trajectory that made no call is done."""
        calls = []
        for trajectory, tokens in zip(trajectories, new_tokens):
            tokens = tokens[: max_length - len(trajectory.response)]
            trajectory.turns += 1
            call = self.format.call_in(tokens) if trajectory.turns < self.max_turns else None
            if call is None:
                trajectory.extend(tokens, by_model=True)
                trajectory.done = True
                continue
            end, tool_call = call
            trajectory.extend(tokens[:end], by_model=True)
            calls.append((trajectory, tool_call))
        return calls

    def _run(self, calls: list[tuple[_Trajectory, ToolCall]]) -> list[ToolOutput]:
        """Each call's output, in order: the tool's, all well-formed calls run together, or a
        malformed call's error (a failed output; the tool does not run)."""
        ran = iter(self.tools.run([call.text for _, call in calls if call.error is None]))
        return [next(ran) if call.error is None else ToolOutput(call.error, failed=True) for _, call in calls]

    def _append_output(self, trajectory: _Trajectory, output: ToolOutput, max_length: int) -> None:
        """The tool's output as the format appends it, tokenised once, cut at the length limit
        (which ends the response)."""
        trajectory.calls += 1
        trajectory.errors += int(output.failed)
        block = self.format.output_tokens(trajectory.response, output.text)
        room = max_length - len(trajectory.response)
        trajectory.extend(block[:room], by_model=False)
        trajectory.done = len(block) >= room

    def load_weights(self, weights) -> None:
        self.engine.load_weights(weights)

    def sleep(self) -> None:
        self.engine.sleep()

    def close(self) -> None:
        """Close the engine and stop the tool's workers."""
        self.tools.close()
        self.engine.close()


TOOL_SETTINGS = (
    "tools",
    "tool_format",
    "max_turns",
    "tool_timeout_s",
    "tool_max_output_chars",
    "tool_workers",
    "tool_memory_limit_mib",
    "tool_sandbox",
)
"""The `RolloutConfig` fields that decide how a response calls tools (`tool_settings`)."""


def tool_settings(rollout: RolloutConfig) -> dict | None:
    """`rollout`'s `TOOL_SETTINGS` (plain values, for `pacs eval`'s recorded settings); None without
    `rollout.tools`."""
    return None if rollout.tools is None else {name: getattr(rollout, name) for name in TOOL_SETTINGS}


def tool_format_of(rollout: RolloutConfig, tokenizer) -> ToolFormat:
    """`rollout.tool_format` for `tokenizer` and `rollout.tools`; ValueError naming the fix when the
    tokenizer's chat template cannot carry the chat format (`ChatFormat`), which training and
    `pacs eval` call once the tokenizer is read, before the model loads."""
    if rollout.tool_format == "chat" and rollout.tools is not None:
        return ChatFormat(tokenizer, rollout.tools)
    return TirFormat(tokenizer)


def with_tools(engine: RolloutEngine, tokenizer, rollout: RolloutConfig) -> RolloutEngine:
    """The engine training and evaluation generate with: `engine` calling `rollout.tools` in
    `rollout.tool_format` with `rollout`'s limits (`ToolCallingEngine`), or `engine` itself without
    `rollout.tools`. ValueError before the tool's workers start when the tokenizer's chat template
    cannot carry the chat format (`ChatFormat`)."""
    if rollout.tools is None:
        return engine
    tool_format = tool_format_of(rollout, tokenizer)
    if rollout.tools == PYTHON_TOOL and rollout.tool_sandbox == "none":
        print(
            "pacs: rollout.tool_sandbox=none: the model's programs run without namespaces and can read what this "
            "user can (docs/tools.md, 'The sandbox')",
            file=sys.stderr,
        )
    tools = ToolRunner(
        rollout.tools,
        num_workers=rollout.tool_workers,
        timeout_s=rollout.tool_timeout_s,
        memory_limit_mib=rollout.tool_memory_limit_mib,
        max_output_chars=rollout.tool_max_output_chars,
        sandbox=rollout.tool_sandbox,
    )
    return ToolCallingEngine(engine, tokenizer, tools, max_turns=rollout.max_turns, tool_format=tool_format)


def trajectory_turns(rollouts: Rollouts, row: int, tokenizer) -> list[dict[str, str]]:
    """Row `row`'s response for a person to read, in order: {"model": text} for each stretch of the
    model's tokens and {"tool": text} for each tool output (`Rollouts.model_token_mask`), special
    tokens removed; one model turn for a response without tool tokens."""
    length = int(rollouts.response_mask[row].sum())
    tokens = rollouts.response_ids[row, :length].tolist()
    by_model = [1] * length if rollouts.model_token_mask is None else rollouts.model_token_mask[row, :length].tolist()
    turns = []
    start = 0
    for end in range(1, length + 1):
        if end == length or by_model[end] != by_model[start]:
            who = "model" if by_model[start] else "tool"
            turns.append({who: tokenizer.decode(tokens[start:end], skip_special_tokens=True)})
            start = end
    return turns


def _response_rows(rollouts: Rollouts) -> tuple[list[list[int]], list[list[float]]]:
    """Each row's generated tokens, without padding, and their sampler log-probs (Python floats,
    which hold a float64's value exactly; empty rows without `Rollouts.response_logprobs`)."""
    lengths = [int(length) for length in rollouts.response_mask.sum(dim=1).tolist()]
    tokens = [rollouts.response_ids[row, :length].tolist() for row, length in enumerate(lengths)]
    if rollouts.response_logprobs is None:
        return tokens, [[] for _ in lengths]
    return tokens, [rollouts.response_logprobs[row, :length].tolist() for row, length in enumerate(lengths)]
