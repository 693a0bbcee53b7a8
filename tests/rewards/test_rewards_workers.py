"""Specification of the time-limited workers: a limit per call, and no process left behind."""

from __future__ import annotations

import gc
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from killing import alive

from pacs.rewards.workers import NO_RESULT, CallError, TimeLimitedWorkers

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")


@pytest.mark.slow
def test_every_call_of_a_chunk_gets_the_whole_limit() -> None:
    with TimeLimitedWorkers("time:sleep", num_workers=1) as workers:
        outcome = workers.run([(0.3,)] * 4, timeout_s=0.5)
    assert outcome.results == [None] * 4
    assert (outcome.timed_out, outcome.crashed) == (0, 0)


@pytest.mark.slow
def test_calls_queued_behind_a_stuck_call_are_still_answered() -> None:
    with TimeLimitedWorkers("time:sleep", num_workers=1) as workers:
        outcome = workers.run([(0.0,), (3600.0,), (0.0,), (0.0,)], timeout_s=0.3)
    assert outcome.results == [None, NO_RESULT, None, None]
    assert outcome.timed_out == 1


@pytest.mark.slow
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
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    workers.close()
    assert not any(alive(pid) for pid in pids)


@pytest.mark.slow
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
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in pids)


@pytest.mark.slow
def test_a_function_that_cannot_be_imported_is_named() -> None:
    with pytest.raises(ValueError, match="Cannot import module 'pacs_no_such_module'"):
        TimeLimitedWorkers("pacs_no_such_module:score", num_workers=1).run([()], timeout_s=1)


PLUGIN_MODULE = "pacs_test_workers_plugin"
PLUGIN_SOURCE = '''
import os
import signal
import stat
import struct
import subprocess
import time


def send_half_a_message_then_hang():
    """Write the header of a 4096-byte message and one byte of it to every socket, then hang."""
    for fd in range(3, 256):
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.write(fd, struct.pack("!i", 4096) + b"[")
        except OSError:
            pass
    time.sleep(3600)


def start_a_sleeper(pid_file, then_hang, detached=False):
    """Start `sleep 3600`, write its pid to `pid_file`; then hang or return. Detached: as a daemon
    does, in a session of its own (so outside the worker's process group) and orphaned by a double
    fork."""
    if detached:
        read_end, write_end = os.pipe()
        if os.fork() == 0:
            os.setsid()
            pid = os.fork()
            if pid == 0:
                os.execvp("sleep", ["sleep", "3600"])
            os.write(write_end, str(pid).encode())
            os._exit(0)
        os.close(write_end)
        os.wait()
        sleeper_pid = int(os.read(read_end, 64))
    else:
        sleeper_pid = subprocess.Popen(["sleep", "3600"]).pid
    with open(pid_file, "w") as file:
        file.write(str(sleeper_pid))
    if then_hang:
        time.sleep(3600)
    return sleeper_pid


def kill_the_server_then_hang(pid_file):
    with open(pid_file, "w") as file:
        file.write(str(os.getpid()))
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(3600)


def allocate_mib(size_mib):
    return len(bytearray(size_mib << 20))


def oversized_result():
    return "x" * (2 << 20)
'''


@pytest.fixture(scope="module")
def plugin_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a module of misbehaving functions."""
    directory = tmp_path_factory.mktemp("workers-plugin")
    (directory / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE, encoding="utf-8")
    return directory


@pytest.fixture(scope="module")
def plugin(plugin_directory: Path) -> Iterator[str]:
    """The module of misbehaving functions, importable while this test puts its directory on sys.path."""
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(plugin_directory))
        yield PLUGIN_MODULE
    sys.modules.pop(PLUGIN_MODULE, None)


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process `pid` has ended (or is a zombie) within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@pytest.mark.slow
def test_a_json_module_in_the_working_directory_is_not_imported_by_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit(7)\n")
    monkeypatch.chdir(tmp_path)
    with TimeLimitedWorkers("os:getpid", num_workers=1) as workers:
        assert workers.run([()], timeout_s=5).results[0] > 0
    assert not marker.exists()


def test_a_half_written_message_does_not_hold_the_caller_past_the_limit(plugin: str) -> None:
    workers = TimeLimitedWorkers(f"{plugin}:send_half_a_message_then_hang", num_workers=1)
    outcome: dict[str, object] = {}
    thread = threading.Thread(target=lambda: outcome.update(run=workers.run([()], timeout_s=0.5)), daemon=True)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert outcome["run"].results == [NO_RESULT] and outcome["run"].timed_out == 1
    workers.close()


def test_a_result_over_the_message_limit_is_an_error_not_a_long_decode(plugin: str) -> None:
    with TimeLimitedWorkers(f"{plugin}:oversized_result", num_workers=1) as workers:
        with pytest.raises(CallError, match=r"its result takes \d+ bytes as JSON, over the limit of 1048576"):
            workers.run([()], timeout_s=5)


@pytest.mark.slow
def test_an_answer_already_waiting_at_the_deadline_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller was busy past the deadline; the second call had answered long before."""
    import pacs.rewards.workers as workers_module

    calls_to_wait = []

    def busy_after_first_wait(connections: list, timeout: float) -> list:
        ready = real_wait(connections, timeout)
        calls_to_wait.append(ready)
        if len(calls_to_wait) == 1:
            time.sleep(2.0)
        return ready

    real_wait = workers_module.wait
    monkeypatch.setattr(workers_module, "wait", busy_after_first_wait)
    with TimeLimitedWorkers("time:sleep", num_workers=2) as workers:
        outcome = workers.run([(0.0,), (0.5,)], timeout_s=1.0)
    assert outcome.results == [None, None] and outcome.timed_out == 0


def test_threads_sharing_workers_get_their_own_results() -> None:
    errors: list[BaseException] = []

    def run_many(value: int) -> None:
        try:
            for _ in range(20):
                results = workers.run([(value, 0)] * 10, timeout_s=10).results
                assert results == [value] * 10, results
        except BaseException as error:
            errors.append(error)

    with TimeLimitedWorkers("operator:add", num_workers=2) as workers:
        threads = [threading.Thread(target=run_many, args=(value,)) for value in (1, 2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []


SLEEPERS = pytest.mark.parametrize("detached", [False, True], ids=["child", "daemon-in-its-own-session"])


@pytest.mark.slow
@needs_proc
@SLEEPERS
def test_a_timed_out_call_takes_the_processes_it_started_with_it(plugin: str, tmp_path: Path, detached: bool) -> None:
    pid_file = tmp_path / "sleeper"
    with TimeLimitedWorkers(f"{plugin}:start_a_sleeper", num_workers=1) as workers:
        assert workers.run([(str(pid_file), True, detached)], timeout_s=1.0).timed_out == 1
        assert gone(int(pid_file.read_text()))


@pytest.mark.slow
@needs_proc
@SLEEPERS
def test_closing_stops_the_processes_workers_started(plugin: str, tmp_path: Path, detached: bool) -> None:
    workers = TimeLimitedWorkers(f"{plugin}:start_a_sleeper", num_workers=1)
    [sleeper] = workers.run([(str(tmp_path / "sleeper"), False, detached)], timeout_s=5).results
    assert alive(sleeper)
    workers.close()
    assert gone(sleeper)


@pytest.mark.slow
@needs_proc
@SLEEPERS
def test_processes_workers_started_end_when_their_caller_exits(plugin_directory: Path, tmp_path: Path, detached: bool) -> None:
    script = (
        "import sys\nfrom pacs.rewards.workers import TimeLimitedWorkers\n"
        f"sys.path.insert(0, {str(plugin_directory)!r})\n"
        f"workers = TimeLimitedWorkers('{PLUGIN_MODULE}:start_a_sleeper', num_workers=1)\n"
        f"print(*workers.run([({str(tmp_path / 'sleeper')!r}, False, {detached})], timeout_s=5).results, flush=True)\n"
    )
    caller = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert caller.returncode == 0, caller.stderr
    assert gone(int(caller.stdout.split()[0]))


@pytest.mark.slow
def test_a_server_killed_between_runs_is_restarted() -> None:
    with TimeLimitedWorkers("os:getppid", num_workers=1) as workers:
        [server] = workers.run([()], timeout_s=5).results
        os.kill(server, signal.SIGKILL)
        assert gone(server)  # SIGKILL is asynchronous: a call sent before the server ended still reaches its worker
        [new_server] = workers.run([()], timeout_s=5).results
        assert workers.server_deaths == 1
    assert new_server != server


@pytest.mark.slow
@needs_proc
def test_a_worker_in_a_hung_call_dies_with_its_server(plugin: str, tmp_path: Path) -> None:
    pid_file = tmp_path / "worker"
    with TimeLimitedWorkers(f"{plugin}:kill_the_server_then_hang", num_workers=1) as workers:
        outcome = workers.run([(str(pid_file),)], timeout_s=2.0)
        assert outcome.results == [NO_RESULT]
        assert gone(int(pid_file.read_text()))
        assert workers.run([(str(tmp_path / "again"),)], timeout_s=0.5).results == [NO_RESULT]


@pytest.mark.slow
@needs_proc
def test_a_forked_child_does_not_keep_the_workers_alive_after_close() -> None:
    workers = TimeLimitedWorkers("os:getpid", num_workers=2)
    pids = set(workers.run([()] * 8, timeout_s=5).results)
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    try:
        workers.close()
        assert not any(alive(pid) for pid in pids)
    finally:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)


@pytest.mark.slow
@needs_proc
def test_a_dropped_pool_leaves_no_zombie_server() -> None:
    workers = TimeLimitedWorkers("os:getppid", num_workers=1)
    [server] = workers.run([()], timeout_s=5).results
    del workers
    gc.collect()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{server}").exists()


def test_an_infinite_limit_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s must be a positive, finite number of seconds, got inf"):
        TimeLimitedWorkers("os:getpid", num_workers=1).run([()], timeout_s=math.inf)


@pytest.mark.slow
def test_a_path_object_on_sys_path_is_passed_to_the_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sys, "path", [*sys.path, tmp_path])
    with TimeLimitedWorkers("os:getpid", num_workers=1) as workers:
        assert workers.run([()], timeout_s=5).results[0] > 0


@pytest.mark.slow
def test_a_sys_path_longer_than_a_command_line_is_passed_to_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    long_entries = [f"/nonexistent-{index}-{'d' * 100}" for index in range(1500)]
    monkeypatch.setattr(sys, "path", [*sys.path, *long_entries])
    with TimeLimitedWorkers("os:getpid", num_workers=1) as workers:
        assert workers.run([()], timeout_s=5).results[0] > 0


def test_a_worker_past_its_memory_limit_counts_as_crashed(plugin: str) -> None:
    with TimeLimitedWorkers(f"{plugin}:allocate_mib", num_workers=1, memory_limit_mib=256) as workers:
        outcome = workers.run([(768,), (16,)], timeout_s=5)
    assert outcome.results == [NO_RESULT, 16 << 20] and outcome.crashed == 1


def test_the_fork_server_ends_in_silence_when_its_caller_hung_up():
    script = (
        "import socket, pacs.rewards.workers as workers; caller, server = socket.socketpair(); caller.close(); "
        "workers._serve_forks({'function_spec': 'pacs.rewards.registry:default_compute_score', 'memory_limit_mib': None}, "
        "server.fileno())"
    )
    ended = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (ended.returncode, ended.stderr) == (0, "")
