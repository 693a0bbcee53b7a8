"""Score responses in worker processes with a hard wall-clock limit per call.

One bad answer must never stall a training step. ``ScoringPool`` keeps ``num_workers`` long-lived
worker processes; each loads its reward function once (``load_reward_function``, so a user's
``"package.module:function"`` works) and answers one ``(data_source, solution_str, ground_truth,
extra_info)`` call at a time. The parent sends calls to idle workers and waits on all of them at
once with ``multiprocessing.connection.wait`` and a deadline per call, so the limit holds whatever
thread or process the caller is in:

- a call still running at ``timeout_s``: its worker is killed and replaced, the score is 0.0 and
  counted in ``BatchScores.timed_out``;
- a worker that dies (segfault, ``os._exit``): replaced, score 0.0, counted in ``crashed``;
- an exception raised by the reward function: re-raised here as ValueError naming the row
  (a bug is not a zero), as is a result that is not a score in [0, 1] (``_checked_score``).

Workers start lazily, in parallel, from a fork server (``_worker_context``; never a plain fork of
the caller, which may hold torch threads), and a call's clock starts only once its worker has
loaded its function. As with any non-fork start method, a script that scores while it is being
imported (no ``if __name__ == "__main__":`` guard) cannot start workers. ``num_workers=0`` scores
in this process, sequentially and without the pool's limit, for debugging; the math verifier
still bounds its own symbolic step (see ``pacs.rewards.math``), and each step it stopped or lost
(``math_score_timeouts``) is counted in ``timed_out``. A pool is not thread-safe: one ``score``
at a time.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from pacs.rewards.math import math_score_timeouts
from pacs.rewards.registry import (
    RewardCall,
    _checked_score,
    _describe_row,
    load_reward_function,
    reward_calls,
)

WORKER_START_TIMEOUT_S = 120.0

_inside_scoring_worker = False


def inside_scoring_worker() -> bool:
    """Whether this process is a ``ScoringPool`` worker (whose parent enforces the time limit)."""
    return _inside_scoring_worker


@dataclass
class BatchScores:
    """Scores of one batch, in response order; calls that timed out or crashed score 0.0."""

    scores: list[float]
    timed_out: int = 0
    crashed: int = 0


@dataclass(eq=False)
class _Worker:
    """A worker process, the parent's end of its pipe, and whether it has loaded its function."""

    process: BaseProcess
    connection: Connection
    started_at: float = field(default_factory=time.monotonic)
    ready: bool = False


RunningCalls = dict[_Worker, tuple[int, float]]
"""The workers busy with a call: worker -> (index of the call in the batch, monotonic deadline)."""


def _serve_reward_calls(connection: Connection, function_spec: str | None) -> None:
    """Worker process: load the function, report ready, answer calls until the parent hangs up.

    Messages to the parent: ``("ready", None)``, ``("load_error", text)``, ``("score", result)``,
    ``("error", text)`` for an exception raised by the function.
    """
    global _inside_scoring_worker
    _inside_scoring_worker = True
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        compute_score = load_reward_function(function_spec)
    except ValueError as error:
        connection.send(("load_error", str(error)))
        return
    connection.send(("ready", None))
    while True:
        try:
            call = connection.recv()
        except EOFError:
            return
        try:
            message = ("score", compute_score(*call))
        except Exception as error:
            message = ("error", f"{type(error).__name__}: {error}")
        try:
            connection.send(message)
        except Exception as error:
            connection.send(("error", f"its {type(message[1]).__name__} result cannot be sent back: {error}"))


class ScoringPool:
    """Worker processes that score (row, response) pairs, each call limited to ``timeout_s``.

    ``function_spec`` is None for ``default_compute_score`` (by ``data_source``) or
    ``"package.module:function"``. ``timeout_s`` is read at every ``score`` call. Use as a context
    manager, or call ``close()``; a later ``score`` starts fresh workers. Workers are daemonic, so
    they end with the caller, and a reward function cannot start processes of its own.
    """

    def __init__(
        self, function_spec: str | None = None, *, num_workers: int = 2, timeout_s: float = 1.0
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(
                f"num_workers must be an integer >= 0 (0 scores in this process), got {num_workers!r}"
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.function_spec = function_spec
        self.num_workers = num_workers
        self.timeout_s = timeout_s
        self._compute_score = load_reward_function(function_spec)
        self._context = _worker_context()
        self._workers: list[_Worker] = []

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop all workers."""
        while self._workers:
            self._stop(self._workers[0])

    def score(self, rows: list[dict], responses: list[str]) -> BatchScores:
        """Score ``responses[i]`` against ``rows[i]`` (rows as in ``score_responses``)."""
        calls = reward_calls(rows, responses)
        if self.num_workers == 0:
            timeouts_before = math_score_timeouts()
            scores = [self._score_in_process(call) for call in calls]
            return BatchScores(scores, timed_out=math_score_timeouts() - timeouts_before)
        return self._score_in_workers(calls)

    @property
    def _function_name(self) -> str:
        return self.function_spec or "default_compute_score"

    def _function_error(self, call: RewardCall, error_text: str) -> ValueError:
        data_source, _, _, extra_info = call
        where = _describe_row(data_source, extra_info)
        return ValueError(f"Reward function {self._function_name} raised for {where}: {error_text}")

    def _score_in_process(self, call: RewardCall) -> float:
        try:
            result = self._compute_score(*call)
        except Exception as error:
            raise self._function_error(call, f"{type(error).__name__}: {error}") from error
        return _checked_score(result, call[0], call[3])

    def _start_worker(self) -> None:
        parent_end, child_end = self._context.Pipe()
        process = self._context.Process(
            target=_serve_reward_calls, args=(child_end, self.function_spec), daemon=True
        )
        process.start()
        child_end.close()
        self._workers.append(_Worker(process, parent_end))

    def _stop(self, worker: _Worker) -> None:
        self._workers.remove(worker)
        worker.connection.close()
        worker.process.kill()
        worker.process.join()
        worker.process.close()

    def _replace(self, worker: _Worker) -> None:
        self._stop(worker)
        self._start_worker()

    def _score_in_workers(self, calls: list[RewardCall]) -> BatchScores:
        while len(self._workers) < self.num_workers:
            self._start_worker()
        batch = BatchScores([0.0] * len(calls))
        pending = deque(range(len(calls)))
        running: RunningCalls = {}
        try:
            while pending or running:
                self._dispatch(calls, pending, running)
                for connection in wait(self._awaited_connections(running), self._wait_s(running)):
                    worker = next(worker for worker in self._workers if worker.connection is connection)
                    self._collect(worker, calls, running, batch)
                self._stop_overdue(running, batch)
        finally:
            for worker in running:
                self._stop(worker)
        return batch

    def _dispatch(self, calls: list[RewardCall], pending: deque[int], running: RunningCalls) -> None:
        """Send the next pending calls to idle, ready workers; restart one found dead while idle."""
        for worker in list(self._workers):
            if not pending or not worker.ready or worker in running:
                continue
            index = pending.popleft()
            try:
                worker.connection.send(calls[index])
            except OSError:
                pending.appendleft(index)
                self._replace(worker)
                continue
            running[worker] = (index, time.monotonic() + self.timeout_s)

    def _collect(
        self, worker: _Worker, calls: list[RewardCall], running: RunningCalls, batch: BatchScores
    ) -> None:
        """Take a worker's message: its start report, a result, or (None) news of its death."""
        message = _receive(worker)
        if not worker.ready:
            self._accept_start(worker, message)
            return
        index, _ = running.pop(worker)
        if message is None:
            batch.crashed += 1
            self._replace(worker)
            return
        kind, payload = message
        if kind == "error":
            raise self._function_error(calls[index], str(payload))
        batch.scores[index] = _checked_score(payload, calls[index][0], calls[index][3])

    def _accept_start(self, worker: _Worker, message: tuple[str, object] | None) -> None:
        if message is not None and message[0] == "ready":
            worker.ready = True
            return
        worker.process.join(timeout=5.0)
        exit_code = worker.process.exitcode
        self._stop(worker)
        if message is None:
            raise RuntimeError(
                f"A scoring worker exited with code {exit_code} while loading {self._function_name} "
                "(its error is printed above; a script that scores as it is imported needs "
                "if __name__ == '__main__':)"
            )
        raise ValueError(f"A scoring worker could not load its reward function: {message[1]}")

    def _stop_overdue(self, running: RunningCalls, batch: BatchScores) -> None:
        """Kill and replace workers past their call's deadline; fail on a worker that never started."""
        now = time.monotonic()
        for worker, (_, deadline) in list(running.items()):
            if now >= deadline:
                running.pop(worker)
                batch.timed_out += 1
                self._replace(worker)
        for worker in self._workers:
            if not worker.ready and now - worker.started_at > WORKER_START_TIMEOUT_S:
                self._stop(worker)
                raise RuntimeError(f"A scoring worker did not start within {WORKER_START_TIMEOUT_S:.0f} s")

    def _awaited_connections(self, running: RunningCalls) -> list[Connection]:
        return [worker.connection for worker in self._workers if worker in running or not worker.ready]

    def _wait_s(self, running: RunningCalls) -> float:
        """Seconds until the earliest deadline: a running call's, or a starting worker's."""
        deadlines = [deadline for _, deadline in running.values()]
        deadlines += [
            worker.started_at + WORKER_START_TIMEOUT_S for worker in self._workers if not worker.ready
        ]
        return max(0.0, min(deadlines) - time.monotonic())


def _worker_context() -> multiprocessing.context.BaseContext:
    """The "forkserver" start method, with this module preloaded in the server, else "spawn".

    A fork server that has already imported math-verify and sympy starts a replacement worker in
    milliseconds rather than the ~0.5 s of a fresh interpreter. The preload list is process-wide
    and only takes effect if the fork server has not started yet.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def _receive(worker: _Worker) -> tuple[str, object] | None:
    """The worker's next message, or None when it has died."""
    try:
        return worker.connection.recv()
    except (EOFError, OSError):
        return None
