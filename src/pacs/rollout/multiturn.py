"""Multi-turn rollouts: the model writes a tool call, the tool's output is appended to its response,
and the model goes on (`rollout.tools`, `rollout.max_turns`; docs/tools.md).

The format is Qwen2.5-Math's tool-integrated reasoning (TIR, `TIR_CALL`): the model writes a
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
did not end with one, and followed by one). The model then generates its next turn from the whole
trajectory, until it ends the response (an end-of-sequence token), the response reaches
`max_new_tokens` (`data.max_response_length`: model and tool tokens together; a tool output that
would pass it is cut there), or it has had `max_turns` turns: the last one is not stopped at a
block's end and its blocks are not run.

Trajectories are token ids end to end: each turn's tokens are the ones the model sampled, kept as
they are (never decoded and encoded again, which could change what the trainer scores), and each
tool output is tokenised once and marked 0 in `Rollouts.model_token_mask`, so that no algorithm
scores it (`pacs.train.batch.PolicyBatch.loss_mask`). Cutting a turn at the fence, or at the
length limit, decides from the tokens sampled so far only, so the kept tokens are exactly the
policy's samples; the tokens sampled after the cut are dropped.

Any engine generates the turns: the transformers engine, or vLLM's (`rollout.engine=vllm`), whose
weights the trainer pushes through the wrapper as into a bare engine. Asked for the sampler's
log-probs (`SamplingParams.return_logprobs`, which training asks a vLLM engine for), each model
token keeps the log-prob its turn's sampler reported, from the context it was sampled in (the
prompt, the earlier turns and the tool's outputs): the context the trainer scores it in.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

from pacs.config.sections import RolloutConfig
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
    reach), `tools` runs the calls, at most `max_turns` turns per response. `take_stats` gives the
    tool use of the `generate` calls since it was last called."""

    def __init__(self, engine: RolloutEngine, tokenizer, tools: ToolRunner, *, max_turns: int):
        self.engine, self.tokenizer, self.tools, self.max_turns = engine, tokenizer, tools, max_turns
        self.holds_own_weights = engine.holds_own_weights
        """`engine`'s: the trainer pushes the weights into a wrapped vLLM engine as into a bare one."""
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
        first = self.engine.generate(prompt_token_ids, params)
        logprob_dtype = None if first.response_logprobs is None else first.response_logprobs.dtype
        new_tokens, new_logprobs = _response_rows(first)
        active = list(range(len(trajectories)))
        while active:
            calls = self._take_turn([trajectories[i] for i in active], new_tokens, params.max_new_tokens)
            started = time.perf_counter()
            outputs = self.tools.run([program for _, program in calls])
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
                turn_params = replace(params, n=1, max_new_tokens=budget)
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
        return replace(rollouts, model_token_mask=model_tokens)

    def _take_turn(
        self, trajectories: list[_Trajectory], new_tokens: list[list[int]], max_length: int
    ) -> list[tuple[_Trajectory, str]]:
        """Add each trajectory's new turn (cut at its first completed python block, unless it is
        the last turn, and at the length limit); the (trajectory, program) of each call to run.
        A trajectory that made no call is done."""
        calls = []
        for trajectory, tokens in zip(trajectories, new_tokens):
            tokens = tokens[: max_length - len(trajectory.response)]
            trajectory.turns += 1
            call = tool_call_end(tokens, self.tokenizer) if trajectory.turns < self.max_turns else None
            if call is None:
                trajectory.extend(tokens, by_model=True)
                trajectory.done = True
                continue
            end, program = call
            trajectory.extend(tokens[:end], by_model=True)
            calls.append((trajectory, program))
        return calls

    def _append_output(self, trajectory: _Trajectory, output: ToolOutput, max_length: int) -> None:
        """The tool's output block, tokenised once, cut at the length limit (which ends the response)."""
        trajectory.calls += 1
        trajectory.errors += int(output.failed)
        last_token = self.tokenizer.decode(trajectory.response[-1:])
        block = self.tokenizer.encode(output_block(last_token, output.text), add_special_tokens=False)
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


TOOL_SETTINGS = ("tools", "max_turns", "tool_timeout_s", "tool_max_output_chars", "tool_workers", "tool_memory_limit_mib")
"""The `RolloutConfig` fields that decide how a response calls tools (`tool_settings`)."""


def tool_settings(rollout: RolloutConfig) -> dict | None:
    """`rollout`'s `TOOL_SETTINGS` (plain values, for `pacs eval`'s recorded settings); None without
    `rollout.tools`."""
    return None if rollout.tools is None else {name: getattr(rollout, name) for name in TOOL_SETTINGS}


def with_tools(engine: RolloutEngine, tokenizer, rollout: RolloutConfig) -> RolloutEngine:
    """The engine training and evaluation generate with: `engine` calling `rollout.tools` with
    `rollout`'s limits (`ToolCallingEngine`), or `engine` itself without `rollout.tools`."""
    if rollout.tools is None:
        return engine
    tools = ToolRunner(
        rollout.tools,
        num_workers=rollout.tool_workers,
        timeout_s=rollout.tool_timeout_s,
        memory_limit_mib=rollout.tool_memory_limit_mib,
        max_output_chars=rollout.tool_max_output_chars,
    )
    return ToolCallingEngine(engine, tokenizer, tools, max_turns=rollout.max_turns)


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
