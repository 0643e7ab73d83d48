"""A sandbox for model-written Python: run it against unit tests, contained.

``run_python(code, tests, limits)`` runs ``code`` in one fresh interpreter and
``tests`` in another that calls into it (``python -I -S``: no site-packages, no
``PYTHON*`` variables, no user directories) and says whether every test ran and
passed. What contains it, from the outside in:

- **wall clock** — the parent kills the whole sandbox at ``wall_seconds``;
- **resource limits** (``setrlimit``, per process) — CPU seconds (a SIGKILL at the
  limit), address space (``RLIMIT_AS``), processes and threads (``RLIMIT_NPROC``),
  file size (``RLIMIT_FSIZE``), open files, no core dumps;
- **an unprivileged uid** when the caller is root — Linux does not enforce
  ``RLIMIT_NPROC`` for root, so the code runs as a uid of its own
  (``2**30 + pid·256 + run``), with no groups, no capabilities and
  ``PR_SET_NO_NEW_PRIVS``; ``RLIMIT_NPROC`` then bounds a fork bomb, and file
  permissions apply;
- **namespaces** (root) — a new network namespace (only a loopback that is down: no
  connection, no DNS), a new PID namespace (the code cannot see or signal other
  processes, and every process in it dies with it), a new IPC namespace (SysV shared
  memory, queues and semaphores, and POSIX queues, die with it) and a new mount
  namespace in which the code is ``chroot``-ed into a private read-only root: the
  system directories and the interpreter, read-only; four device nodes; a fresh
  ``/proc``; and ``/sandbox``, its working directory, a tmpfs of ``file_bytes`` that
  vanishes with the namespace. The host's ``/tmp``, ``/root``, ``/home``, the
  repository and everything else are not there at all;
- **a session keyring of its own and a seccomp filter** (any user) — the trainer's
  keys are not possessed, and ``add_key``/``keyctl``/``request_key``, ``ptrace``,
  ``process_vm_*`` and ``pidfd_getfd`` are refused (so are the calls that create IPC
  objects where no IPC namespace would take them away);
- **two processes** — the tests run in a process the code never ran in, and call into
  the code's process for answers that come back as data (``_sandbox_harness.py``):
  nothing the code does to its interpreter changes what the tests see;
- **output** — stdout and stderr together are read up to ``output_bytes``; past
  that the sandbox is killed;
- **environment** — only ``PATH``, ``LANG``/``LC_ALL``, ``HOME`` and ``TMPDIR``;
- **a temporary directory** on the host, removed afterwards whatever happened; a run
  returns only once no process of it is left (by the sandbox's uid, or the directory's
  name in a command line), killing any still there.

Without root (or without namespace or seccomp support) the sandbox degrades to
what the OS allows and says so in ``SandboxResult.isolation``; as root it refuses
to run the code at all when it cannot drop privileges (``SandboxError``). Linux only.

Processes: this one → the launcher (``_sandbox_launcher.py``: root; dies with its
caller, makes the namespaces) → the PID namespace's init (the launcher's fork: builds
the private root, reaps, reports the exit on a pipe the code never holds) → the
test process (``_sandbox_harness.py``: the unprivileged uid, under the limits, the
filter; runs the tests) → the solution process (its fork, made before the payload is
read; runs the code). Each dies with its parent (``PR_SET_PDEATHSIG``), so killing
the caller — a verifier worker past ``feedback.timeout_s`` — takes everything down;
``sweep`` makes that certain and removes what a killed caller left on disk.
docs/verifiers.md has the table of what each host enforces.

A pass needs proof that the tests completed: the test process prints a random
nonce, which the code's process never holds, only after every test passed, and
exits 0. Exiting early, exit hooks, fake "OK" lines, rigged objects, patched test
machinery and frames searched for the nonce all fail. What remains possible — tests
that let the code judge itself, answers that merely fit the tests — is in
docs/verifiers.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import marshal
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Reason = Literal[
    "passed",
    "tests_failed",
    "solution_error",
    "exited_early",
    "timeout",
    "cpu_limit",
    "memory_limit",
    "output_limit",
    "crashed",
]
"""Why a run ended: ``passed`` is the only success."""


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up or cleaned up: an infrastructure failure."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one run may use. Each limit ends the run as a failure of the sample."""

    wall_seconds: float = 10.0
    """Wall-clock time from start to exit, interpreter start-up included."""
    cpu_seconds: int = 5
    """CPU time of each process (``RLIMIT_CPU``, whole seconds); a SIGKILL at the limit."""
    memory_bytes: int = 1024 * 2**20
    """Address space of each process (``RLIMIT_AS``); the interpreter needs ~50 MiB."""
    max_processes: int = 16
    """Processes and threads of the sandbox's uid (``RLIMIT_NPROC``), the first included."""
    output_bytes: int = 2**20
    """stdout and stderr together; the run is killed when it writes more."""
    file_bytes: int = 16 * 2**20
    """Largest file (``RLIMIT_FSIZE``) and, with namespaces, the working directory's size."""

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds", "memory_bytes", "max_processes"):
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"SandboxLimits.{name} must be positive, got {getattr(self, name)}"
                )
        if self.output_bytes <= 0 or self.file_bytes <= 0:
            raise ValueError("SandboxLimits.output_bytes and file_bytes must be positive")


@dataclass(frozen=True)
class Isolation:
    """Which containment this host allowed for a run (the limits always apply)."""

    network: bool
    """A new, empty network namespace: no connection leaves the sandbox."""
    pid_namespace: bool
    """A new PID namespace: other processes are invisible, and all die with the sandbox."""
    private_root: bool
    """chroot into a private read-only root with a tmpfs working directory."""
    uid: int | None
    """The unprivileged uid the code ran as, or None when it ran as the caller."""
    ipc_namespace: bool
    """A new IPC namespace: SysV shared memory, queues and semaphores, and POSIX queues,
    made by the code die with the run."""
    session_keyring: bool
    """A session keyring of its own: the trainer's session keys are not possessed."""
    syscall_filter: bool
    """seccomp refuses key management, ptrace and ``process_vm_*``, and, without an IPC
    namespace, the calls that create IPC objects (which would outlive the run)."""


@dataclass(frozen=True)
class SandboxResult:
    """The outcome of one run."""

    passed: bool
    """True only if the harness proved that every test ran and passed."""
    reason: Reason
    """Why the run ended (``passed`` when it passed)."""
    returncode: int | None
    """Exit status (negative: killed by that signal)."""
    stdout_tail: str
    """The last few KiB of stdout."""
    stderr_tail: str
    """The last few KiB of stderr (tracebacks, the harness's account of a failure)."""
    wall_seconds: float
    """Wall-clock duration."""
    cpu_seconds: float
    """CPU time of the processes that were waited for (user + system)."""
    isolation: Isolation = field(repr=False)
    """The containment that applied."""


_TAIL = 4096
_SYSTEM_PATHS = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
)
_DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")
_UID_BASE, _UID_SPAN = 2**30, 2**30
_EXIT_REASONS: dict[int, Reason] = {
    1: "tests_failed",
    2: "solution_error",
    3: "memory_limit",
    4: "exited_early",
    0: "exited_early",  # exit 0 without the nonce: the code left before the tests finished
}
BOOT = "import marshal, sys; exec(marshal.loads(bytes.fromhex(sys.argv.pop(1))))"
"""``python -I -S -c BOOT <bytecode> <args>`` runs a script compiled by this very interpreter
(``host.python`` is ``sys.executable``), so its marshal format is this one's."""
_run_ids = itertools.count()  # with the pid, makes each run's uid unique on this host


@dataclass(frozen=True)
class _Host:
    """What this host allows; probed once per process (``_sandbox_launcher.py``'s probe)."""

    python: str
    root: bool
    namespaces: bool
    ipc_namespace: bool
    keyring: bool
    syscall_filter: bool
    unique_uids: bool


def run_python(code: str, tests: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code`` then ``tests`` in the sandbox; see the module docstring.

    ``tests`` is trusted (a reference): it must compile, else SyntaxError. Raises
    SandboxError when the sandbox cannot be set up; anything the code does is
    reported in the result instead.
    """
    limits = limits or SandboxLimits()
    compile(tests, "<tests>", "exec")  # a broken reference is a config error, not a 0
    host = _host()
    isolation = _isolation(host)
    base = Path(tempfile.mkdtemp(prefix=f"rlmap-sandbox-{os.getpid()}-"))  # pid: whose it is
    try:
        return _run(code, tests, limits, host, isolation, base)
    finally:
        # the launcher is reaped, but its PID namespace's init (or a forked launcher) may
        # still be dying: wait until no process of this run is left, then remove its files
        uid = isolation.uid if host.unique_uids else None
        marker = base.name.encode()  # ASCII, unique; in the launcher's (and its forks') argv
        _kill_until_gone(lambda pid, owner: owner == uid or marker in _cmdline(pid), str(base))
        shutil.rmtree(base, onerror=_force_remove)


def host_isolation() -> Isolation:
    """The containment a run on this host gets (``uid`` is a sample: each run has its own).

    Raises SandboxError where ``run_python`` would refuse to run at all.
    """
    return _isolation(_host())


def _run(
    code: str, tests: str, limits: SandboxLimits, host: _Host, iso: Isolation, base: Path
) -> SandboxResult:
    work = "/sandbox" if iso.private_root else str(base / "work")
    if not iso.private_root:
        os.mkdir(work, 0o700)
        if iso.uid is not None:
            os.chown(work, iso.uid, iso.uid)
    nonce = os.urandom(16).hex()
    payload = json.dumps({"code": code, "tests": tests, "nonce": nonce}).encode()
    status_r, status_w = os.pipe()
    cmd = [host.python, "-I", "-S", "-c", BOOT, _compiled("_sandbox_launcher.py")]
    cmd.append(json.dumps(_launch_config(host, iso, limits, base, work, status_w)))
    start = time.monotonic()
    proc = _spawn(cmd, base, work, status_r, status_w)
    stop: Reason | None = "crashed"  # if supervising fails, the sandbox is killed at once
    try:
        stop, streams = _supervise(proc, payload, status_r, limits, start)
    finally:
        # a limit already hit: kill now; else wait for the exit until the wall limit
        timed_out = _end(proc, start + limits.wall_seconds if stop is None else 0.0)
        os.close(status_r)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    out, err = streams.out.decode(errors="replace"), streams.err.decode(errors="replace")
    returncode, cpu, obtained = _exit_report(bytes(streams.status), err)
    proved = nonce in out
    reason = stop or ("timeout" if timed_out else _reason(returncode, cpu, limits, proved))
    return SandboxResult(
        passed=reason == "passed",
        reason=reason,
        returncode=returncode,
        stdout_tail=out.replace(nonce, "<nonce>"),
        stderr_tail=err,
        wall_seconds=time.monotonic() - start,
        cpu_seconds=cpu,
        isolation=dataclasses.replace(iso, **obtained),
    )


def _spawn(
    cmd: list[str], base: Path, work: str, status_r: int, status_w: int
) -> subprocess.Popen[bytes]:
    """Start the launcher in a session of its own; the status pipe's write end goes to it."""
    try:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=base,
            env=_environment(work),
            start_new_session=True,
            pass_fds=(status_w,),
        )
    except OSError as exc:
        os.close(status_r)
        raise SandboxError(f"sandbox did not start: {exc}") from exc
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)


@dataclass
class _Streams:
    """What comes back from the sandbox while it runs."""

    out: bytearray = field(default_factory=bytearray)
    """Tail of stdout."""
    err: bytearray = field(default_factory=bytearray)
    """Tail of stderr."""
    status: bytearray = field(default_factory=bytearray)
    """The launcher's status pipe, whole (a few bytes)."""
    total: int = 0
    """Bytes of stdout and stderr so far."""

    def read(self, fd: int, buf: bytearray, counted: bool) -> bool:
        """Take what ``fd`` has now; False at end of file."""
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            return True
        buf += chunk
        if counted:
            self.total += len(chunk)
            del buf[:-_TAIL]
        return bool(chunk)

    def drain(self, fd: int, buf: bytearray, counted: bool, cap: int) -> None:
        """Take everything ``fd`` holds now (up to ``cap`` bytes in all)."""
        while self.total <= cap:
            before = len(buf), self.total
            if not self.read(fd, buf, counted) or (len(buf), self.total) == before:
                return


def _supervise(
    proc: subprocess.Popen[bytes],
    payload: bytes,
    status_r: int,
    limits: SandboxLimits,
    start: float,
) -> tuple[Reason | None, _Streams]:
    """Feed stdin and read everything until the harness is reported gone or a limit is hit."""
    assert proc.stdin and proc.stdout and proc.stderr
    streams, stdin = _Streams(), proc.stdin.fileno()
    sources = {proc.stdout.fileno(): streams.out, proc.stderr.fileno(): streams.err}
    sources[status_r] = streams.status
    pending = memoryview(payload)
    stop: Reason | None = None
    with selectors.DefaultSelector() as sel:
        for fd in (*sources, stdin):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_WRITE if fd == stdin else selectors.EVENT_READ)
        while sel.get_map() and stop is None:
            left = start + limits.wall_seconds - time.monotonic()
            if left <= 0:
                stop = "timeout"
                break
            for key, _ in sel.select(left):
                if key.fd == stdin:
                    pending = _feed(stdin, pending)
                    if not pending:
                        sel.unregister(stdin)
                        proc.stdin.close()
                elif not streams.read(key.fd, sources[key.fd], key.fd != status_r):
                    sel.unregister(key.fd)
            if b"\nexit " in streams.status:  # the harness is gone; its output is in the pipes
                for fd, buf in sources.items():
                    streams.drain(fd, buf, fd != status_r, limits.output_bytes)
                stop = "output_limit" if streams.total > limits.output_bytes else None
                break
            if streams.total > limits.output_bytes:
                stop = "output_limit"
    streams.read(status_r, streams.status, False)  # it says "ok" before the code runs
    return stop, streams


def _feed(fd: int, pending: memoryview) -> memoryview:
    """Write what the pipe takes now; a sandbox that stopped reading gets nothing more."""
    try:
        return pending[os.write(fd, pending[:65536]) :]
    except (BrokenPipeError, BlockingIOError):
        return pending[:0]


def _end(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    """Wait for the exit until ``deadline``, kill the process group, reap.

    Returns whether the deadline passed first.
    """
    timed_out = True
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            timed_out = False
            break
        time.sleep(0.005)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # still unreaped: the group id is still ours
    proc.wait()
    return timed_out


def _exit_report(status: bytes, err: str) -> tuple[int | None, float, dict[str, bool]]:
    """The launcher's report: (harness exit status or None, its CPU seconds, what the
    harness obtained: ``session_keyring``, ``syscall_filter``).

    Raises SandboxError when the launcher failed before the harness started.
    """
    text = status.decode(errors="replace")
    if not text.startswith("ok ") or "sandbox setup failed" in text:
        raise SandboxError(f"sandbox did not start: {text} {err}")
    lines = text.splitlines()
    flags = dict(word.split("=", 1) for word in lines[0].split()[1:])
    obtained = {
        "session_keyring": flags.get("keyring") == "1",
        "syscall_filter": flags.get("filter") == "1",
    }
    for line in lines:
        if line.startswith("exit "):
            _, code, cpu = line.split()
            return int(code), float(cpu), obtained
    return None, 0.0, obtained


def _reason(returncode: int | None, cpu: float, limits: SandboxLimits, proved: bool) -> Reason:
    if returncode == 0 and proved:
        return "passed"
    if returncode in _EXIT_REASONS:
        return _EXIT_REASONS[returncode]
    killed = returncode in (-signal.SIGKILL, -signal.SIGXCPU)
    return "cpu_limit" if killed and cpu >= limits.cpu_seconds - 0.05 else "crashed"


def _launch_config(
    host: _Host, iso: Isolation, limits: SandboxLimits, base: Path, work: str, status_fd: int
) -> dict[str, object]:
    binds = _binds(host.python) if iso.private_root else []
    return {
        "status_fd": status_fd,
        "parent": os.getpid(),  # the launcher leaves at once if it is not its parent
        "namespaced": iso.private_root,
        "ipc_namespace": iso.ipc_namespace,
        "root": str(base),
        "work": work,
        "ro_binds": binds,
        "devices": [d for d in _DEVICES if os.path.exists(d)],
        "uid": iso.uid,
        "gid": iso.uid,
        "python": host.python,
        "boot": BOOT,
        "harness": _compiled("_sandbox_harness.py"),
        "env": _environment(work),
        "limits": {
            "cpu_seconds": limits.cpu_seconds,
            "memory_bytes": limits.memory_bytes,
            "max_processes": limits.max_processes,
            "file_bytes": limits.file_bytes,
        },
    }


def _binds(python: str) -> list[str]:
    """System paths and the interpreter's prefix, outermost first, none inside another."""
    chosen: list[str] = []
    wanted = [*_SYSTEM_PATHS, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python)]
    for path in wanted:
        if not os.path.lexists(path):
            continue
        real = path if path in _SYSTEM_PATHS else os.path.realpath(path)
        dirs = [c for c in chosen if not os.path.islink(c)]
        if not any(real == c or real.startswith(c.rstrip("/") + "/") for c in dirs):
            chosen.append(real)
    return chosen


def _environment(work: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": work,
        "TMPDIR": work,
    }


@functools.cache
def _compiled(name: str) -> str:
    """A sibling script as marshalled bytecode (hex), for ``BOOT``: compiled once per process,
    not at every start (the harness takes ~10 ms to compile)."""
    source = Path(__file__).with_name(name).read_text()
    return marshal.dumps(compile(source, name, "exec")).hex()


@functools.cache
def _host() -> _Host:
    python = os.path.realpath(sys.executable)
    probe = [python, "-I", "-S", "-c", BOOT, _compiled("_sandbox_launcher.py"), '{"probe": true}']
    found = subprocess.run(probe, capture_output=True, timeout=60, check=False)
    allowed = json.loads(found.stdout) if found.returncode == 0 else {}
    return _Host(
        python=python,
        root=os.geteuid() == 0,
        namespaces=bool(allowed.get("namespaces")),
        ipc_namespace=bool(allowed.get("ipc_namespace")),
        keyring=bool(allowed.get("keyring")),
        syscall_filter=bool(allowed.get("filter")),
        unique_uids=_unique_uids(),
    )


@functools.cache
def _unique_uids() -> bool:
    """Whether the uids of every run's own (``2**30`` and up) exist in this user namespace."""
    return all(_mapped(f"/proc/self/{m}", _UID_BASE, _UID_SPAN) for m in ("uid_map", "gid_map"))


def _mapped(path: str, first: int, count: int) -> bool:
    """Whether ids [first, first + count) are mapped in this user namespace."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        inside, _, length = (int(x) for x in line.split())
        if inside <= first and first + count <= inside + length:
            return True
    return False


def _isolation(host: _Host) -> Isolation:
    if not sys.platform.startswith("linux"):
        raise SandboxError(f"the code sandbox needs Linux (here: {sys.platform})")
    kernel = {"session_keyring": host.keyring, "syscall_filter": host.syscall_filter}
    cage = {"network": False, "pid_namespace": False, "private_root": False}
    if not host.root:
        return Isolation(**cage, uid=None, ipc_namespace=False, **kernel)
    uid = _uid_range(os.getpid()) + next(_run_ids) % 256
    if not host.unique_uids:
        uid = 65534  # shared with other runs: their NPROC budgets add up
    if host.namespaces:
        cage = dict.fromkeys(cage, True)
        return Isolation(**cage, uid=uid, ipc_namespace=host.ipc_namespace, **kernel)
    if not all(_others_can_use(p) for p in (host.python, sys.base_prefix)):
        raise SandboxError(
            f"refusing to run model code as root: {host.python} is not usable by an "
            "unprivileged uid and namespaces are unavailable"
        )
    return Isolation(**cage, uid=uid, ipc_namespace=False, **kernel)


def _uid_range(pid: int) -> int:
    """The first of the 256 uids the runs of process ``pid`` use (unique uids only)."""
    return _UID_BASE + (pid % 2**22) * 256


def _others_can_use(path: str) -> bool:
    """Whether a uid with no special rights can reach ``path`` (and read/run it)."""
    target = Path(os.path.realpath(path))
    if not all(os.stat(d).st_mode & 0o001 for d in target.parents):
        return False
    return bool(os.stat(target).st_mode & 0o004)


def _kill_until_gone(match: Callable[[int, int], bool], whose: str) -> None:
    """SIGKILL every live process ``match(pid, uid)`` selects until none is left."""
    for _ in range(200):
        pids = [pid for pid, uid in _processes() if match(pid, uid)]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    raise SandboxError(f"sandbox processes of {whose} survived SIGKILL")


def _pids_of(uid: int) -> list[int]:
    return [pid for pid, owner in _processes() if owner == uid]


def _processes() -> Iterator[tuple[int, int]]:
    """(pid, real uid) of every live process (zombies have exited: skipped)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("State", "").strip().startswith("Z"):
            continue
        yield int(entry), int(fields.get("Uid", "-1 ").split()[0])


def sweep(owner: int) -> None:
    """Kill every sandbox process that process ``owner`` started; remove its temporary dirs.

    For a caller killed mid-run — a verifier worker past ``feedback.timeout_s`` — whose
    own clean-up never ran. Its launchers die with it (``PR_SET_PDEATHSIG``) and the PID
    namespaces with them; the sweep makes that certain, kills what the code left
    behind without namespaces (by uid: each caller's runs use a range of their own), and
    removes the temporary directories, which nobody else would. Cheap: one pass over
    ``/proc`` when nothing is left.
    """
    if not os.path.isdir("/proc"):
        return  # not Linux: no sandbox ever ran
    marker = f"rlmap-sandbox-{owner}-".encode()  # in each launcher's command line
    first = _uid_range(owner) if os.geteuid() == 0 and _unique_uids() else None

    def ours(pid: int, uid: int) -> bool:
        return (first is not None and first <= uid < first + 256) or marker in _cmdline(pid)

    _kill_until_gone(ours, f"process {owner}")
    for path in Path(tempfile.gettempdir()).glob(f"rlmap-sandbox-{owner}-*"):
        shutil.rmtree(path, onerror=_force_remove)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _force_remove(func: object, path: str, exc_info: object) -> None:
    """rmtree's error hook: a directory the code made unwritable is made writable again."""
    os.chmod(os.path.dirname(path), 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        os.chmod(path, 0o700)
        shutil.rmtree(path, onerror=_force_remove)
    else:
        os.unlink(path)
