"""Call a function in worker processes with a hard wall-clock limit on every call.

``TimeLimitedWorkers("package.module:function", num_workers=2).run(calls, timeout_s=1.0)`` calls
the function on each argument tuple of ``calls`` and returns the results in call order:

- a call still running at ``timeout_s``: its worker is killed and replaced; no result, counted
  in ``CallResults.timed_out``. An answer that had already arrived when the caller got round to
  the deadline counts (the caller may have been busy);
- a worker that dies (segfault, ``os._exit``, past its memory limit, or a message that is not
  one): replaced; no result, counted in ``crashed``;
- an exception raised by the function (``sys.exit`` and ``KeyboardInterrupt`` included): raised
  here as ``CallError`` with the call's index and the error's text (a bug is not a missing result).

The limit holds whatever thread the caller runs in: the caller waits on every busy worker at once
with a deadline per call, and reads their sockets without blocking, so neither a slow nor a
half-written message can hold it past a deadline. A worker takes a chunk of calls at a time and
reports each result as it finishes, so each call's clock starts when the previous result arrives,
and a batch of cheap calls costs a few messages rather than a round trip each. One ``run`` at a
time: concurrent callers of one ``TimeLimitedWorkers`` take turns.

What crosses back to the caller. Workers run the function, and the function may run programs
that are not trusted (a reward function that executes model-written code). So nothing a worker
sends can run code in the caller: every message from a worker or the server is JSON (numbers,
strings, lists, dicts, true/false/null; a 0-d numpy value is sent as its ``.item()``), framed by
a 4-byte length and at most ``MAX_MESSAGE_BYTES`` long, and decoded only once it has fully
arrived; anything else is a crash. Calls go the other way pickled (the caller trusts itself). A
worker's socket is close-on-exec and the worker's whole process group dies with it, so a program
the function starts holds no copy of it once the worker is gone.

Where workers come from. They must start in milliseconds (one past its limit is replaced), must
not be a plain fork of the caller (which may hold torch's threads and locks), and must never run
the caller's ``__main__``: multiprocessing's "spawn" and "forkserver" start methods import the
caller's main script in every child, which re-runs a script that has no
``if __name__ == "__main__":`` guard and fails for a script read from standard input. So each
``TimeLimitedWorkers`` starts one fork server of its own with ``subprocess``: a fresh, isolated
interpreter (``python -I``: neither its working directory nor ``PYTHON*`` variables reach its
import path) given the caller's ``sys.path`` on standard input, which imports the function once
and forks a worker per request. A worker inherits the imported function, talks to the caller over
its own socket (handed over with SCM_RIGHTS), and never sees the caller's ``__main__``.

Processes left behind: none. Each worker leads a process group of its own; the server kills the
whole group when the caller stops the worker, when the worker exits, and for every worker when the
caller closes it, drops it, exits or dies. A program that leaves the group (``setsid``, a daemon's
double fork) is still caught: the server and each worker are child subreapers (Linux), so an
orphaned descendant of a worker is adopted by that worker while it lives and by the server once
it is gone, and the server kills every child of its own that is not a live worker. If the server dies (the OOM killer), its workers die
with it (Linux), the caller kills what is left of their groups, and the next call starts afresh,
counted in ``server_deaths`` (a scorer says so: `pacs.rewards.pool`).
A process that forks keeps the caller's workers with the caller: the child forgets them. The
server and workers ignore SIGINT: Ctrl-C interrupts the caller, which stops them.

Output and memory. A worker's standard output goes to the caller's standard error (a reward
function's prints never mix with a command's results on standard output), flushed after every
call. Each worker may grow its address space by at most ``memory_limit_mib`` (RLIMIT_AS, default
``DEFAULT_MEMORY_LIMIT_MIB``; None: no limit); a call that exceeds it is counted as a crash.

Platform: POSIX; the server reaps with ``os.waitid``. The memory limit (it reads /proc) and the
workers' death with a killed server (``prctl(PR_SET_PDEATHSIG)``) are Linux only.
"""

from __future__ import annotations

import ctypes
import json
import math
import numbers
import os
import pickle
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import typing
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import IO

from pacs.plugins import check_function_spec, import_function

SERVER_START_TIMEOUT_S = 120.0
CALLS_PER_MESSAGE = 64
MAX_MESSAGE_BYTES = 1 << 20
"""Largest message a worker may send back (one result or error)."""
DEFAULT_MEMORY_LIMIT_MIB = 2048
"""How far a worker may grow its address space beyond its size when forked, in MiB."""
ERROR_TEXT_CHARS = 8192
_FRAME_HEADER = struct.Struct(">I")
_CONTROL_MESSAGE_BYTES = 1 << 16
_READ_BYTES = 1 << 16
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36

NO_RESULT = object()
"""Stands in ``CallResults.results`` for a call that timed out or whose worker crashed."""

_inside_worker = False
_live_pools: weakref.WeakSet[TimeLimitedWorkers] = weakref.WeakSet()


def inside_time_limited_worker() -> bool:
    """Whether this process is a worker of ``TimeLimitedWorkers`` (whose caller enforces a limit)."""
    return _inside_worker


def check_timeout_s(timeout_s: object) -> float:
    """``timeout_s`` as a float; ValueError unless it is a positive, finite number of seconds."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real) or not 0 < float(timeout_s) < math.inf:
        raise ValueError(f"timeout_s must be a positive, finite number of seconds, got {timeout_s!r}")
    return float(timeout_s)


def exception_text(error: BaseException) -> str:
    """``"ExceptionType: message"``, even for an exception whose ``__str__`` raises."""
    try:
        message = str(error)
    except Exception as str_error:
        message = f"<str() of the exception raised {type(str_error).__name__}>"
    return f"{type(error).__name__}: {message}"[:ERROR_TEXT_CHARS]


class CallError(Exception):
    """The function raised for ``calls[index]``; ``text`` is ``"ExceptionType: message"``."""

    def __init__(self, index: int, text: str):
        super().__init__(f"call {index}: {text}")
        self.index = index
        self.text = text


@dataclass
class CallResults:
    """Results in call order; ``NO_RESULT`` for each call that timed out or whose worker crashed
    (``timed_out_calls``: the indices of those that timed out)."""

    results: list[object]
    timed_out: int = 0
    crashed: int = 0
    timed_out_calls: set[int] = field(default_factory=set)


@dataclass(eq=False)
class _Worker:
    """The caller's view of a worker: its pid (also its process group), its non-blocking socket,
    the bytes received and not yet decoded, the calls sent to it and not yet answered (the first is
    running), and when the running call must have finished."""

    pid: int
    connection: socket.socket
    received: bytearray = field(default_factory=bytearray)
    assigned: deque[int] = field(default_factory=deque)
    deadline: float = math.inf


class _WorkerLost(Exception):
    """The worker hung up, or sent something that is not a message."""


class _ServerLost(Exception):
    """The fork server is gone or does not answer."""


class TimeLimitedWorkers:
    """``num_workers`` worker processes that call ``function_spec``, each call limited in time.

    Started on the first ``run``; ``close()`` (or the context manager) stops them, and a later
    ``run`` starts fresh ones, as does a ``run`` after the server died. ``memory_limit_mib``: how
    much each worker may grow (None: no limit). Thread-safe: ``run`` calls take turns.
    """

    def __init__(self, function_spec: str, *, num_workers: int, memory_limit_mib: int | None = DEFAULT_MEMORY_LIMIT_MIB):
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an integer >= 1, got {num_workers!r}")
        if memory_limit_mib is not None and (
            isinstance(memory_limit_mib, bool) or not isinstance(memory_limit_mib, int) or memory_limit_mib < 1
        ):
            raise ValueError(f"memory_limit_mib must be an integer >= 1 or None, got {memory_limit_mib!r}")
        self.function_spec = check_function_spec(function_spec)
        self.num_workers = num_workers
        self.memory_limit_mib = memory_limit_mib
        self._lock = threading.Lock()
        self._server: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._stop_server: weakref.finalize | None = None
        self._workers: list[_Worker] = []
        self.server_deaths = 0
        """How often the server was found dead (killed, by the OOM killer or a program) and
        started again; a caller that cannot afford silent restarts reads it."""
        _live_pools.add(self)

    def __enter__(self) -> TimeLimitedWorkers:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the server and every worker (with the processes they started)."""
        with self._lock:
            self._close()

    def run(self, calls: Sequence[tuple], *, timeout_s: float) -> CallResults:
        """Call the function on every argument tuple of ``calls``, each within ``timeout_s`` seconds."""
        timeout_s = check_timeout_s(timeout_s)
        with self._lock:
            self._start()
            outcome = CallResults([NO_RESULT] * len(calls))
            pending = deque(range(len(calls)))
            try:
                while pending or self._busy():
                    self._dispatch(calls, pending, timeout_s)
                    busy = self._busy()
                    if not busy:  # every idle worker died before taking its chunk; fresh ones take it
                        continue
                    ready = wait([worker.connection for worker in busy], self._seconds_to_deadline(busy))
                    for worker in busy:
                        if worker.connection in ready and worker in self._workers:
                            self._collect(worker, outcome, pending, timeout_s)
                    self._stop_overdue(outcome, pending, timeout_s)
            finally:
                for worker in self._busy():  # left with calls of a batch that failed
                    self._replace(worker, deque())
            return outcome

    def _busy(self) -> list[_Worker]:
        return [worker for worker in self._workers if worker.assigned]

    def _seconds_to_deadline(self, busy: list[_Worker]) -> float:
        return max(0.0, min(worker.deadline for worker in busy) - time.monotonic())

    def _dispatch(self, calls: Sequence[tuple], pending: deque[int], timeout_s: float) -> None:
        """Give idle workers the next chunks of pending calls, small enough that all share the work."""
        for worker in list(self._workers):
            if not pending:
                return
            if worker.assigned or worker not in self._workers:
                continue
            chunk_size = min(CALLS_PER_MESSAGE, -(-len(pending) // (2 * self.num_workers)))
            chunk = [pending.popleft() for _ in range(min(chunk_size, len(pending)))]
            try:
                _send_frame(worker.connection, pickle.dumps([calls[index] for index in chunk]))
            except OSError:  # died while idle: a fresh worker takes the chunk next round
                pending.extendleft(reversed(chunk))
                self._replace(worker, pending)
                continue
            worker.assigned.extend(chunk)
            worker.deadline = time.monotonic() + timeout_s

    def _collect(self, worker: _Worker, outcome: CallResults, pending: deque[int], timeout_s: float) -> None:
        """Record every answer the worker has sent in full; replace it when it hung up or sent
        something that is not an answer (its running call counts as crashed)."""
        while worker.assigned:
            try:
                message = _next_message(worker)
            except _WorkerLost:
                outcome.crashed += 1
                worker.assigned.popleft()
                self._replace(worker, pending)
                return
            if message is None:
                return
            kind, payload = message
            if kind == "error":
                raise CallError(worker.assigned[0], payload)
            outcome.results[worker.assigned.popleft()] = payload
            worker.deadline = time.monotonic() + timeout_s
        if worker.received:  # more answers than calls: not a worker to trust with the next chunk
            self._replace(worker, pending)

    def _stop_overdue(self, outcome: CallResults, pending: deque[int], timeout_s: float) -> None:
        """Replace each worker whose running call is past its deadline and has not been answered."""
        for worker in self._busy():
            if worker not in self._workers or time.monotonic() < worker.deadline:
                continue
            self._collect(worker, outcome, pending, timeout_s)  # an answer may be waiting, unread
            if worker in self._workers and worker.assigned and time.monotonic() >= worker.deadline:
                outcome.timed_out += 1
                outcome.timed_out_calls.add(worker.assigned.popleft())
                self._replace(worker, pending)

    def _start(self) -> None:
        """Start the fork server (again, if it died) and as many workers as are missing."""
        if self._server is not None and self._server.poll() is not None:
            self.server_deaths += 1
            self._close()
        if self._server is None:
            self._start_server()
        try:
            while len(self._workers) < self.num_workers:
                self._workers.append(self._fork_worker())
        except _ServerLost:
            self._close()
            raise RuntimeError(f"The worker server for {self.function_spec} stopped while starting its workers") from None

    def _start_server(self) -> None:
        control, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = (
            "import json, sys; settings = json.loads(sys.stdin.buffer.read()); sys.path[:] = settings['sys_path']; "
            f"import pacs.rewards.workers as workers; workers._serve_forks(settings, {server_end.fileno()})"
        )
        settings = {
            "sys_path": [os.fspath(entry) for entry in sys.path if isinstance(entry, (str, os.PathLike))],
            "function_spec": self.function_spec,
            "memory_limit_mib": self.memory_limit_mib,
        }
        with server_end:
            self._server = subprocess.Popen(
                [sys.executable, "-I", "-c", code], stdin=subprocess.PIPE, pass_fds=[server_end.fileno()]
            )
        self._control = control
        self._stop_server = weakref.finalize(self, _stop_server, self._server, control, os.getpid())
        try:
            settings_pipe = typing.cast(IO[bytes], self._server.stdin)  # stdin=PIPE: never None
            settings_pipe.write(json.dumps(settings).encode())
            settings_pipe.close()
            kind, payload = self._server_reply(SERVER_START_TIMEOUT_S)
        except (OSError, _ServerLost) as error:
            exit_code = self._server.poll()
            self._close()
            raise RuntimeError(
                f"The worker server for {self.function_spec} "
                + (f"did not start: {error}" if exit_code is None else f"exited with code {exit_code}")
                + " (its error, if any, is printed above)"
            ) from None
        if kind != "ready":
            self._close()
            raise ValueError(f"The worker processes could not load {self.function_spec}: {payload}")

    def _live_control(self) -> socket.socket:
        """The socket to the worker server; _ServerLost when no server is running."""
        if self._control is None:
            raise _ServerLost("it is not running")
        return self._control

    def _server_reply(self, timeout_s: float) -> list:
        """The server's next reply, ``[kind, payload]``; _ServerLost if none comes in time."""
        control = self._live_control()
        control.settimeout(timeout_s)
        try:
            message = control.recv(_CONTROL_MESSAGE_BYTES)
        except OSError as error:  # TimeoutError included
            raise _ServerLost(f"no answer: {error}") from None
        if not message:
            raise _ServerLost("it hung up")
        try:
            return json.loads(message)
        except ValueError:
            raise _ServerLost("its answer is not JSON") from None

    def _fork_worker(self) -> _Worker:
        caller_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with worker_end:
            try:
                socket.send_fds(self._live_control(), [json.dumps(["fork", None]).encode()], [worker_end.fileno()])
            except OSError as error:
                caller_end.close()
                raise _ServerLost(f"cannot ask it: {error}") from None
            _, pid = self._server_reply(SERVER_START_TIMEOUT_S)
        caller_end.setblocking(False)
        return _Worker(pid, caller_end)

    def _replace(self, worker: _Worker, pending: deque[int]) -> None:
        """Kill a worker's process group (the server reaps it) and fork a fresh worker in its place;
        its unanswered calls go back to ``pending``. If the server is gone, start everything anew."""
        self._workers.remove(worker)
        worker.connection.close()
        pending.extendleft(reversed(worker.assigned))
        try:
            self._live_control().send(json.dumps(["stop", worker.pid]).encode())
            self._workers.append(self._fork_worker())
        except (OSError, _ServerLost):
            for other in self._workers:
                pending.extendleft(reversed(other.assigned))
            self.server_deaths += 1
            self._close()
            self._start()

    def _close(self) -> None:
        """Stop the server and the workers; kill their groups here if the server died on its own."""
        if self._server is not None and self._server.poll() is not None:
            _kill_groups(worker.pid for worker in self._workers)
        for worker in self._workers:
            worker.connection.close()
        self._workers = []
        if self._stop_server is not None:
            self._stop_server()
        self._server, self._control, self._stop_server = None, None, None

    def _forget(self) -> None:
        """In a forked child: drop the parent's server and workers without touching them."""
        for worker in self._workers:
            worker.connection.close()
        if self._control is not None:
            self._control.close()
        if self._stop_server is not None:
            self._stop_server.detach()
        self._workers, self._server, self._control, self._stop_server = [], None, None, None
        self._lock = threading.Lock()


def _forget_all_pools_in_child() -> None:
    for pool in list(_live_pools):
        pool._forget()


os.register_at_fork(after_in_child=_forget_all_pools_in_child)


def _stop_server(server: subprocess.Popen, control: socket.socket, owner_pid: int) -> None:
    """Ask the server to kill every worker group and exit; wait for it (kill it after 10 s).
    In a forked copy of the owner (``owner_pid``), only close this copy of the socket."""
    if os.getpid() != owner_pid:
        control.close()
        return
    try:
        control.send(json.dumps(["exit", None]).encode())
    except OSError:  # already gone
        pass
    control.close()
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _kill_groups(pids: Iterable[int]) -> None:
    """SIGKILL the process group led by each pid, if it still exists."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _send_frame(connection: socket.socket, payload: bytes) -> None:
    connection.setblocking(True)
    try:
        connection.sendall(_FRAME_HEADER.pack(len(payload)) + payload)
    finally:
        connection.setblocking(False)


def _next_message(worker: _Worker) -> list | None:
    """The worker's next message ``[kind, payload]`` once it has fully arrived, else None (never
    blocks); _WorkerLost when the worker hung up or sent something that is not a message."""
    while True:
        if len(worker.received) >= _FRAME_HEADER.size:
            (size,) = _FRAME_HEADER.unpack_from(worker.received)
            if size > MAX_MESSAGE_BYTES:
                raise _WorkerLost
            end = _FRAME_HEADER.size + size
            if len(worker.received) >= end:
                payload = bytes(worker.received[_FRAME_HEADER.size : end])
                del worker.received[:end]
                return _decode_answer(payload)
        try:
            data = worker.connection.recv(_READ_BYTES)
        except BlockingIOError:
            return None
        except OSError:
            raise _WorkerLost from None
        if not data:
            raise _WorkerLost
        worker.received += data


def _decode_answer(payload: bytes) -> list:
    """``["result", value]`` or ``["error", text]`` from JSON; _WorkerLost for anything else."""
    try:
        message = json.loads(payload)
    except (ValueError, RecursionError):
        raise _WorkerLost from None
    valid = (
        isinstance(message, list)
        and len(message) == 2
        and (message[0] == "result" or (message[0] == "error" and isinstance(message[1], str)))
    )
    if not valid:
        raise _WorkerLost
    return message


def _serve_forks(settings: dict, control_fd: int) -> None:
    """The fork server (`_serve_forks_until_told`), ending in silence when its caller hangs up
    mid-reply: a caller stopped by Ctrl-C says so itself, and a traceback from here would bury it."""
    try:
        _serve_forks_until_told(settings, control_fd)
    except (BrokenPipeError, ConnectionResetError):
        pass


def _serve_forks_until_told(settings: dict, control_fd: int) -> None:
    """The fork server: import the function, then fork workers and stop them on request until the
    caller says ``exit`` or hangs up; then kill every worker's group and exit.

    ``settings``: ``function_spec`` and ``memory_limit_mib``. Requests (JSON): ``["fork", null]``
    with the worker's socket attached -> ``["forked", pid]``; ``["stop", pid]``; ``["exit", null]``.
    First reply: ``["ready", null]`` or ``["load_error", text]``. Whenever a worker exits, its
    group is killed (so nothing it started holds its socket) and it is reaped.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _become_subreaper()
    control = socket.socket(fileno=control_fd)
    try:
        function = import_function(settings["function_spec"])
    except ValueError as error:
        control.send(json.dumps(["load_error", str(error)[:ERROR_TEXT_CHARS]]).encode())
        return
    child_exited, wakeup = os.pipe()
    os.set_blocking(wakeup, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wakeup)
    control.send(json.dumps(["ready", None]).encode())
    children: set[int] = set()
    try:
        while True:
            watched: list[socket.socket | int] = [control, child_exited]
            readable, _, _ = select.select(watched, [], [])
            if child_exited in readable:
                os.read(child_exited, _READ_BYTES)
                _reap_exited(children)
            if control not in readable:
                continue
            message, fds, _, _ = socket.recv_fds(control, _CONTROL_MESSAGE_BYTES, 1)
            for fd in fds:
                os.set_inheritable(fd, False)  # no program a worker runs may hold its socket
            if not message:
                return
            kind, argument = json.loads(message)
            if kind == "fork":
                pid = os.fork()
                if pid == 0:
                    _become_worker(control, (child_exited, wakeup), settings["memory_limit_mib"])
                    _serve_calls(socket.socket(fileno=fds[0]), function)
                _set_process_group(pid)
                os.close(fds[0])
                children.add(pid)
                control.send(json.dumps(["forked", pid]).encode())
            elif kind == "stop" and argument in children:
                _kill_groups([argument])  # reaped when SIGCHLD says it exited
            elif kind == "exit":
                return
    finally:
        _kill_groups(children)
        for pid in children:
            os.waitpid(pid, 0)
        while adopted := _kill_adopted(set()):
            for pid in adopted:
                os.waitpid(pid, 0)


def _set_process_group(pid: int) -> None:
    """Make ``pid`` lead a process group of its own (both parent and child do it: no race)."""
    try:
        os.setpgid(pid, pid)
    except (PermissionError, ProcessLookupError):  # the child did it first, or is gone
        pass


def _reap_exited(children: set[int]) -> None:
    """Kill the group of every exited child, then reap it (its pid stays reserved until then);
    kill every adopted orphan (a child that is not a worker), whose own death brings us here again."""
    while True:
        try:
            status = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            break
        if status is None:
            break
        _kill_groups([status.si_pid])
        os.waitpid(status.si_pid, 0)
        children.discard(status.si_pid)
    _kill_adopted(children)


def _kill_adopted(workers: set[int]) -> list[int]:
    """SIGKILL every child of this process that is not in ``workers`` (an adopted orphan), and
    the group it leads if it leads one; return their pids (still to be reaped)."""
    adopted = _adopted_children(workers)
    _kill_groups(adopted)
    for pid in adopted:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return adopted


def _become_subreaper() -> None:
    """Linux: orphaned descendants of this process become its children, not init's."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _adopted_children(workers: set[int]) -> list[int]:
    """This process's children that are not in ``workers`` (Linux; elsewhere none are known)."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return []
    pids = {int(pid) for task in tasks.iterdir() for pid in (task / "children").read_text().split()}
    return sorted(pids - workers)


def _become_worker(control: socket.socket, server_fds: tuple[int, int], memory_limit_mib: int | None) -> None:
    """In a freshly forked worker: its own process group, death with the server (Linux), none of the
    server's descriptors or signal handling, standard output to standard error, the memory limit."""
    server_pid = os.getppid()
    _set_process_group(0)
    _become_subreaper()
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server_pid:  # the server died before prctl
        os._exit(1)
    control.close()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in server_fds:
        os.close(fd)
    os.dup2(2, 1)
    if memory_limit_mib is not None and sys.platform == "linux":
        page_bytes = os.sysconf("SC_PAGE_SIZE")
        with open("/proc/self/statm") as statm:
            address_space_bytes = int(statm.read().split()[0]) * page_bytes
        _, hard_limit = resource.getrlimit(resource.RLIMIT_AS)
        limit_bytes = address_space_bytes + memory_limit_mib * (1 << 20)
        if hard_limit != resource.RLIM_INFINITY:
            limit_bytes = min(limit_bytes, hard_limit)
        resource.setrlimit(resource.RLIMIT_AS, (limit_bytes, limit_bytes))


def _serve_calls(connection: socket.socket, function: Callable) -> None:
    """A worker: answer each chunk of calls, one message per call, until the caller hangs up.

    Messages: ``["result", value]``, or ``["error", text]`` for an exception raised by the
    function or a result that cannot be sent back. A MemoryError (past the memory limit) ends the
    worker: a crash. Never returns into the server's loop.
    """
    global _inside_worker
    _inside_worker = True
    try:
        while True:
            payload = _receive_frame(connection)
            if payload is None:
                break
            for call in pickle.loads(payload):
                connection.sendall(_answer(function, call))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _answer(function: Callable, call: tuple) -> bytes:
    """The framed JSON message answering ``function(*call)``."""
    try:
        message = ["result", function(*call)]
    except MemoryError:
        os._exit(1)
    except BaseException as error:  # sys.exit and KeyboardInterrupt too: the function's doing
        message = ["error", exception_text(error)]
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    try:
        payload = json.dumps(message, default=_plain_scalar).encode()
    except (TypeError, ValueError, RecursionError) as error:
        text = f"its {type(message[1]).__name__} result cannot be sent back as JSON: {exception_text(error)}"
        payload = json.dumps(["error", text[:ERROR_TEXT_CHARS]]).encode()
    if len(payload) > MAX_MESSAGE_BYTES:
        text = f"its result takes {len(payload)} bytes as JSON, over the limit of {MAX_MESSAGE_BYTES}"
        payload = json.dumps(["error", text]).encode()
    return _FRAME_HEADER.pack(len(payload)) + payload


def _plain_scalar(value: object) -> object:
    """A 0-d numpy value (``np.float32``, ``np.bool_``) as the Python scalar JSON can hold."""
    item = getattr(value, "item", None)
    if getattr(value, "shape", None) == () and callable(item):
        return item()
    raise TypeError(f"{type(value).__name__} is not JSON (numbers, strings, lists, dicts, bool, None)")


def _receive_frame(connection: socket.socket) -> bytes | None:
    """The next length-prefixed message from a blocking socket; None when the caller hung up."""
    header = _receive_exactly(connection, _FRAME_HEADER.size)
    if header is None:
        return None
    return _receive_exactly(connection, _FRAME_HEADER.unpack(header)[0])


def _receive_exactly(connection: socket.socket, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        data = connection.recv(min(size - len(chunks), _READ_BYTES))
        if not data:
            return None
        chunks += data
    return bytes(chunks)
