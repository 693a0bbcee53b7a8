"""The tools a model calls during a multi-turn rollout (`pacs.rollout.multiturn`), run where they
cannot hurt the trainer.

A tool is a function of one string (the model's call: a program) returning a string (what the
model reads back). `rollout.tools` names it:

- ``"python"`` (`pacs.plugins.PYTHON_TOOL`): the built-in. It runs the model's program as a script and returns
  what the program prints; a program that raises returns what it printed, then the exception's
  last traceback line (``"NameError: name 'x' is not defined"``), as Qwen2.5-Math's executor does.
- ``"package.module:function"``: a user's own tool, a plain function ``tool(text: str) -> str``
  named by import path, like `reward.function`; what it raises becomes its output.

Every call runs in a worker process of `pacs.rewards.workers.TimeLimitedWorkers`, never in the
trainer: a wall-clock limit per call (the worker is killed and replaced), a memory limit (RLIMIT_AS
beyond the worker's size), its own process group (whatever it starts dies with it), no socket of
the trainer's inherited, and an isolated interpreter (``python -I``: neither the working directory
nor ``PYTHON*`` variables reach its import path). A call past its limit, a worker that dies, and
an exception are all output text for the model (`ToolOutput.failed` marks them); nothing a tool
does raises in the trainer.

The built-in python tool narrows a worker further, once, before its first program
(`_enter_python_sandbox`): its working directory becomes an empty temporary folder, its import path
loses the working directory (``""`` and the trainer's folder), and an audit hook (PEP 578, which a
program cannot remove) refuses opening or connecting a socket, starting, forking or signalling a
process and loading native code through ctypes (`REFUSED_EVENTS`). Each program gets a fresh
namespace. This keeps a model's mistakes and ordinary programs from reaching the network or the
run; it is not a security boundary against a program written to escape (a program may still read
and write files the trainer's user can).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from pacs.plugins import PYTHON_TOOL, import_function
from pacs.rewards.workers import NO_RESULT, TimeLimitedWorkers, check_timeout_s, exception_text

TOOL_CALL_SPEC = "pacs.rollout.tools:tool_call"
"""The function the tool workers run (`tool_call`)."""
REFUSED_EVENTS = frozenset(
    {
        "socket.__new__",
        "socket.bind",
        "socket.connect",
        "socket.sendto",
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "os.kill",
        "os.killpg",
        "signal.pthread_kill",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.cdata",
    }
)
"""Audit events (Python's audit events table) the python tool refuses with PermissionError."""


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
    """In a tool worker: ``[text, failed]`` of `tool` on `program`, the text cut to
    `max_output_chars` (`truncated`). Raises nothing a tool or program raises."""
    if tool == PYTHON_TOOL:
        text, failed = run_python(program)
    else:
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


def run_python(program: str) -> tuple[str, bool]:
    """What `program` prints, run as a script in a fresh namespace (in a worker narrowed by
    `_enter_python_sandbox`), and whether it failed: an exception adds its text on a line of its
    own; ``sys.exit(0)`` or ``exit()`` is a plain end."""
    _enter_python_sandbox()
    printed = io.StringIO()
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(program, "<program>", "exec"), namespace)
    except SystemExit as stop:
        if stop.code in (0, None):
            return printed.getvalue(), False
        return printed.getvalue() + f"SystemExit: {stop.code}", True
    except BaseException as error:  # the program's doing: its output
        return printed.getvalue() + exception_text(error), True
    return printed.getvalue(), False


_sandboxed = False


def _enter_python_sandbox() -> None:
    """Once per worker: an empty working directory, no working directory on the import path, and
    the audit hook that refuses `REFUSED_EVENTS` (module docstring)."""
    global _sandboxed
    if _sandboxed:
        return
    working_dir = os.getcwd()
    sys.path[:] = [entry for entry in sys.path if entry not in ("", ".", working_dir)]
    os.chdir(tempfile.mkdtemp(prefix="pacs-python-tool-"))
    sys.addaudithook(_refuse_outside_reach)
    _sandboxed = True


def _refuse_outside_reach(event: str, arguments: tuple) -> None:
    if event in REFUSED_EVENTS:
        raise PermissionError(f"the python tool does not allow {event} (no network, processes or native code)")


class ToolRunner:
    """`rollout.tools` run in `num_workers` worker processes, each call within `timeout_s` seconds
    and `memory_limit_mib` of growth (None: no limit), its output cut to `max_output_chars`. A
    user's tool is imported here at once, so that a wrong name fails before anything runs. Use as
    a context manager, or call `close()`."""

    def __init__(
        self, tool: str, *, num_workers: int, timeout_s: float, memory_limit_mib: int | None, max_output_chars: int
    ) -> None:
        if tool != PYTHON_TOOL:
            import_function(tool, "tool")
        self.tool, self.timeout_s, self.max_output_chars = tool, check_timeout_s(timeout_s), max_output_chars
        self.memory_limit_mib = memory_limit_mib
        self._workers = TimeLimitedWorkers(TOOL_CALL_SPEC, num_workers=num_workers, memory_limit_mib=memory_limit_mib)

    def __enter__(self) -> ToolRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the workers (a later `run` starts fresh ones)."""
        self._workers.close()

    def run(self, programs: Sequence[str]) -> list[ToolOutput]:
        """The tool's output for each of `programs`, in order; a call past the time limit or whose
        worker died gives a message saying so."""
        if not programs:
            return []
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
            return f"TimeoutError: the program ran past its time limit of {self.timeout_s:g} s and was stopped"
        limit = "" if self.memory_limit_mib is None else f" (its memory limit is {self.memory_limit_mib} MiB)"
        return f"MemoryError: the program's process died{limit}"
