"""Run a program nobody trusts (a Python program the model wrote) where it cannot reach the run.

``run_programs(programs, limits)`` runs each program in a sandbox of its own and returns what it
printed and how it ended (`ProgramOutcome`). The python tool (`pacs.rollout.tools`) runs every
call through it, and code-executing rewards are meant to.

What a sandbox is (``sandbox="bwrap"``, the default): a fresh process tree made by bubblewrap
(``bwrap``, the distribution's package) per call, in new user, pid, mount, network, ipc, uts and
cgroup namespaces, started from this process by a thread that waits on it:

- **Files**: a read-only view of what the interpreter needs and nothing else: the system's shared
  libraries (``/usr/lib``, ``/lib``...), the interpreter, its standard library and the packages
  installed beside pacs (`package_dirs`: sympy, numpy..., which model-written math programs
  import; pacs itself hidden under an empty folder), a fresh ``/proc`` and a minimal ``/dev``. No
  home, no working directory, no run folder, data, checkpoints, caches or pacs source. The only
  writable place is ``/tmp``, a private ``tmpfs`` of ``Limits.scratch_mib``, gone with the call.
- **Environment**: none of this process's variables: the program sees only ``HOME=/tmp``,
  ``TMPDIR=/tmp``, ``LANG=C.UTF-8`` and ``PATH`` (`SANDBOX_ENVIRONMENT`), so no token or key.
- **Processes**: the program runs alone in its pid namespace (with bubblewrap's init): it cannot
  see or signal any process of the run. A seccomp filter (`seccomp_filter`), installed before the
  program's first line and after ``no_new_privs``, refuses starting a process (fork, vfork, clone
  without ``CLONE_THREAD``, execve; threads are allowed), tracing or reading another process
  (ptrace, process_vm_*, pidfd_*), mounting, new namespaces, kernel modules, BPF, keyrings,
  io_uring and opening a socket; a refused call fails with EPERM (``PermissionError``).
- **Limits for the whole call**: the call is one process, so its limits are the call's: address
  space (``Limits.memory_mib``, a ``MemoryError`` past it), CPU seconds (the time limit plus one),
  open files, the size of any file (and ``/tmp`` as a whole) at ``Limits.scratch_mib``. The
  wall-clock deadline is kept by the thread here, outside the sandbox, which the program cannot
  see or stop: at the deadline, or once the program has printed more than
  ``Limits.output_bytes``, the sandbox is killed, and with it (``--die-with-parent``, the pid
  namespace's init gone) every process in it.
- **What comes back** is bytes read from the program's output pipe, at most
  ``Limits.output_bytes``, and its exit status; the caller builds its result from those itself.
  Nothing the program does persists into another call.

``sandbox="none"`` runs the same runner without bubblewrap (a fresh interpreter per call, the same
limits, seccomp filter and scrubbed environment, but the trainer's filesystem and process
namespace): for machines whose kernel refuses namespaces, chosen by name and never silently.

`check_sandbox` runs a program once to say, before anything expensive, whether the sandbox can
start here (bubblewrap installed, namespaces allowed), with the fix in its message.
"""

from __future__ import annotations

import errno
import os
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
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

# The runner, run by the sandbox's interpreter as ``python -I -S -B -c RUNNER`` with the limits as
# arguments and, on standard input, a header (two lengths), the seccomp filter and the program. It
# installs the limits and the filter before the program's first line, runs the program in a fresh
# namespace, prints an exception's last traceback line as Qwen2.5-Math's executor does, and exits
# 0 (a plain end, sys.exit(0) included), 1 (the program raised) or 125 (it could not set up).
RUNNER = r"""
import builtins, ctypes, os, resource, struct, sys

def _refuse_setup(reason):
    os.write(2, ("sandbox runner: " + reason + "\n").encode())
    os._exit(125)

def _read_input():
    data = b""
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return data
        data += chunk

def _install(filter_bytes, limits):
    for name, value in zip(("RLIMIT_AS", "RLIMIT_CPU", "RLIMIT_NOFILE", "RLIMIT_FSIZE", "RLIMIT_CORE"), limits):
        if value >= 0:
            resource.setrlimit(getattr(resource, name), (value, value))
    libc = ctypes.CDLL(None, use_errno=True)
    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    buffer = ctypes.create_string_buffer(filter_bytes, len(filter_bytes))
    program = Program(len(filter_bytes) // 8, ctypes.addressof(buffer))
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0:
        _refuse_setup("the seccomp filter was refused: " + os.strerror(ctypes.get_errno()))

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

def _main():
    data = _read_input()
    filter_length, program_length = struct.unpack(">II", data[:8])
    filter_bytes, program = data[8 : 8 + filter_length], data[8 + filter_length :].decode("utf-8", "replace")
    _install(filter_bytes, [int(value) for value in sys.argv[1:6]])
    sys.path.extend(sys.argv[6:])
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout.reconfigure(errors="backslashreplace", line_buffering=True)
    sys.stderr = sys.stdout
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(program, "<program>", "exec"), namespace)
    except SystemExit as stop:
        if stop.code in (0, None):
            _finish(0)
        _finish(1, "SystemExit: " + _safe_str(stop.code))
    except BaseException as error:
        _finish(1, _text(error))
    _finish(0)

_main()
"""


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


def run_programs(programs: Sequence[str], limits: Limits, *, sandbox: str = "bwrap", parallel: int = 2) -> list[ProgramOutcome]:
    """Each of `programs` (Python source) run in a sandbox of its own (module docstring), at most
    `parallel` at once; the outcomes in order. Raises nothing a program does."""
    if sandbox not in SANDBOXES:
        raise ValueError(f"sandbox must be one of {', '.join(SANDBOXES)}, got {sandbox!r}")
    if not programs:
        return []
    command = _command(limits, sandbox)
    filter_bytes = seccomp_filter()

    def run(program: str) -> ProgramOutcome:
        if sandbox == "bwrap":
            return _run_one(command, filter_bytes, program, limits, working_dir=None)
        with tempfile.TemporaryDirectory(prefix="pacs-program-") as working_dir:
            return _run_one(command, filter_bytes, program, limits, working_dir=working_dir)

    if len(programs) == 1 or parallel <= 1:
        return [run(program) for program in programs]
    with ThreadPoolExecutor(max_workers=min(parallel, len(programs))) as pool:
        return list(pool.map(run, programs))


def check_sandbox(sandbox: str) -> None:
    """SandboxUnavailable, naming the cause and the fix, unless `sandbox` runs a program here."""
    if sandbox == "bwrap" and shutil.which("bwrap") is None:
        raise SandboxUnavailable(
            "model-written programs run in bubblewrap (bwrap), which is not installed: install the package "
            "'bubblewrap' (apt-get install bubblewrap, dnf install bubblewrap), or set rollout.tool_sandbox=none "
            "to run them without namespaces (they can then read what the trainer's user can)"
        )
    outcome = run_programs(["print(6 * 7)"], Limits(timeout_s=30.0), sandbox=sandbox)[0]
    if outcome.returncode != 0 or outcome.text().strip() != "42":
        words = outcome.runner_error or outcome.text().strip() or f"exit status {outcome.returncode}"
        raise SandboxUnavailable(
            f"the {sandbox} sandbox for model-written programs cannot start here ({words}); the kernel may refuse "
            "unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, or "
            "user.max_user_namespaces > 0; in a container, allow them), or set rollout.tool_sandbox=none to run "
            "programs without namespaces (they can then read what the trainer's user can)"
        )


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


def _command(limits: Limits, sandbox: str) -> list[str]:
    """The command that runs `RUNNER` under `limits` in `sandbox`."""
    interpreter = os.path.realpath(sys.executable)
    memory = -1 if limits.memory_mib is None else limits.memory_mib << 20
    cpu_s = int(limits.timeout_s) + 2
    runner = [interpreter, "-I", "-S", "-B", "-c", RUNNER, str(memory), str(cpu_s), str(limits.open_files)]
    runner += [str(limits.scratch_mib << 20), "0", *package_dirs()]
    if sandbox == "none":
        return runner
    return [*_bubblewrap_arguments(interpreter, limits.scratch_mib), "--", *runner]


def _bubblewrap_arguments(interpreter: str, scratch_mib: int) -> list[str]:
    arguments = ["bwrap", "--unshare-user", "--uid", "65534", "--gid", "65534", "--disable-userns"]
    arguments += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    arguments += ["--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    for name, value in SANDBOX_ENVIRONMENT.items():
        arguments += ["--setenv", name, value]
    arguments += _interpreter_view(interpreter)
    arguments += ["--proc", "/proc", "--dev", "/dev", "--size", str(scratch_mib << 20), "--tmpfs", "/tmp", "--chdir", "/tmp"]
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


def _run_one(command: list[str], filter_bytes: bytes, program: str, limits: Limits, *, working_dir: str | None) -> ProgramOutcome:
    """One program in a sandbox of its own (in `working_dir` without bubblewrap), from this
    thread, which keeps its deadline."""
    source = program.encode("utf-8", "surrogatepass")
    stdin = os.memfd_create("pacs-program", os.MFD_CLOEXEC)
    try:
        os.write(stdin, _HEADER.pack(len(filter_bytes), len(source)) + filter_bytes + source)
        os.lseek(stdin, 0, os.SEEK_SET)
        environment = (
            SANDBOX_ENVIRONMENT if working_dir is None else {**SANDBOX_ENVIRONMENT, "HOME": working_dir, "TMPDIR": working_dir}
        )
        started = time.monotonic()
        process = subprocess.Popen(
            command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=environment,
            close_fds=True, start_new_session=True, cwd=working_dir,
        )  # fmt: skip
    finally:
        os.close(stdin)
    try:
        output, more_output, timed_out = _read_until_done(process, started + limits.timeout_s, limits.output_bytes)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()
    returncode = None if (timed_out or more_output) else process.returncode
    runner_error = None
    if returncode == RUNNER_FAILED or (returncode not in (0, PROGRAM_RAISED) and output.startswith(b"bwrap:")):
        runner_error = output.decode("utf-8", "replace").strip()
    return ProgramOutcome(output[: limits.output_bytes], more_output, timed_out, returncode, runner_error)


def _read_until_done(process: subprocess.Popen, deadline: float, max_bytes: int) -> tuple[bytes, bool, bool]:
    """(output, more_output, timed_out): what `process` prints until it exits, passes `max_bytes`
    or reaches `deadline` (monotonic seconds)."""
    assert process.stdout is not None
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"".join(chunks), False, True
            if not selector.select(remaining):
                continue
            chunk = os.read(process.stdout.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                return b"".join(chunks), True, False
    try:  # the output is closed: the program has ended, or closed it and goes on
        process.wait(timeout=max(deadline - time.monotonic(), 0))
    except subprocess.TimeoutExpired:
        return b"".join(chunks), False, True
    return b"".join(chunks), False, False


def signal_name(returncode: int) -> str:
    """The name of the signal a negative `returncode` (subprocess's convention) or a shell's
    128 + N reports."""
    number = -returncode if returncode < 0 else returncode - 128
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
