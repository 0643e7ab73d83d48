"""Math-answer equivalence with ``math-verify``, under a per-call deadline.

``MathEquiv()(response, reference)`` is 1.0 when the answer math-verify extracts
from the response (a ``\\boxed{}`` answer first, else the last LaTeX or plain
expression) equals the reference: ``\\boxed{\\frac{1}{2}}``, ``0.5``, ``1/2`` and
``$\\frac12$`` all match ``0.5``; ``\\boxed{3}`` matches ``3.0``; ``1,000`` matches
``1000``; ``x^2+2x+1`` matches ``(x+1)^2``.

The reference is the gold answer as text — a number, a fraction, LaTeX with or
without ``$...$`` or ``\\boxed{}``. A reference math-verify cannot parse is a
configuration error and raises ValueError. Scientific notation (``1e3``) is not
read as a number; write ``1000``.

Why a worker process: math-verify bounds its own time with ``signal.alarm``, which
only works in the main thread (the trainer may verify from any thread), takes whole
seconds and cannot interrupt C code (``9**9**9**9`` runs inside one bytecode). So
math-verify runs with its timeouts off in a worker process of its own, one call
at a time, and the caller enforces ``timeout_seconds`` per call: a worker that
misses it is killed (and restarted on the next call) and the answer scores 0.0 —
an answer that cannot be checked in time is not credited. The same holds for an
answer that crashes the worker (it also has an address-space limit). Apart from
the deadline the result is deterministic: same strings, same reward.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path


class MathEquiv:
    """The ``math_equiv`` verifier: ``(response, reference) -> 1.0 | 0.0``; thread-safe."""

    def __init__(
        self,
        timeout_seconds: float = 5.0,
        start_timeout_seconds: float = 120.0,
        memory_bytes: int = 4 * 2**30,
    ) -> None:
        self.timeout_seconds = timeout_seconds
        """Deadline of one call, from the request to the reply."""
        self.start_timeout_seconds = start_timeout_seconds
        """Deadline for the worker to import math_verify (not counted in a call)."""
        self.memory_bytes = memory_bytes
        """Address-space limit of the worker."""
        self._lock = threading.Lock()
        self._worker: list[subprocess.Popen[bytes]] = []  # zero or one; shared with the finalizer
        weakref.finalize(self, _stop, self._worker)

    def __call__(self, response: str, reference: str) -> float:
        with self._lock:
            reply = self._ask({"response": response, "reference": reference})
        if reply is None:  # deadline missed or worker crashed on this answer
            return 0.0
        if "error" in reply:
            raise ValueError(f"math_equiv: {reply['error']}")
        return float(bool(reply["equal"]))

    def close(self) -> None:
        """Stop the worker (a later call starts a new one)."""
        with self._lock:
            _stop(self._worker)

    def _ask(self, request: dict[str, str]) -> dict[str, object] | None:
        worker = self._running()
        assert worker.stdin is not None and worker.stdout is not None
        try:
            worker.stdin.write(json.dumps(request).encode() + b"\n")
            worker.stdin.flush()
        except BrokenPipeError:
            _stop(self._worker)
            return None
        line = _read_line(worker, time.monotonic() + self.timeout_seconds)
        if line is None:
            _stop(self._worker)
            return None
        reply: dict[str, object] = json.loads(line)
        return reply

    def _running(self) -> subprocess.Popen[bytes]:
        """The worker, started (and waited for) if there is none."""
        if self._worker and self._worker[0].poll() is None:
            return self._worker[0]
        _stop(self._worker)
        source = Path(__file__).with_name("_math_worker.py").read_text()
        worker = subprocess.Popen(
            [sys.executable, "-I", "-c", source, str(self.memory_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self._worker.append(worker)
        ready = _read_line(worker, time.monotonic() + self.start_timeout_seconds)
        if ready is None or not json.loads(ready).get("ready"):
            _stop(self._worker)
            raise RuntimeError("math_equiv: the math_verify worker did not start (installed?)")
        return worker


def _read_line(worker: subprocess.Popen[bytes], deadline: float) -> bytes | None:
    """One line from the worker, or None if it is not there by ``deadline`` or it died."""
    assert worker.stdout is not None
    fd, data = worker.stdout.fileno(), b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        data += chunk
    return data


def _stop(holder: list[subprocess.Popen[bytes]]) -> None:
    while holder:
        worker = holder.pop()
        worker.kill()
        worker.wait()
        for stream in (worker.stdin, worker.stdout):
            if stream is not None:
                stream.close()
