"""The tools a model calls during a multi-turn rollout (`pacs.rollout.multiturn`), run where they
cannot reach the trainer.

A tool is a function of one string (the model's call: a program) returning a string (what the
model reads back). `rollout.tools` names it:

- ``"python"`` (`pacs.plugins.PYTHON_TOOL`): the built-in. It runs the model's program as a script
  and returns what the program prints; a program that raises returns what it printed, then the
  exception's last traceback line (``"NameError: name 'x' is not defined"``), as Qwen2.5-Math's
  executor does.
- ``"package.module:function"``: a user's own tool, a plain function ``tool(text: str) -> str``
  named by import path, like `reward.function`; what it raises becomes its output.

The python tool runs each program in a sandbox of its own (`pacs.sandbox`, `rollout.tool_sandbox`):
a fresh process per call in namespaces of its own (forked by a zygote inside bubblewrap), which
sees no file of the run, no variable of its environment and no process of it or of another call,
may start no process and open no socket, and is killed with everything in it at its deadline by a
thread of the trainer's that it cannot reach.
What comes back is at most `pacs.sandbox.Limits.output_bytes` bytes of output and an exit status,
from which `python_output` writes the model's text: nothing a program does persists into another
call or reaches the trainer as anything but that text.

A user's tool is the user's code, not the model's: it runs in a worker process of
`pacs.rewards.workers.TimeLimitedWorkers` (a wall-clock limit per call, a memory limit, its own
process group, ``python -I``). A user's tool that runs model-written code runs it through
`pacs.sandbox.run_programs`.

A call past its limit, a program that crashes or is killed, and an exception are all output text
for the model (`ToolOutput.failed` marks them); nothing a tool does raises in the trainer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from pacs.plugins import PYTHON_TOOL, import_function
from pacs.rewards.workers import NO_RESULT, TimeLimitedWorkers, check_timeout_s, exception_text
from pacs.sandbox import PROGRAM_RAISED, Limits, ProgramOutcome, ProgramSandbox, check_sandbox, signal_name

PRELOADED_MODULES = ("sympy",)
"""Imported once by each of the python tool's zygotes, so that a program's ``import sympy`` (as
Qwen2.5-Math's tool-integrated programs write) costs nothing; pure Python, safe to fork."""
TOOL_CALL_SPEC = "pacs.rollout.tools:tool_call"
"""The function the workers of a user's tool run (`tool_call`)."""


@dataclass(frozen=True)
class ToolOutput:
    """What one tool call gave the model: `text`, and whether the call failed (an exception, a
    refused operation, a time-out or a crash)."""

    text: str
    failed: bool


def truncated(text: str, max_chars: int) -> str:
    """`text`, cut to its first `max_chars` characters with a note of how many were left out."""
    if len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n[{len(text) - max_chars} more characters]"


def tool_call(tool: str, program: str, max_output_chars: int) -> list:
    """In a worker of a user's tool: ``[text, failed]`` of `tool` on `program`, the text cut to
    `max_output_chars` (`truncated`). Raises nothing the tool raises."""
    try:
        text = _user_tool(tool)(program)
        failed = not isinstance(text, str)
        if failed:
            text = f"TypeError: the tool {tool} returned a {type(text).__name__}, not a str"
    except BaseException as error:  # the tool's doing: its output, never the trainer's error
        text, failed = exception_text(error), True
    return [truncated(text, max_output_chars), failed]


_user_tools: dict[str, Callable] = {}


def _user_tool(spec: str) -> Callable:
    """The user's tool `spec`, imported once per worker."""
    if spec not in _user_tools:
        _user_tools[spec] = import_function(spec, "tool")
    return _user_tools[spec]


def python_output(outcome: ProgramOutcome, limits: Limits, max_output_chars: int) -> ToolOutput:
    """The text the model reads for a sandboxed program's `outcome`, and whether the call failed:
    what it printed (cut to `max_output_chars`, `truncated`), then for a program that did not end
    plainly a line saying how it ended (its exception's last line is already its output's)."""
    printed = outcome.text()
    if outcome.timed_out:
        return ToolOutput(f"TimeoutError: the program ran past its time limit of {limits.timeout_s:g} s and was stopped", True)
    if outcome.more_output:
        note = f"[the program printed more than {limits.output_bytes} bytes and was stopped]"
        return ToolOutput(f"{truncated(printed, max_output_chars)}\n{note}", True)
    if outcome.runner_error is not None:
        return ToolOutput(f"SandboxError: the program could not be run ({outcome.runner_error})", True)
    returncode = cast(int, outcome.returncode)
    if returncode in (0, PROGRAM_RAISED):
        return ToolOutput(truncated(printed, max_output_chars), returncode != 0)
    if returncode < 0 or returncode > 128:
        ending = _killed_text(signal_name(returncode), limits)
    else:
        ending = f"SystemExit: the program's process exited with status {returncode}"
    return ToolOutput(truncated(printed.rstrip("\n") + ("\n" if printed.strip() else "") + ending, max_output_chars), True)


def _killed_text(signal: str, limits: Limits) -> str:
    if signal == "SIGXCPU":
        return f"TimeoutError: the program used more than its {limits.timeout_s:g} s of CPU time and was stopped"
    memory = "" if limits.memory_mib is None else f" (its memory limit is {limits.memory_mib} MiB)"
    return f"the program's process was killed by {signal}{memory}"


class ToolRunner:
    """`rollout.tools` run for the model: the python tool in a sandbox per call (`pacs.sandbox`,
    `sandbox` its isolation), `num_workers` at once; a user's tool in `num_workers` worker
    processes. Each call within `timeout_s` seconds and `memory_limit_mib` MiB (None: no limit),
    its output cut to `max_output_chars`. The sandbox is tried, and a user's tool imported, here at
    once, so that a machine that cannot run it or a wrong name fails before anything runs. Use as a
    context manager, or call `close()`."""

    def __init__(
        self,
        tool: str,
        *,
        num_workers: int,
        timeout_s: float,
        memory_limit_mib: int | None,
        max_output_chars: int,
        sandbox: str = "bwrap",
    ) -> None:
        self.tool, self.num_workers, self.max_output_chars, self.sandbox = tool, num_workers, max_output_chars, sandbox
        self.timeout_s, self.memory_limit_mib = check_timeout_s(timeout_s), memory_limit_mib
        self.limits = Limits(
            timeout_s=self.timeout_s, memory_mib=memory_limit_mib, output_bytes=max(1 << 16, 4 * max_output_chars)
        )
        self._workers: TimeLimitedWorkers | None = None
        self._sandbox: ProgramSandbox | None = None
        if tool == PYTHON_TOOL:
            check_sandbox(sandbox)
            self._sandbox = ProgramSandbox(sandbox, parallel=num_workers, preload=PRELOADED_MODULES)
        else:
            import_function(tool, "tool")
            self._workers = TimeLimitedWorkers(TOOL_CALL_SPEC, num_workers=num_workers, memory_limit_mib=memory_limit_mib)

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the python tool's zygotes or a user's tool's workers (a later `run` starts fresh ones)."""
        if self._workers is not None:
            self._workers.close()
        if self._sandbox is not None:
            self._sandbox.close()

    def run(self, programs: Sequence[str]) -> list[ToolOutput]:
        """The tool's output for each of `programs`, in order; a call past the time limit or that
        crashed gives a message saying so."""
        if not programs:
            return []
        if self._sandbox is not None:
            outcomes = self._sandbox.run(programs, self.limits)
            return [python_output(outcome, self.limits, self.max_output_chars) for outcome in outcomes]
        assert self._workers is not None  # a user's tool
        calls = [(self.tool, program, self.max_output_chars) for program in programs]
        outcome = self._workers.run(calls, timeout_s=self.timeout_s)
        outputs = []
        for index, result in enumerate(outcome.results):
            if result is NO_RESULT:
                outputs.append(ToolOutput(self._lost_call_text(timed_out=index in outcome.timed_out_calls), True))
            else:
                text, failed = cast(list, result)  # tool_call's [text, failed]; the workers hand back each call's value as object
                outputs.append(ToolOutput(text, failed))
        return outputs

    def _lost_call_text(self, *, timed_out: bool) -> str:
        if timed_out:
            return f"TimeoutError: the tool ran past its time limit of {self.timeout_s:g} s and was stopped"
        limit = "" if self.memory_limit_mib is None else f" (its memory limit is {self.memory_limit_mib} MiB)"
        return f"the tool's worker process died{limit}"
