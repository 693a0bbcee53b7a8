"""Run a program nobody trusts (a Python program the model wrote) where it cannot reach the run.

``run_programs(programs, limits)`` runs each program in a sandbox of its own and returns what it
printed and how it ended (`ProgramOutcome`). The python tool (`pacs.rollout.tools`) runs every
call through it, and code-executing rewards are meant to.

What a sandbox is (``sandbox="bwrap"``, the default): bubblewrap (``bwrap``, the distribution's
package) runs a zygote (`ZYGOTE`), a small interpreter of ours in new user, pid, mount, network,
ipc, uts and cgroup namespaces, which forks a child per call; the child makes namespaces of its
own (user, mount, pid, network, ipc, uts) before anything of the program runs, so calls are apart
from one another as from the run:

- **Files**: a read-only view of what the interpreter needs and nothing else: the system's shared
  libraries (``/usr/lib``, ``/lib``...), the interpreter, its standard library and the packages
  installed beside pacs (`package_dirs`: sympy, numpy..., which model-written math programs
  import; pacs itself hidden under an empty folder) and a minimal ``/dev``; ``/proc`` is empty.
  No home, no working directory, no run folder, data, checkpoints, caches or pacs source. The
  only writable place is the call's own ``/tmp``, a ``tmpfs`` of ``Limits.scratch_mib``, gone
  with the call.
- **Environment**: none of this process's variables: the program sees only ``HOME=/tmp``,
  ``TMPDIR=/tmp``, ``LANG=C.UTF-8`` and ``PATH`` (`SANDBOX_ENVIRONMENT`), so no token or key.
- **Processes**: the program is pid 1 of its own pid namespace and uid 0 of its own user
  namespace with every capability dropped: it cannot see or signal any process of the run, of
  the zygote or of another call. A seccomp filter (`seccomp_filter`), installed before the
  program's first line and after ``no_new_privs``, refuses starting a process (fork, vfork, clone
  without ``CLONE_THREAD``, execve; threads are allowed), tracing or reading another process
  (ptrace, process_vm_*, pidfd_*), mounting, new namespaces, kernel modules, BPF, keyrings,
  io_uring and opening a socket; a refused call fails with EPERM (``PermissionError``).
- **Limits for the whole call**: the call is one process, so its limits are the call's: address
  space (``Limits.memory_mib``, a ``MemoryError`` past it), CPU seconds (the time limit plus two),
  open files, the size of any file (and ``/tmp`` as a whole) at ``Limits.scratch_mib``. The
  wall-clock deadline is kept by the calling thread here, outside the sandbox, which the program
  cannot see or stop: at the deadline, or once the program has printed more than
  ``Limits.output_bytes``, it kills the call through a pidfd the zygote handed over, and with it
  every process in the call's namespaces.
- **What comes back** is bytes read from the call's own output pipe, at most
  ``Limits.output_bytes``, and its exit status from the zygote; the caller builds its result from
  those itself. A call is a fork: nothing the program changes reaches the zygote or another call.

``sandbox="none"`` runs the same runner without bubblewrap (a fresh interpreter per call, the same
limits, seccomp filter and scrubbed environment, but the trainer's filesystem and process
namespace): for machines whose kernel refuses namespaces, chosen by name and never silently.

`check_sandbox` runs a program once to say, before anything expensive, whether the sandbox can
start here (bubblewrap installed, namespaces allowed), with the fix in its message.
`ProgramSandbox` keeps its zygotes between `run` calls (the python tool keeps one for its run);
`run_programs` starts and stops one for a single batch.
"""

from __future__ import annotations

import errno
import functools
import os
import queue
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SANDBOXES = ("bwrap", "none")
"""`run_programs`' isolations: ``bwrap`` (bubblewrap's namespaces) or ``none`` (module docstring)."""
SANDBOX_ENVIRONMENT = {"HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"}
"""The only environment a sandboxed program sees."""
RUNNER_FAILED = 125
"""The runner's exit status when it cannot set up the program's limits (never the program's)."""
PROGRAM_RAISED = 1
"""The runner's exit status when the program raised (its last line says what)."""

_HEADER = struct.Struct(">II")
_REFUSED_SYSCALLS = (
    "fork", "vfork", "execve", "execveat", "ptrace", "process_vm_readv", "process_vm_writev",
    "pidfd_open", "pidfd_getfd", "pidfd_send_signal", "kcmp", "mount", "umount2", "pivot_root", "chroot",
    "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "setns", "unshare",
    "kexec_load", "kexec_file_load", "bpf", "perf_event_open", "keyctl", "add_key", "request_key",
    "init_module", "finit_module", "delete_module", "swapon", "swapoff", "reboot", "open_by_handle_at",
    "name_to_handle_at", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "acct",
    "quotactl", "syslog", "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "iopl", "ioperm",
    "uselib", "vhangup", "socket",
)  # fmt: skip
"""System calls the seccomp filter fails with EPERM (module docstring)."""
_CLONE_THREAD = 0x00010000

# The code that runs inside a sandbox: `RUNNER_CODE` installs a call's limits and filter before the
# program's first line, runs the program in a fresh namespace, prints an exception's last traceback
# line as Qwen2.5-Math's executor does, and exits 0 (a plain end, sys.exit(0) included), 1 (the
# program raised) or 125 (it could not set up). `RUNNER` runs it in a fresh interpreter
# (``python -I -S -B -c RUNNER LIMITS... PACKAGE_DIRS...``, the filter and the program on standard
# input); `ZYGOTE` is a sandboxed interpreter that forks a child per call (module docstring).
RUNNER_CODE = r"""
import builtins, ctypes, os, resource, socket, struct, sys

libc = ctypes.CDLL(None, use_errno=True)

def _refuse_setup(reason):
    os.write(1, ("sandbox runner: " + reason + "\n").encode())
    os._exit(125)

def _failed(call):
    return call + ": " + os.strerror(ctypes.get_errno())

def _read_all(fd):
    data = b""
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return data
        data += chunk

def _install(filter_bytes, limits):
    for name, value in zip(("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CORE"), limits):
        if value >= 0:
            resource.setrlimit(getattr(resource, name), (value, value))
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    buffer = ctypes.create_string_buffer(filter_bytes, len(filter_bytes))
    program = Program(len(filter_bytes) // 8, ctypes.addressof(buffer))
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:
        _refuse_setup(_failed("the seccomp filter"))

def _safe_str(value):
    try:
        return str(value)
    except BaseException:
        return ""

def _text(error):
    detail = _safe_str(error)
    try:
        name = type(error).__name__
    except BaseException:
        name = "Exception"
    return name + ": " + detail if detail else name

def _finish(status, line=None):
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    if line is not None:
        try:
            os.write(1, line.encode("utf-8", "backslashreplace"))
        except BaseException:
            pass
    os._exit(status)

def _run(source, filter_bytes, limits, package_dirs):
    _install(filter_bytes, limits)
    sys.path.extend(directory for directory in package_dirs if directory not in sys.path)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(source.decode("utf-8", "replace"), "<program>", "exec"), namespace)
    except SystemExit as stop:
        if stop.code in (0, None):
            _finish(0)
        _finish(1, "SystemExit: " + _safe_str(stop.code))
    except BaseException as error:
        _finish(1, _text(error))
    _finish(0)
"""

RUNNER = (
    RUNNER_CODE
    + r"""
data = _read_all(0)
filter_length, _ = struct.unpack(">II", data[:8])
_run(data[8 + filter_length :], data[8 : 8 + filter_length], [int(value) for value in sys.argv[1:6]], sys.argv[6:])
"""
)

ZYGOTE = (
    RUNNER_CODE
    + r"""
NEW_NAMESPACES = 0x00020000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
NO_SUID, NO_DEV, NO_EXEC = 2, 4, 8

def _write(path, text):
    fd = os.open(path, os.O_WRONLY)
    os.write(fd, text.encode())
    os.close(fd)

def _mount(source, target, kind, flags, options):
    return libc.mount(source, target, kind, flags, options) == 0

def _drop_capabilities():
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
    if libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()) != 0:
        _refuse_setup(_failed("capset"))

def _call(limits, filter_bytes, package_dirs, uid, gid):
    # In the call's first child: namespaces of its own, a private /tmp; the program runs in the
    # second child, pid 1 of the new pid namespace, which dies with the first.
    if libc.unshare(NEW_NAMESPACES) != 0:
        _refuse_setup(_failed("unshare"))
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", "0 %d 1" % uid)
    _write("/proc/self/gid_map", "0 %d 1" % gid)
    if not _mount(b"tmpfs", b"/tmp", b"tmpfs", NO_SUID | NO_DEV, b"size=%d,mode=1777" % limits[3]):
        _refuse_setup(_failed("mount /tmp"))
    pid = os.fork()
    if pid == 0:
        libc.prctl(1, 9, 0, 0, 0)
        if not _mount(b"proc", b"/proc", b"proc", NO_SUID | NO_DEV | NO_EXEC, None):
            if not _mount(b"tmpfs", b"/proc", b"tmpfs", NO_SUID | NO_DEV | NO_EXEC, b"size=4096,mode=555"):
                _refuse_setup(_failed("mount /proc"))
        os.chdir("/tmp")
        source = _read_all(0)
        _drop_capabilities()
        os.closerange(3, 1 << 16)
        _run(source, filter_bytes, limits, package_dirs)
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)

def _serve(connection, preload, package_dirs):
    sys.path.extend(package_dirs)
    for name in preload:
        try:
            __import__(name)
        except Exception:
            pass
    filter_bytes = connection.recv(1 << 20)
    uid, gid = os.getuid(), os.getgid()
    connection.send(b"R")
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(connection, 64, 2)
        except OSError:
            os._exit(0)
        if not message:
            os._exit(0)
        limits = list(struct.unpack(">5q", message))
        pid = os.fork()
        if pid == 0:
            try:
                connection.close()
                for target, fd in ((0, fds[0]), (1, fds[1]), (2, fds[1])):
                    os.dup2(fd, target)
                _call(limits, filter_bytes, package_dirs, uid, gid)
            except BaseException as error:
                _refuse_setup(_text(error))
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        socket.send_fds(connection, [b"S"], [pidfd])
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        connection.send(b"E" + struct.pack(">i", os.waitstatus_to_exitcode(status)))

_serve(socket.socket(fileno=int(sys.argv[1])), [name for name in sys.argv[2].split(",") if name], sys.argv[3:])
"""
)
ZYGOTE_START_TIMEOUT_S = 60.0
"""How long a zygote may take to start (its interpreter, under a loaded machine)."""
KILL_WAIT_S = 10.0
"""How long a killed call's end may take to be reported."""


@dataclass(frozen=True)
class Limits:
    """What one sandboxed call may use (module docstring): `timeout_s` seconds of wall clock (and
    CPU), `memory_mib` MiB of address space (None: no limit), `scratch_mib` MiB in ``/tmp`` and per
    file, `open_files` descriptors, and `output_bytes` bytes of output read back."""

    timeout_s: float
    memory_mib: int | None = 1024
    scratch_mib: int = 64
    open_files: int = 64
    output_bytes: int = 1 << 16


@dataclass(frozen=True)
class ProgramOutcome:
    """How one sandboxed program ended: `output`, the first `Limits.output_bytes` bytes it printed
    (standard output and error together); `more_output`, whether it printed more (it was stopped
    there); `timed_out`, whether it was stopped at its deadline; `returncode`, its exit status
    (negative: killed by that signal; None when it was stopped); `runner_error`, the sandbox's own
    words when it could not start the program (never the program's)."""

    output: bytes
    more_output: bool
    timed_out: bool
    returncode: int | None
    runner_error: str | None = None

    def text(self) -> str:
        """`output` decoded as UTF-8, invalid bytes replaced: always a valid string."""
        return self.output.decode("utf-8", "replace")


class SandboxUnavailable(ValueError):
    """The sandbox cannot start on this machine (the setting that asks for it is unusable here);
    the message names the cause and the fix."""


class ProgramSandbox:
    """Runs model-written programs, each in a sandbox of its own (module docstring), `parallel` at
    once: with ``sandbox="bwrap"`` through `parallel` zygotes, started on the first `run` by a
    thread of this object's own (a zygote dies with the thread that started it: bubblewrap's
    ``--die-with-parent``), and started again when one dies, each
    having imported the modules of `preload` that it can (pure-Python ones: a call's child is a
    fork of the zygote, so a module that starts threads at import is not one to preload); with
    ``"none"``, a fresh interpreter per call. Use as a context manager, or call `close()`."""

    def __init__(self, sandbox: str = "bwrap", *, parallel: int = 2, preload: Sequence[str] = ()):
        if sandbox not in SANDBOXES:
            raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, got {sandbox!r}")
        self.sandbox, self.parallel, self.preload = sandbox, max(1, parallel), tuple(preload)
        self._zygotes: queue.SimpleQueue[_Zygote] | None = None
        self._all: list[_Zygote] = []
        self._starter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pacs-sandbox-starter")
        self._finalizer = weakref.finalize(self, _close_zygotes, self._all, self._starter)

    def __enter__(self) -> ProgramSandbox:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the zygotes (a later `run` starts fresh ones)."""
        _close_zygotes(self._all)
        self._zygotes = None

    def run(self, programs: Sequence[str], limits: Limits) -> list[ProgramOutcome]:
        """Each of `programs` (Python source) run in a sandbox of its own under `limits`; the
        outcomes in order. Raises nothing a program does (SandboxUnavailable when a zygote
        cannot start at all)."""
        if not programs:
            return []
        if self.sandbox == "none":
            call = functools.partial(_run_fresh, limits=limits)
        else:
            self._start_zygotes()
            call = functools.partial(self._run_on_a_zygote, limits=limits)
        if len(programs) == 1 or self.parallel == 1:
            return [call(program) for program in programs]
        with ThreadPoolExecutor(max_workers=min(self.parallel, len(programs))) as pool:
            return list(pool.map(call, programs))

    def _start_zygotes(self) -> None:
        if self._zygotes is None:
            self._zygotes = queue.SimpleQueue()
            for _ in range(self.parallel):
                self._zygotes.put(self._new_zygote())

    def _new_zygote(self) -> _Zygote:
        zygote = self._starter.submit(_Zygote, self.preload).result()
        self._all.append(zygote)
        return zygote

    def _run_on_a_zygote(self, program: str, *, limits: Limits) -> ProgramOutcome:
        zygotes = self._zygotes
        assert zygotes is not None
        zygote = zygotes.get()
        try:
            return zygote.run(program, limits)
        except _ZygoteLost as lost:
            zygote.close()
            self._all.remove(zygote)
            zygote = self._new_zygote()
            return ProgramOutcome(b"", False, False, None, runner_error=f"the sandbox's zygote stopped ({lost})")
        finally:
            zygotes.put(zygote)


def run_programs(programs: Sequence[str], limits: Limits, *, sandbox: str = "bwrap", parallel: int = 2) -> list[ProgramOutcome]:
    """Each of `programs` run in a sandbox of its own (`ProgramSandbox`, started and stopped for
    this call), at most `parallel` at once; the outcomes in order."""
    with ProgramSandbox(sandbox, parallel=parallel) as programs_sandbox:
        return programs_sandbox.run(programs, limits)


def check_sandbox(sandbox: str) -> None:
    """SandboxUnavailable, naming the cause and the fix, unless `sandbox` runs a program here."""
    if sandbox == "bwrap" and shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            "model-written programs run in bubblewrap (bwrap), which is not installed: install the package "
            "'bubblewrap' (apt-get install bubblewrap, dnf install bubblewrap), or set rollout.tool_sandbox=none "
            "to run them without namespaces (they can then read what the trainer's user can)"
        )
    try:
        outcome = run_programs(["print(6 * 7)"], Limits(timeout_s=30.0), sandbox=sandbox, parallel=1)[0]
        words = outcome.runner_error or outcome.text().strip() or f"exit status {outcome.returncode}"
        works = outcome.returncode == 0 and outcome.text().strip() == "42"
    except SandboxUnavailable as error:
        works, words = False, str(error)
    if not works:
        raise SandboxUnavailable(
            f"the {sandbox} sandbox for model-written programs cannot start here ({words}); the kernel may refuse "
            "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or "
            "user.max_user_namespaces > 0; in a container, allow them), or set rollout.tool_sandbox=none to run "
            "programs without namespaces (they can then read what the trainer's user can)"
        )


class _ZygoteLost(Exception):
    """A zygote hung up or broke its protocol."""


class _Zygote:
    """One sandboxed interpreter (`ZYGOTE`, in bubblewrap) that forks a child per call, which makes
    the call's own namespaces; this side hands it the program and the write end of the output
    pipe, gets a pidfd of the call's process back, reads the pipe, kills through the pidfd at the
    deadline, and gets the exit status."""

    def __init__(self, preload: tuple[str, ...]) -> None:
        interpreter = os.path.realpath(sys.executable)
        here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [*_bubblewrap_arguments(interpreter), "--", interpreter, "-I", "-S", "-B", "-c", ZYGOTE]
        with there:
            self.process = subprocess.Popen(
                [*command, str(there.fileno()), ",".join(preload), *package_dirs()], pass_fds=[there.fileno()], env=SANDBOX_ENVIRONMENT,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
            )  # fmt: skip
        self.connection = here
        try:
            self.connection.sendall(seccomp_filter())
            if self._receive(ZYGOTE_START_TIMEOUT_S)[0] != b"R":
                raise _ZygoteLost("it did not say it was ready")
        except (OSError, _ZygoteLost):
            self.close()
            assert self.process.stderr is not None
            words = self.process.stderr.read().decode("utf-8", "replace").strip() or f"exit status {self.process.returncode}"
            raise SandboxUnavailable(f"the sandbox could not start: {words}") from None

    def run(self, program: str, limits: Limits) -> ProgramOutcome:
        """`program` in a child of its own, under `limits`."""
        program_fd = os.memfd_create("pacs-program", os.MFD_CLOEXEC)
        read_end, write_end = os.pipe()
        try:
            os.write(program_fd, program.encode("utf-8", "surrogatepass"))
            os.lseek(program_fd, 0, os.SEEK_SET)
            try:
                socket.send_fds(self.connection, [struct.pack(">5q", *_limit_values(limits))], [program_fd, write_end])
            except OSError as error:
                raise _ZygoteLost(f"cannot hand it a program: {error}") from None
        finally:
            os.close(program_fd)
            os.close(write_end)
        deadline = time.monotonic() + limits.timeout_s
        try:
            started, fds = self._receive(ZYGOTE_START_TIMEOUT_S)
            if started != b"S" or len(fds) != 1:
                raise _ZygoteLost("it did not start the call")
            with os.fdopen(read_end, "rb", buffering=0) as output_pipe:
                read_end = -1
                return self._follow(output_pipe, fds[0], deadline, limits)
        finally:
            if read_end >= 0:
                os.close(read_end)

    def _follow(self, output_pipe, pidfd: int, deadline: float, limits: Limits) -> ProgramOutcome:
        """Read the call's output until it ends, passes its bytes or its deadline; its outcome."""
        try:
            output, more_output, timed_out = _read_output(output_pipe, deadline, limits.output_bytes)
            ended = None if (more_output or timed_out) else self._ended(max(deadline - time.monotonic(), 0.0))
            if ended is None:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                self._ended(KILL_WAIT_S, required=True)
                timed_out = timed_out or not more_output
        finally:
            os.close(pidfd)
        returncode = None if (timed_out or more_output) else ended
        runner_error = output.decode("utf-8", "replace").strip() if returncode == RUNNER_FAILED else None
        return ProgramOutcome(output[: limits.output_bytes], more_output, timed_out, returncode, runner_error)

    def _ended(self, timeout_s: float, *, required: bool = False) -> int | None:
        """The call's exit status, once the zygote reports it within `timeout_s`; None if it has
        not by then (`_ZygoteLost` if `required`)."""
        try:
            message, _ = self._receive(timeout_s)
        except TimeoutError:
            if required:
                raise _ZygoteLost("it did not report a killed call's end") from None
            return None
        if message[:1] != b"E" or len(message) != 5:
            raise _ZygoteLost("it reported an end that is not one")
        return struct.unpack(">i", message[1:])[0]

    def _receive(self, timeout_s: float) -> tuple[bytes, list[int]]:
        self.connection.settimeout(timeout_s)
        try:
            message, fds, _, _ = socket.recv_fds(self.connection, 64, 1)
        except TimeoutError:
            raise
        except OSError as error:
            raise _ZygoteLost(str(error)) from None
        if not message:
            raise _ZygoteLost("it hung up")
        return message, fds

    def close(self) -> None:
        self.connection.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def _close_zygotes(zygotes: list[_Zygote], starter: ThreadPoolExecutor | None = None) -> None:
    while zygotes:
        zygotes.pop().close()
    if starter is not None:
        starter.shutdown(wait=False)


def _limit_values(limits: Limits) -> list[int]:
    """The runner's limits: address space and file size in bytes (-1: none), CPU seconds, open files, core size."""
    memory = -1 if limits.memory_mib is None else limits.memory_mib << 20
    return [memory, int(limits.timeout_s) + 2, limits.open_files, limits.scratch_mib << 20, 0]


@cache
def seccomp_filter() -> bytes:
    """The compiled seccomp program (BPF, this machine's architecture) of `_REFUSED_SYSCALLS`,
    clone without ``CLONE_THREAD`` (EPERM) and clone3 (ENOSYS, so that threads are made with
    clone, whose flags the filter can read); every other call allowed."""
    import pyseccomp as seccomp

    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    for name in _REFUSED_SYSCALLS:
        try:
            rules.add_rule(seccomp.ERRNO(errno.EPERM), name)
        except (OSError, ValueError, RuntimeError):  # not a system call of this architecture
            continue
    rules.add_rule(seccomp.ERRNO(errno.EPERM), "clone", seccomp.Arg(0, seccomp.MASKED_EQ, _CLONE_THREAD, 0))
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as compiled:
        rules.export_bpf(compiled)
        compiled.seek(0)
        return compiled.read()


def _bubblewrap_arguments(interpreter: str) -> list[str]:
    """bwrap's arguments for a zygote: its namespaces (its calls make their own inside), a
    read-only view of `interpreter`, an empty /tmp for each call's own, the environment scrubbed."""
    arguments = ["bwrap", "--unshare-user", "--uid", "65534", "--gid", "65534"]
    arguments += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    arguments += ["--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for name, value in SANDBOX_ENVIRONMENT.items():
        arguments += ["--setenv", name, value]
    arguments += _interpreter_view(interpreter)
    arguments += ["--proc", "/proc", "--dev", "/dev", "--dir", "/tmp", "--chdir", "/"]
    return [*arguments, "--remount-ro", "/dev", "--remount-ro", "/"]


@cache
def _interpreter_view(interpreter: str) -> tuple[str, ...]:
    """bwrap arguments for a read-only view of the system's libraries and of `interpreter` with its
    standard library and `package_dirs` (pacs hidden in them; the base interpreter's own
    site-packages hidden when it is not one of them)."""
    view: list[str] = []
    for system_dir in ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/lib32", "/lib32"):
        path = Path(system_dir)
        if path.is_symlink():
            view += ["--symlink", os.readlink(path), system_dir]
        elif path.is_dir():
            view += ["--ro-bind", system_dir, system_dir]
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    packages = [Path(directory) for directory in package_dirs()]
    for needed in (Path(sys.base_prefix).resolve() / "lib", stdlib, Path(interpreter), *packages):
        if not any(str(needed).startswith(bound + "/") for bound in ("/usr/lib", "/usr/lib64", "/lib", "/lib64")):
            view += ["--ro-bind", str(needed), str(needed)]
    base_site_packages = stdlib / "site-packages"
    hidden = [base_site_packages] if base_site_packages.is_dir() and base_site_packages not in packages else []
    hidden += [directory / "pacs" for directory in packages if (directory / "pacs").is_dir()]
    for directory in hidden:  # an empty, read-only folder over it
        view += ["--tmpfs", str(directory), "--remount-ro", str(directory)]
    return tuple(view)


@cache
def package_dirs() -> tuple[str, ...]:
    """The folders of the packages installed beside pacs (this interpreter's purelib and platlib),
    which a sandboxed program may import from, read-only."""
    paths = sysconfig.get_paths()
    return tuple(dict.fromkeys(str(Path(paths[name]).resolve()) for name in ("purelib", "platlib") if Path(paths[name]).is_dir()))


def _run_fresh(program: str, *, limits: Limits) -> ProgramOutcome:
    """`program` in a fresh interpreter (``sandbox="none"``) in an empty temporary folder, from
    this thread, which keeps its deadline."""
    interpreter = os.path.realpath(sys.executable)
    command = [interpreter, "-I", "-S", "-B", "-c", RUNNER, *map(str, _limit_values(limits)), *package_dirs()]
    filter_bytes, source = seccomp_filter(), program.encode("utf-8", "surrogatepass")
    stdin = os.memfd_create("pacs-program", os.MFD_CLOEXEC)
    with tempfile.TemporaryDirectory(prefix="pacs-program-") as working_dir:
        try:
            os.write(stdin, _HEADER.pack(len(filter_bytes), len(source)) + filter_bytes + source)
            os.lseek(stdin, 0, os.SEEK_SET)
            environment = {**SANDBOX_ENVIRONMENT, "HOME": working_dir, "TMPDIR": working_dir}
            started = time.monotonic()
            process = subprocess.Popen(
                command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment,
                close_fds=True, start_new_session=True, cwd=working_dir,
            )  # fmt: skip
        finally:
            os.close(stdin)
        assert process.stdout is not None
        try:
            output, more_output, timed_out = _read_output(process.stdout, started + limits.timeout_s, limits.output_bytes)
            if not (more_output or timed_out):
                try:
                    process.wait(timeout=max(started + limits.timeout_s - time.monotonic(), 0))
                except subprocess.TimeoutExpired:
                    timed_out = True
        finally:
            if process.poll() is None:
                process.kill()
            process.wait()
            process.stdout.close()
    returncode = None if (timed_out or more_output) else process.returncode
    runner_error = output.decode("utf-8", "replace").strip() if returncode == RUNNER_FAILED else None
    return ProgramOutcome(output[: limits.output_bytes], more_output, timed_out, returncode, runner_error)


def _read_output(pipe, deadline: float, max_bytes: int) -> tuple[bytes, bool, bool]:
    """(output, more_output, timed_out): what comes out of `pipe` until every writer has closed it
    (the program ended), it passes `max_bytes`, or `deadline` (monotonic seconds) passes."""
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(pipe, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"".join(chunks), False, True
            if not selector.select(remaining):
                continue
            chunk = os.read(pipe.fileno(), 1 << 16)
            if not chunk:
                return b"".join(chunks), False, False
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                return b"".join(chunks), True, False


def signal_name(returncode: int) -> str:
    """The name of the signal a negative `returncode` (subprocess's convention) or a shell's
    128 + N reports."""
    number = -returncode if returncode < 0 else returncode - 128
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
