"""Specification of the time-limited workers: a limit per call, and no process left behind."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pacs.rewards.workers import NO_RESULT, CallError, TimeLimitedWorkers

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")


def running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):  # gone before or while its stat was read
        return False
    return state != "Z"


def test_every_call_of_a_chunk_gets_the_whole_limit() -> None:
    with TimeLimitedWorkers("time:sleep", num_workers=1) as workers:
        outcome = workers.run([(0.3,)] * 4, timeout_s=0.5)
    assert outcome.results == [None] * 4
    assert (outcome.timed_out, outcome.crashed) == (0, 0)


def test_calls_queued_behind_a_stuck_call_are_still_answered() -> None:
    with TimeLimitedWorkers("time:sleep", num_workers=1) as workers:
        outcome = workers.run([(0.0,), (3600.0,), (0.0,), (0.0,)], timeout_s=0.3)
    assert outcome.results == [None, NO_RESULT, None, None]
    assert outcome.timed_out == 1


def test_an_exception_names_the_call_that_raised() -> None:
    with TimeLimitedWorkers("math:sqrt", num_workers=2) as workers:
        with pytest.raises(CallError) as raised:
            workers.run([(4.0,), (-1.0,), (9.0,)], timeout_s=5)
        assert raised.value.index == 1 and raised.value.text == "ValueError: math domain error"
        assert workers.run([(16.0,)], timeout_s=5).results == [4.0]


@needs_proc
def test_closing_stops_the_server_and_every_worker() -> None:
    workers = TimeLimitedWorkers("os:getpid", num_workers=2)
    pids = set(workers.run([()] * 8, timeout_s=5).results)
    assert len(pids) == 2 and all(running(pid) for pid in pids)
    workers.close()
    assert not any(running(pid) for pid in pids)


@needs_proc
def test_workers_end_when_their_caller_is_killed(tmp_path: Path) -> None:
    script = (
        "import time\nfrom pacs.rewards.workers import TimeLimitedWorkers\n"
        "workers = TimeLimitedWorkers('os:getpid', num_workers=2)\n"
        "print(*set(workers.run([()] * 8, timeout_s=5).results), flush=True)\n"
        "time.sleep(3600)\n"
    )
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    pids = [int(pid) for pid in caller.stdout.readline().split()]
    assert len(pids) == 2 and all(running(pid) for pid in pids)
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    deadline = time.monotonic() + 10
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(running(pid) for pid in pids)


def test_a_function_that_cannot_be_imported_is_named() -> None:
    with pytest.raises(ValueError, match="Cannot import module 'pacs_no_such_module'"):
        TimeLimitedWorkers("pacs_no_such_module:score", num_workers=1).run([()], timeout_s=1)
