"""A verifier in its own process: a hang or a crash costs one sample, never the run.

:class:`IsolatedVerifier` wraps a ``verify(response, reference) -> float`` and runs it
in a long-lived worker process, one call at a time, each with a wall-clock timeout:

- the call returns: its value;
- the verifier raises: :class:`VerifierError` (the worker lives on); it raises
  :class:`~rlmap.feedback.reward.InvalidOutput`: that again, in the caller (``invalid``);
- the call outlives ``timeout_s``: the worker is killed and :class:`TimeoutError`
  raised; the next call starts a fresh worker. Whatever the worker started dies with
  it: a code sandbox's processes by their death signal (``PR_SET_PDEATHSIG`` down the
  chain, and the PID namespace), and a sweep (:func:`rlmap.feedback.sandbox.sweep`)
  makes that certain and removes the sandbox's temporary directories, which the
  killed worker never got to remove — whichever limit fires first, the sandbox's wall
  clock or ``timeout_s``, nothing is left;
- the worker dies (killed, segfault, ``os._exit``): :class:`VerifierError`; the
  next call starts a fresh worker.

The caller (:func:`rlmap.tasks.env.verify_safely`) turns a ``TimeoutError`` into
reward status ``timeout`` and any other exception into ``infra_error``: the sample is
excluded from the loss and its group's statistics and counted, never scored 0.

Start method: ``fork`` where the platform has it (the worker inherits the verifier as
it is, no pickling, starts in milliseconds; it runs only the verifier, never torch; it
closes the trainer's end of the pipe and checks its parent, so it exits when the trainer
dies, even by SIGKILL),
``spawn`` elsewhere (the verifier must then be importable by name). A round trip
costs tens of microseconds, so the isolation is cheap next to any verifier that needs
it; the built-in pure-Python verifiers run in-process unless ``feedback.timeout_s``
is set.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from rlmap.feedback import sandbox
from rlmap.feedback.reward import InvalidOutput

Verify = Callable[[str, str], float]
PARENT_CHECK_S = 1.0
"""How often an idle worker checks that the trainer is still alive."""


class VerifierError(RuntimeError):
    """The verifier raised, or its process died: an infrastructure failure of one sample."""


def _serve(conn: Connection, parent_end: Connection, verify: Verify) -> None:
    """The worker's loop: one (response, reference) in, ("ok", value), ("invalid", text) or
    ("error", text) out. It exits when the trainer closes the pipe or dies."""
    parent_end.close()  # else the pipe never reports EOF when the trainer dies (fork)
    parent = os.getppid()
    while True:
        try:
            if not conn.poll(PARENT_CHECK_S):
                if os.getppid() != parent:  # orphaned: the trainer is gone
                    return
                continue
            response, reference = conn.recv()
        except (EOFError, OSError):  # the parent closed the pipe: done
            return
        try:
            conn.send(("ok", float(verify(response, reference))))
        except InvalidOutput as exc:  # the output broke a promised form: a low reward
            conn.send(("invalid", str(exc)))
        except Exception as exc:  # reported to the parent, the worker lives on
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _context() -> Any:
    methods = mp.get_all_start_methods()
    return mp.get_context("fork" if "fork" in methods else "spawn")


class IsolatedVerifier:
    """``verify`` run in a worker process with a per-call timeout (see the module docstring)."""

    def __init__(self, verify: Verify, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0, got {timeout_s}")
        self.verify, self.timeout_s = verify, timeout_s
        self._lock = threading.Lock()
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self.restarts = 0
        """Workers started after the first (each one replaced a hung or dead worker)."""

    def __call__(self, response: str, reference: str) -> float:
        with self._lock:  # one pipe, one call at a time (asynchronous workers share it)
            return self._call(response, reference)

    def _call(self, response: str, reference: str) -> float:
        conn = self._connection()
        try:
            conn.send((response, reference))
            ready = conn.poll(self.timeout_s)
        except (BrokenPipeError, EOFError, OSError):
            self._stop()
            raise VerifierError("verifier process died") from None
        if not ready:
            self._stop()
            raise TimeoutError(f"verifier took longer than {self.timeout_s} s")
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            self._stop()
            raise VerifierError("verifier process died") from None
        if kind == "invalid":
            raise InvalidOutput(str(value))
        if kind == "error":
            raise VerifierError(str(value))
        return float(value)

    def _connection(self) -> Connection:
        if self._process is not None and self._process.is_alive() and self._conn is not None:
            return self._conn
        if self._process is not None:
            self._stop()
            self.restarts += 1
        ctx = _context()
        parent, child = ctx.Pipe()
        process = ctx.Process(target=_serve, args=(child, parent, self.verify), daemon=True)
        process.start()
        child.close()
        self._process, self._conn = process, parent
        return parent

    def _stop(self) -> None:
        """Kill the worker (if any), and all it started, and forget it; the next call starts
        a new one."""
        if self._conn is not None:
            self._conn.close()
        if self._process is not None and self._process.is_alive():
            self._process.kill()  # SIGKILL: a worker cannot delay it
        if self._process is not None:
            self._process.join(timeout=5)
            if self._process.pid is not None and self._process.exitcode is not None:
                sandbox.sweep(self._process.pid)  # what a killed worker left behind
        self._conn = None
        # keep _process set so that the next start counts as a restart

    def close(self) -> None:
        """Stop the worker for good."""
        self._stop()
        self._process = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to clean
            self.close()
