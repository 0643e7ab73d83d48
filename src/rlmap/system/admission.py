"""What the asynchronous loop's threads count together, each under its own lock: the
trajectories admitted under the staleness bound (AReaL's rule, :class:`Admission`) and
the workers' tally for the ledger's balance (:class:`Counts`). The rule and the balance
are :mod:`rlmap.system.async_loop`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

WAIT_S = 0.05
"""How often blocked threads look at the stop flag."""


@dataclass
class Admission:
    """AReaL's staleness control: ``started − dropped ≤ (v + η + 1)·B`` (the rule:
    :mod:`rlmap.system.async_loop`)."""

    batch: int
    eta: int
    started: int = 0
    dropped: int = 0
    version: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)

    def admit(self, n: int, stop: threading.Event, claim: Callable[[], T]) -> T | None:
        """Wait until ``n`` more trajectories may start, then ``claim()`` their prompts under
        the same lock (so a snapshot sees them admitted and claimed, or neither); None when
        stopping."""
        with self.cond:
            while self.started + n - self.dropped > (self.version + self.eta + 1) * self.batch:
                if stop.is_set():
                    return None
                self.cond.wait(WAIT_S)
            if stop.is_set():
                return None
            self.started += n
            return claim()

    def advance(self, version: int, dropped: int) -> None:
        with self.cond:
            self.version, self.dropped = version, self.dropped + dropped
            self.cond.notify_all()

    def release(self, n: int) -> None:
        """``n`` admitted trajectories will never be consumed (aborted, or dropped as stale):
        their slots are free again."""
        with self.cond:
            self.dropped += n
            self.cond.notify_all()


@dataclass
class Counts:
    """What the workers did, for the ledger's balance (generated = consumed + dropped +
    aborted + queued)."""

    finished: int = 0
    finished_tokens: int = 0
    aborted_rounds: int = 0
    durations: list[float] = field(default_factory=list)
    """Seconds of each trajectory finished since the learner last looked (drained per step):
    every finished one, not only the consumed — those are biased toward the quick."""
    lock: threading.Lock = field(default_factory=threading.Lock)
