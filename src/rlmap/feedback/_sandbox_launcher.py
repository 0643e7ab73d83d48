"""Sandbox launcher: sets the cage up, starts the harness in it, reports (stdlib only).

Not imported by rlmap: ``sandbox.py`` runs this file's source with
``python -I -S -c <source> <config-json>``, as root inside fresh mount, PID and
network namespaces (``unshare``) when the host allows it, else as a plain child.
In order it

1. builds a private root (namespaces only): an empty read-only tmpfs holding
   read-only binds of the system directories and the interpreter's prefix, four
   device nodes, a fresh ``/proc`` of the new PID namespace, and ``/sandbox``, a
   small tmpfs owned by the sandbox uid that is the working directory; then
   ``chroot`` into it;
2. forks the harness's process, which sets the resource limits, drops to the
   unprivileged uid/gid (no supplementary groups, so no capabilities), forbids
   gaining privileges again (``PR_SET_NO_NEW_PRIVS``), asks for SIGKILL when the
   launcher dies, writes ``ok`` on the status pipe and ``exec``s the harness;
3. waits for the harness — reaping orphans meanwhile, as a PID namespace's init
   must — and writes ``exit <status> <cpu seconds>`` on the status pipe.

The status pipe is close-on-exec, so the model's code never holds it: what it
says is the launcher's word, not the sample's. A setup failure is written there
as ``sandbox setup failed: ...``; it is a failure of the sandbox, not of the sample.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import sys
from typing import Any

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND = 32, 4096
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
SANDBOX_DIR = "/sandbox"


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _mount(libc: Any, src: str | None, dst: str, fstype: str | None, flags: int, data: str) -> None:
    args = [s.encode() if s is not None else None for s in (src, dst, fstype, data or None)]
    if libc.mount(args[0], args[1], args[2], ctypes.c_ulong(flags), args[3]) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {dst}: {os.strerror(err)}")


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


def _drop_privileges(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)  # real, effective and saved ids: every capability is gone
    libc = _libc()
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _start_harness(cfg: dict[str, Any], status: int) -> None:
    """In the forked child: limits, privileges, then become the harness."""
    try:
        _set_limits(cfg["limits"])
        if cfg["uid"] is not None:
            _drop_privileges(cfg["uid"], cfg["gid"])
        os.write(status, b"ok")
        python = cfg["python"]
        os.execve(python, [python, "-I", "-S", "-c", cfg["harness"]], cfg["env"])
    except BaseException as exc:  # report every setup failure; the caller raises it
        os.write(status, f"\nsandbox setup failed: {exc!r}".encode())
    os._exit(127)


def _wait_for(harness: int) -> tuple[int, float]:
    """Reap children (orphans too, when this is a PID namespace's init) until the harness ends."""
    while True:
        pid, status, usage = os.wait4(-1, 0)
        if pid == harness:
            return status, usage.ru_utime + usage.ru_stime


def main() -> None:
    cfg = json.loads(sys.argv[1])
    status = int(cfg["status_fd"])
    os.set_inheritable(status, False)
    try:
        if cfg["namespaced"]:
            _private_root(cfg)
        else:
            os.chdir(cfg["work"])
    except BaseException as exc:
        os.write(status, f"sandbox setup failed: {exc!r}".encode())
        os._exit(127)
    harness = os.fork()
    if harness == 0:
        _start_harness(cfg, status)
    wait_status, cpu = _wait_for(harness)
    os.write(status, f"\nexit {os.waitstatus_to_exitcode(wait_status)} {cpu:.3f}".encode())
    os._exit(0)  # as a PID namespace's init, this ends every process left in it


if __name__ == "__main__":
    main()
