"""Sandbox launcher: sets the cage up, starts the harness in it, reports (stdlib only).

Not imported by rlmap: ``sandbox.py`` runs this file's source with
``python -I -S -c <source> <config-json>``, as root when the host allows it. In order it

1. dies with its caller: ``PR_SET_PDEATHSIG`` = SIGKILL, then checks that the
   caller is still its parent (else it was orphaned before asking, and leaves);
2. with namespaces: ``unshare``\\ s new mount, PID, network and IPC namespaces (the
   system call, no util-linux), makes every mount private, and forks the PID
   namespace's init, which dies with this process (``PR_SET_PDEATHSIG`` again, and
   a lifeline pipe for the instant before it asks). The init builds a private root:
   an empty read-only tmpfs holding read-only binds of the system directories and
   the interpreter's prefix, four device nodes, a fresh ``/proc`` of the new PID
   namespace, and ``/sandbox``, a small tmpfs owned by the sandbox uid that is the
   working directory; then ``chroot`` into it. Without namespaces this process
   plays the init's part, minus the cage;
3. forks the harness's process, which sets the resource limits, joins a session
   keyring of its own (the trainer's keys are no longer possessed), drops to the
   unprivileged uid/gid (no supplementary groups, so no capabilities), forbids
   gaining privileges again (``PR_SET_NO_NEW_PRIVS``), asks for SIGKILL when its
   parent dies, installs a seccomp filter refusing the key-management and ptrace
   system calls (and SysV/POSIX IPC where there is no IPC namespace to hold it),
   writes ``ok keyring=<0|1> filter=<0|1>`` on the status pipe and ``exec``\\ s the
   harness;
4. waits for the harness — reaping orphans meanwhile, as a PID namespace's init
   must — and writes ``exit <status> <cpu seconds>`` on the status pipe.

So whoever kills the caller (a verifier worker past ``feedback.timeout_s``) takes
the whole chain with it: this process by its death signal, the init by its own, and
every process of the PID namespace with the init. The status pipe is close-on-exec,
so the model's code never holds it: what it says is the launcher's word, not the
sample's. A setup failure is written there as ``sandbox setup failed: ...``; it is
a failure of the sandbox, not of the sample.

``{"probe": true}`` instead of a configuration prints what this host allows, as JSON.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import struct
import sys
from typing import Any

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWNET = 0x20000, 0x8000000, 0x20000000, 0x40000000
CAGE = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2
KEYCTL_JOIN_SESSION_KEYRING = 1
SANDBOX_DIR = "/sandbox"

# Per architecture: (AUDIT_ARCH, keyctl, {what the filter refuses: syscall numbers}).
# The x86-64 table also refuses x32 calls (numbers from 2**30) and any other ABI.
_SYSCALLS: dict[str, tuple[int, int, dict[str, tuple[int, ...]]]] = {
    "x86_64": (
        0xC000003E,
        250,
        {
            "keys": (248, 249, 250),  # add_key, request_key, keyctl
            "ptrace": (101, 310, 311, 438),  # ptrace, process_vm_readv/writev, pidfd_getfd
            "ipc": (29, 64, 68, 240),  # shmget, semget, msgget, mq_open
        },
    ),
    "aarch64": (
        0xC00000B7,
        219,
        {
            "keys": (217, 218, 219),
            "ptrace": (117, 270, 271, 438),
            "ipc": (194, 190, 186, 180),
        },
    ),
}


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _die_with_parent(libc: Any, parent: int) -> None:
    """SIGKILL when the parent dies; leave now if it already has (we were orphaned first)."""
    _check(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "PR_SET_PDEATHSIG")
    if os.getppid() != parent:
        os._exit(1)


def _mount(libc: Any, src: str | None, dst: str, fstype: str | None, flags: int, data: str) -> None:
    args = [s.encode() if s is not None else None for s in (src, dst, fstype, data or None)]
    result = libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), args[3])
    _check(result, f"mount {src} on {dst}")


def _bind_readonly(libc: Any, root: str, src: str, device: bool) -> None:
    """Bind ``src`` at the same path under ``root``, read-only (a symlink is copied)."""
    dst = root + src
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.islink(src):
        os.symlink(os.readlink(src), dst)
        return
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        with open(dst, "w"):
            pass
    flags = MS_BIND | MS_NOSUID | (0 if device else MS_NODEV)
    _mount(libc, src, dst, None, flags, "")
    _mount(libc, None, dst, None, flags | MS_REMOUNT | MS_RDONLY, "")


def _private_root(cfg: dict[str, Any]) -> None:
    libc, root = _libc(), cfg["root"]
    _mount(libc, "tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path in cfg["ro_binds"]:
        _bind_readonly(libc, root, path, device=False)
    for path in cfg["devices"]:
        _bind_readonly(libc, root, path, device=True)
    os.makedirs(root + "/proc")
    _mount(libc, "proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "")
    work = root + SANDBOX_DIR
    os.makedirs(work)
    options = [f"size={cfg['limits']['file_bytes']}", "nr_inodes=4096", "mode=700"]
    if cfg["uid"] is not None:
        options += [f"uid={cfg['uid']}", f"gid={cfg['gid']}"]
    _mount(libc, "tmpfs", work, "tmpfs", MS_NOSUID | MS_NODEV, ",".join(options))
    _mount(libc, None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "")
    os.chroot(root)
    os.chdir(SANDBOX_DIR)


def _enter_namespaces(flags: int) -> None:
    """New namespaces for this process (PID: for its next child); mounts stop propagating."""
    libc = _libc()
    _check(libc.unshare(flags), "unshare")
    _mount(libc, None, "/", None, MS_REC | MS_PRIVATE, "")  # else the cage's mounts leak out


def _fork_init() -> None:
    """Fork the PID namespace's init and return in it; this process waits for it, then exits."""
    lifeline_r, lifeline_w = os.pipe()
    init = os.fork()
    if init:
        os.close(lifeline_r)
        os.waitpid(init, 0)
        os._exit(0)
    os.close(lifeline_w)
    _check(_libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "PR_SET_PDEATHSIG")
    # getppid() is 0 across the namespace boundary; the pipe says whether the parent lives
    poller = select.poll()
    poller.register(lifeline_r, select.POLLIN)
    if poller.poll(0):  # POLLHUP: every write end closed, the parent is gone
        os._exit(1)
    os.close(lifeline_r)


def _set_limits(limits: dict[str, int]) -> None:
    # soft = hard: the kernel checks the hard limit first, so the CPU limit is a SIGKILL,
    # not a SIGXCPU the code could catch or ignore.
    for which, value in (
        (resource.RLIMIT_CPU, limits["cpu_seconds"]),
        (resource.RLIMIT_AS, limits["memory_bytes"]),
        (resource.RLIMIT_NPROC, limits["max_processes"]),
        (resource.RLIMIT_FSIZE, limits["file_bytes"]),
        (resource.RLIMIT_NOFILE, 64),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))


def _join_session_keyring(libc: Any) -> bool:
    """A new anonymous session keyring: the caller's keys are no longer possessed.

    False where the host refuses key management (a container's own seccomp profile).
    """
    table = _SYSCALLS.get(os.uname().machine)
    if table is None:
        return False
    return libc.syscall(table[1], KEYCTL_JOIN_SESSION_KEYRING, None) >= 0


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)  # real, effective and saved ids: every capability is gone


def _filter_program(refused: list[int], arch: int, x32: bool) -> bytes:
    """Classic BPF for seccomp: EPERM for ``refused`` and for any other ABI, else allow."""
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    allow, deny = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    checks = [(jge, 0, 0, 0x40000000)] if x32 else []
    checks += [(jeq, 0, 0, nr) for nr in refused]
    program = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, deny), (ld, 0, 0, 0)]
    for i, (code, _, _, k) in enumerate(checks):  # jump over the rest and the allow
        program.append((code, len(checks) - i, 0, k))
    program += [(ret, 0, 0, allow), (ret, 0, 0, deny)]
    return b"".join(struct.pack("HBBI", *insn) for insn in program)


def _install_filter(libc: Any, ipc: bool) -> bool:
    """Refuse keys and ptrace (and IPC when ``ipc``); False where seccomp is unavailable."""
    machine = os.uname().machine
    if machine not in _SYSCALLS:
        return False
    arch, _, groups = _SYSCALLS[machine]
    refused = [*groups["keys"], *groups["ptrace"], *(groups["ipc"] if ipc else ())]
    code = ctypes.create_string_buffer(_filter_program(refused, arch, machine == "x86_64"))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    program = Program(len(code.raw) // 8, ctypes.addressof(code))
    return libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) == 0


def _start_harness(cfg: dict[str, Any], status: int, parent: int) -> None:
    """In the forked child: limits, keyring, privileges, filter, then become the harness."""
    try:
        libc = _libc()
        _set_limits(cfg["limits"])
        keyring = _join_session_keyring(libc)
        if cfg["uid"] is not None:
            _drop_privileges(cfg["uid"], cfg["gid"])
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
        _die_with_parent(libc, parent)  # after setuid, which clears the death signal
        filtered = _install_filter(libc, ipc=not cfg["ipc_namespace"])
        os.write(status, f"ok keyring={int(keyring)} filter={int(filtered)}".encode())
        python = cfg["python"]
        os.execve(python, [python, "-I", "-S", "-c", cfg["boot"], cfg["harness"]], cfg["env"])
    except BaseException as exc:  # report every setup failure; the caller raises it
        os.write(status, f"\nsandbox setup failed: {exc!r}".encode())
    os._exit(127)


def _wait_for(harness: int) -> tuple[int, float]:
    """Reap children (orphans too, when this is a PID namespace's init) until the harness ends."""
    while True:
        pid, status, usage = os.wait4(-1, 0)
        if pid == harness:
            return status, usage.ru_utime + usage.ru_stime


def _probe() -> dict[str, bool]:
    """What this host allows, each tried in a child of its own (nothing here changes)."""

    def works(attempt: Any) -> bool:
        child = os.fork()
        if child == 0:
            try:
                os._exit(0 if attempt() else 1)
            except BaseException:
                os._exit(1)
        return os.waitpid(child, 0)[1] == 0

    libc = _libc()

    def cage(flags: int) -> bool:
        _enter_namespaces(flags)
        return works(lambda: True)  # the PID namespace needs its first child

    def seccomp() -> bool:
        return libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 and _install_filter(libc, True)

    return {
        "namespaces": os.geteuid() == 0 and works(lambda: cage(CAGE)),
        "ipc_namespace": os.geteuid() == 0 and works(lambda: cage(CAGE | CLONE_NEWIPC)),
        "keyring": works(lambda: _join_session_keyring(libc)),
        "filter": works(seccomp),
    }


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("probe"):
        print(json.dumps(_probe()))
        return
    status = int(cfg["status_fd"])
    os.set_inheritable(status, False)
    try:
        _die_with_parent(_libc(), int(cfg["parent"]))
        if cfg["namespaced"]:
            _enter_namespaces(CAGE | (CLONE_NEWIPC if cfg["ipc_namespace"] else 0))
            _fork_init()
            _private_root(cfg)
        else:
            os.chdir(cfg["work"])
    except BaseException as exc:
        os.write(status, f"sandbox setup failed: {exc!r}".encode())
        os._exit(127)
    launcher = os.getpid()
    harness = os.fork()
    if harness == 0:
        _start_harness(cfg, status, launcher)
    wait_status, cpu = _wait_for(harness)
    os.write(status, f"\nexit {os.waitstatus_to_exitcode(wait_status)} {cpu:.3f}".encode())
    os._exit(0)  # as a PID namespace's init, this ends every process left in it


if __name__ == "__main__":
    main()
