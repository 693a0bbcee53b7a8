"""Call a function in worker processes with a hard wall-clock limit on every call.

``TimeLimitedWorkers("package.module:function", num_workers=2).run(calls, timeout_s=1.0)`` calls
the function on each argument tuple of ``calls`` and returns the results in call order:

- a call still running at ``timeout_s``: its worker is killed and replaced; no result, counted
  in ``CallResults.timed_out``;
- a worker that dies (segfault, ``os._exit``): replaced; no result, counted in ``crashed``;
- an exception raised by the function: raised here as ``CallError`` with the call's index and the
  error's text (a bug is not a missing result).

The limit holds whatever thread the caller runs in: the caller waits on every busy worker at once
(``multiprocessing.connection.wait``) with a deadline per call. A worker takes a chunk of calls at
a time and reports each result as it finishes, so each call's clock starts when the previous
result arrives, and a batch of cheap calls costs a few messages rather than a round trip each.

Where workers come from. They must start in milliseconds (one past its limit is replaced), must
not be a plain fork of the caller (which may hold torch's threads and locks), and must never run
the caller's ``__main__``: multiprocessing's "spawn" and "forkserver" start methods import the
caller's main script in every child, which re-runs a script that has no
``if __name__ == "__main__":`` guard and fails for a script read from standard input. So each
``TimeLimitedWorkers`` starts one fork server of its own with ``subprocess``: a fresh interpreter
with the caller's ``sys.path`` and working directory, which imports the function once and forks
a worker per request. A worker inherits the imported function, talks to the caller over its own
socket (handed over with SCM_RIGHTS), and never sees the caller's ``__main__``. The server kills
and reaps workers on request, and all of them when the caller closes it or goes away. Both ignore
SIGINT: Ctrl-C interrupts the caller, which stops them.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait

SERVER_START_TIMEOUT_S = 120.0
CALLS_PER_MESSAGE = 64
FUNCTION_SPEC_PATTERN = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
_CONTROL_MESSAGE_BYTES = 1 << 16

NO_RESULT = object()
"""Stands in ``CallResults.results`` for a call that timed out or whose worker crashed."""

_inside_worker = False


def inside_time_limited_worker() -> bool:
    """Whether this process is a worker of ``TimeLimitedWorkers`` (whose caller enforces a limit)."""
    return _inside_worker


def _import_module(module_name: str):
    """Import `module_name` from `sys.path`, else from the working directory, as `python -m` finds
    it (the working directory is then appended to `sys.path`, so worker servers, which start with
    this process's `sys.path`, find it too)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        working_dir = os.getcwd()
        if error.name != module_name.split(".")[0] or {working_dir, ""} & set(sys.path):
            raise
        sys.path.append(working_dir)
        try:
            return importlib.import_module(module_name)
        except ImportError:
            sys.path.remove(working_dir)
            raise


def import_function(spec: str) -> Callable:
    """The callable named ``"package.module:function"``; ValueError saying what is wrong otherwise."""
    if not FUNCTION_SPEC_PATTERN.match(spec):
        raise ValueError(f"Function {spec!r} must be written 'package.module:function'")
    module_name, function_name = spec.split(":")
    try:
        module = _import_module(module_name)
    except ImportError as error:
        raise ValueError(f"Cannot import module {module_name!r} of function {spec!r}: {error}") from error
    if not hasattr(module, function_name):
        available = sorted(
            name for name, value in vars(module).items() if callable(value) and not name.startswith("_")
        )
        raise ValueError(f"Module {module_name!r} has no attribute {function_name!r}; its callables: {available}")
    function = getattr(module, function_name)
    if not callable(function):
        raise ValueError(f"{spec!r} is not callable (it is a {type(function).__name__})")
    return function


class CallError(Exception):
    """The function raised for ``calls[index]``; ``text`` is ``"ExceptionType: message"``."""

    def __init__(self, index: int, text: str):
        super().__init__(f"call {index}: {text}")
        self.index = index
        self.text = text


@dataclass
class CallResults:
    """Results in call order; ``NO_RESULT`` for each call that timed out or whose worker crashed."""

    results: list[object]
    timed_out: int = 0
    crashed: int = 0


@dataclass(eq=False)
class _Worker:
    """The caller's view of a worker: its pid, its socket, the calls sent to it and not yet
    answered (the first is running), and when the running call must have finished."""

    pid: int
    connection: Connection
    assigned: deque[int] = field(default_factory=deque)
    deadline: float = math.inf


class TimeLimitedWorkers:
    """``num_workers`` worker processes that call ``function_spec``, each call limited in time.

    Started on the first ``run``; ``close()`` (or the context manager) stops them, and a later
    ``run`` starts fresh ones. Not thread-safe: one ``run`` at a time.
    """

    def __init__(self, function_spec: str, *, num_workers: int):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
        self.function_spec = function_spec
        self.num_workers = num_workers
        self._server: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._workers: list[_Worker] = []

    def __enter__(self) -> TimeLimitedWorkers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and every worker."""
        for worker in self._workers:
            worker.connection.close()
        self._workers = []
        if self._control is not None:
            self._control.close()  # the server kills its workers and exits on end-of-file
            self._control = None
        if self._server is not None:
            try:
                self._server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()
            self._server = None

    def run(self, calls: Sequence[tuple], *, timeout_s: float) -> CallResults:
        """Call the function on every argument tuple of ``calls``, each within ``timeout_s`` seconds."""
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self._start()
        outcome = CallResults([NO_RESULT] * len(calls))
        pending = deque(range(len(calls)))
        try:
            while pending or self._busy():
                self._dispatch(calls, pending, timeout_s)
                busy = self._busy()
                ready = wait([worker.connection for worker in busy], self._seconds_to_deadline(busy))
                for worker in busy:
                    if worker.connection in ready:
                        self._collect(worker, outcome, pending, timeout_s)
                self._stop_overdue(outcome, pending)
        finally:
            for worker in self._busy():  # left with calls of a batch that failed
                self._replace(worker)
        return outcome

    def _busy(self) -> list[_Worker]:
        return [worker for worker in self._workers if worker.assigned]

    def _seconds_to_deadline(self, busy: list[_Worker]) -> float:
        return max(0.0, min(worker.deadline for worker in busy) - time.monotonic())

    def _dispatch(self, calls: Sequence[tuple], pending: deque[int], timeout_s: float) -> None:
        """Give idle workers the next chunks of pending calls, small enough that all share the work."""
        for worker in self._workers:
            if not pending:
                return
            if worker.assigned:
                continue
            chunk_size = min(CALLS_PER_MESSAGE, -(-len(pending) // (2 * self.num_workers)))
            chunk = [pending.popleft() for _ in range(min(chunk_size, len(pending)))]
            try:
                worker.connection.send([calls[index] for index in chunk])
            except OSError:  # died while idle: a fresh worker takes the chunk next round
                pending.extendleft(reversed(chunk))
                self._replace(worker)
                continue
            worker.assigned.extend(chunk)
            worker.deadline = time.monotonic() + timeout_s

    def _collect(self, worker: _Worker, outcome: CallResults, pending: deque[int], timeout_s: float) -> None:
        """Take every message the worker has sent: results, an error, or (None) news of its death."""
        while worker.assigned:
            message = _receive(worker.connection)
            if message is None:
                outcome.crashed += 1
                worker.assigned.popleft()
                pending.extendleft(reversed(worker.assigned))
                self._replace(worker)
                return
            kind, payload = message
            index = worker.assigned.popleft()
            if kind == "error":
                worker.assigned.appendleft(index)
                raise CallError(index, payload)
            outcome.results[index] = payload
            worker.deadline = time.monotonic() + timeout_s
            if not worker.connection.poll():
                return

    def _stop_overdue(self, outcome: CallResults, pending: deque[int]) -> None:
        now = time.monotonic()
        for worker in self._busy():
            if now >= worker.deadline:
                outcome.timed_out += 1
                worker.assigned.popleft()
                pending.extendleft(reversed(worker.assigned))
                self._replace(worker)

    def _start(self) -> None:
        """Start the fork server (once) and as many workers as are missing."""
        if self._server is None:
            self._start_server()
        while len(self._workers) < self.num_workers:
            self._workers.append(self._fork_worker())

    def _start_server(self) -> None:
        control, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = (
            "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
            f"import pacs.rewards.workers as workers; workers._serve_forks({server_end.fileno()})"
        )
        with server_end:
            self._server = subprocess.Popen(
                [sys.executable, "-c", code, json.dumps(sys.path)],
                stdin=subprocess.DEVNULL,
                pass_fds=[server_end.fileno()],
            )
        self._control = control
        self._control.send(pickle.dumps(self.function_spec))
        kind, payload = self._server_reply(SERVER_START_TIMEOUT_S)
        if kind != "ready":
            self.close()
            raise ValueError(f"The worker processes could not load {self.function_spec}: {payload}")

    def _server_reply(self, timeout_s: float) -> tuple[str, object]:
        self._control.settimeout(timeout_s)
        try:
            message = self._control.recv(_CONTROL_MESSAGE_BYTES)
        except TimeoutError:
            message = None
        if not message:
            exit_code = self._server.poll()
            self.close()
            raise RuntimeError(
                f"The worker server for {self.function_spec} "
                + (f"did not answer within {timeout_s:.0f} s" if exit_code is None else f"exited with code {exit_code}")
                + " (its error, if any, is printed above)"
            )
        return pickle.loads(message)

    def _fork_worker(self) -> _Worker:
        caller_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with worker_end:
            socket.send_fds(self._control, [pickle.dumps(("fork", None))], [worker_end.fileno()])
            _, pid = self._server_reply(SERVER_START_TIMEOUT_S)
        return _Worker(pid, Connection(caller_end.detach()))

    def _replace(self, worker: _Worker) -> None:
        """Kill a worker (the server reaps it) and fork a fresh one in its place."""
        self._workers.remove(worker)
        worker.connection.close()
        self._control.send(pickle.dumps(("stop", worker.pid)))
        self._workers.append(self._fork_worker())


def _receive(connection: Connection) -> tuple[str, object] | None:
    """The worker's next message, or None when it has died."""
    try:
        return connection.recv()
    except (EOFError, OSError):
        return None


def _serve_forks(control_fd: int) -> None:
    """The fork server: import the function named by the first message, then fork workers and
    stop them on request until the caller hangs up; then kill the rest and exit.

    Requests: ``("fork", None)`` with the worker's socket attached -> ``("forked", pid)``;
    ``("stop", pid)``. First reply: ``("ready", None)`` or ``("load_error", text)``.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    control = socket.socket(fileno=control_fd)
    function_spec = pickle.loads(control.recv(_CONTROL_MESSAGE_BYTES))
    try:
        function = import_function(function_spec)
    except ValueError as error:
        control.send(pickle.dumps(("load_error", str(error)[:8192])))
        return
    control.send(pickle.dumps(("ready", None)))
    children: set[int] = set()
    try:
        while True:
            message, fds, _, _ = socket.recv_fds(control, _CONTROL_MESSAGE_BYTES, 1)
            if not message:
                return
            kind, pid = pickle.loads(message)
            if kind == "fork":
                pid = os.fork()
                if pid == 0:
                    control.close()
                    _serve_calls(Connection(fds[0]), function)
                os.close(fds[0])
                children.add(pid)
                control.send(pickle.dumps(("forked", pid)))
            elif kind == "stop" and pid in children:
                children.remove(pid)
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    finally:
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def _serve_calls(connection: Connection, function: Callable) -> None:
    """A worker: answer each chunk of calls, one message per call, until the caller hangs up.

    Messages: ``("result", value)``, or ``("error", text)`` for an exception raised by the
    function or a result that cannot be sent back. Never returns into the server's loop.
    """
    global _inside_worker
    _inside_worker = True
    try:
        while True:
            try:
                chunk = connection.recv()
            except EOFError:
                break
            for call in chunk:
                try:
                    message = ("result", function(*call))
                except Exception as error:
                    message = ("error", f"{type(error).__name__}: {error}")
                try:
                    connection.send(message)
                except Exception as error:
                    connection.send(("error", f"its {type(message[1]).__name__} result cannot be sent back: {error}"))
    finally:
        os._exit(0)
