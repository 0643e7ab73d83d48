"""One reward interface, and rewards that compose.

A reward scores a *batch* of whole trajectories — the prompt, every policy turn, the
environment's observations between them, the task's reference and metadata — and
returns one :class:`Score` per trajectory: a value (optionally split per turn) and a
status. It may be synchronous or ``async``. :func:`score_batch` (or
:func:`ascore_batch` inside a running event loop) is the only way the trainer calls a
reward: it awaits, and it turns every failure into a status instead of a number.

Statuses (:class:`rlmap.core.batch.RewardStatus`), and who is at fault:

- ``OK`` — the value is the reward. A wrong or badly formatted answer is ``OK`` with a
  low value: :class:`~rlmap.feedback.reward_terms.FormatReward` scores a format miss 0.0
  with status ``OK``.
- ``INVALID`` — the *model's* output is malformed in a way a verifier was promised it
  would not be (it raised :class:`InvalidOutput`). The model's fault; the value is the
  low reward the reward gives it (0.0 from that verifier; a
  :class:`~rlmap.feedback.reward_terms.Weighted` sum keeps its other terms).
- ``INFRA_ERROR`` / ``TIMEOUT`` — the reward's infrastructure failed or ran out of time.
  Not the model's fault; the value is 0.0 and means nothing.

The trainer trains only on ``OK`` (``Batch.valid``): every other status is excluded
from the loss and the group statistics and counted (``reward/*_frac``), so a failed
trajectory's 0.0 is never used as a reward. docs/rewards.md has the whole contract.

The rewards themselves (a verifier's, format, overlong, length, process, async) and their
weighted sum are :mod:`rlmap.feedback.reward_terms`'s.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, runtime_checkable

from rlmap.core.batch import RewardStatus

log = logging.getLogger(__name__)

Verify = Callable[[str, str], float]
"""A verifier: (response, reference) → reward (``rlmap.feedback.registry``)."""

_T = TypeVar("_T")

_SEVERITY = (RewardStatus.OK, RewardStatus.INVALID, RewardStatus.TIMEOUT, RewardStatus.INFRA_ERROR)
"""Least to most severe: the status a sum of terms takes is its terms' most severe."""

FAILED_STATUSES = frozenset({RewardStatus.INFRA_ERROR, RewardStatus.TIMEOUT})
"""Statuses whose value means nothing (always 0.0)."""


class InvalidOutput(Exception):
    """Raised by a verifier when the response is not in the form it was promised.

    For a verifier that relies on a contract the model must keep (a constrained
    decoder promised JSON, a tool protocol promised one call per turn) and cannot
    judge a response that breaks it. The trajectory gets status ``INVALID``: the
    model's fault, unlike any other exception (``INFRA_ERROR``). A plain format check
    should not raise it — score the miss 0.0
    (:class:`~rlmap.feedback.reward_terms.FormatReward`).
    """


@dataclass(frozen=True, kw_only=True)
class Trajectory:
    """What a reward sees of one episode."""

    prompt: str
    """The prompt, decoded."""
    turns: tuple[str, ...]
    """The policy's turns, decoded, in order (one for a single-turn task)."""
    observations: tuple[str, ...] = ()
    """The environment's outputs between turns (tool results), decoded, in order."""
    reference: str
    """The task's answer, as its verifier expects it (docs/verifiers.md)."""
    metadata: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}), hash=False)
    """The task's metadata (difficulty, source, test cases, …); read-only."""
    length: int
    """Tokens the policy generated over all turns, |y|."""
    max_length: int
    """The episode's limit on generated tokens, L_max."""
    truncated: bool = False
    """The episode hit a length or turn limit before it ended on its own."""

    def __post_init__(self) -> None:
        if self.length < 0 or self.max_length < 1:
            raise ValueError(
                f"Trajectory: need length >= 0 and max_length >= 1; "
                f"got length={self.length}, max_length={self.max_length}"
            )
        if len(self.observations) > len(self.turns):
            raise ValueError(
                f"Trajectory: {len(self.observations)} observations for {len(self.turns)} turns"
            )

    @property
    def response(self) -> str:
        """The last turn ('' if there is none): what an outcome verifier judges."""
        return self.turns[-1] if self.turns else ""


@dataclass(frozen=True)
class Score:
    """A reward's verdict on one trajectory."""

    value: float
    """The reward. Used only when ``status`` is ``OK``; 0.0 for ``INFRA_ERROR`` / ``TIMEOUT``."""
    status: RewardStatus = RewardStatus.OK
    """Whether ``value`` can be trusted (module docstring)."""
    per_turn: tuple[float, ...] | None = None
    """One reward per turn, summing to ``value``; None when the reward has no per-turn split."""
    reason: str = ""
    """Why the status is not ``OK``, for logs; never read by the trainer."""

    def __post_init__(self) -> None:
        values = (self.value, *(self.per_turn or ()))
        if self.per_turn is None or not all(math.isfinite(v) for v in values):
            return  # non-finite scores are caught (and made INFRA_ERROR) by score_batch
        total = math.fsum(self.per_turn)
        scale = max(1.0, math.fsum(abs(r) for r in self.per_turn))  # rounding grows with |r_t|
        if abs(total - self.value) > 1e-6 * scale:
            raise ValueError(f"Score: per_turn sums to {total}, value is {self.value}")

    @classmethod
    def failed(cls, status: RewardStatus, reason: str = "") -> Score:
        """A score of 0.0 with a non-OK status (the 0.0 is never a reward)."""
        return cls(0.0, status, None, reason)

    @property
    def ok(self) -> bool:
        """The value is a reward the trainer may use."""
        return self.status == RewardStatus.OK


@runtime_checkable
class Reward(Protocol):
    """Scores a batch of trajectories: one :class:`Score` per trajectory, in order.

    May return the scores or an awaitable of them (an ``async def __call__``). It may
    raise, or return a non-OK score for one trajectory: :func:`score_batch` turns
    either into a status. Never call it directly in the trainer; call ``score_batch``.
    """

    @property
    def name(self) -> str:
        """The reward's name in logs and failure reasons."""
        ...

    def __call__(
        self, batch: Sequence[Trajectory], /
    ) -> Sequence[Score] | Awaitable[Sequence[Score]]: ...


def score_batch(reward: Reward, batch: Sequence[Trajectory]) -> list[Score]:
    """The reward's scores for ``batch``, one per trajectory in order; failures isolated.

    - An awaitable result is awaited: with ``asyncio.run`` when no event loop runs in
      this thread; inside a running loop, on a fresh loop in a worker thread (the
      calling loop is blocked until it is done — from async code use
      :func:`ascore_batch` instead).
    - The whole call raises: every trajectory ``TIMEOUT`` for a ``TimeoutError``,
      else ``INFRA_ERROR``.
    - It returns anything but one :class:`Score` per trajectory: every trajectory
      ``INFRA_ERROR``, with the reason.
    - One score is not a Score, not finite, or has a per-turn split of the wrong
      length: that trajectory ``INFRA_ERROR``.

    A failed trajectory's value is 0.0, and it must never be used as a reward: the
    trainer excludes every non-OK status (``Batch.valid``) and counts it.
    """
    if not batch:
        return []
    result = invoke(reward, batch)
    if inspect.isawaitable(result):
        result = _run(settle(result))
    return checked_scores(reward.name, result, batch)


async def ascore_batch(reward: Reward, batch: Sequence[Trajectory]) -> list[Score]:
    """:func:`score_batch` for async callers: awaits the reward on the running loop."""
    if not batch:
        return []
    return checked_scores(reward.name, await settle(invoke(reward, batch)), batch)


def worst(statuses: Iterable[RewardStatus]) -> RewardStatus:
    """The most severe status: INFRA_ERROR > TIMEOUT > INVALID > OK (OK if none).

    INFRA_ERROR ranks above TIMEOUT only so that the order is total; both exclude the
    trajectory. Either outranks INVALID: when the infrastructure failed, the verdict
    "malformed" cannot be trusted either.
    """
    return max(statuses, key=_SEVERITY.index, default=RewardStatus.OK)


def verify_score(verify: Verify, response: str, reference: str, name: str = "verifier") -> Score:
    """``verify(response, reference)`` as a Score, isolating its failures (one trajectory).

    :class:`InvalidOutput` → ``INVALID``; ``TimeoutError`` (e.g. from
    :class:`rlmap.feedback.isolation.IsolatedVerifier`) → ``TIMEOUT``; any other
    exception → ``INFRA_ERROR``. The same mapping as ``tasks.env.verify_safely`` plus
    ``INVALID``; it lives here because an axis may not import ``tasks``.
    """
    try:
        return Score(float(verify(response, reference)))
    except Exception as exc:  # a raising verifier costs one trajectory, never the batch
        return item_failure(name, exc)


def on_last_turn(score: Score, t: Trajectory) -> Score:
    """An outcome's value placed on the last turn, so it sums per turn with process rewards."""
    if score.status in FAILED_STATUSES or not t.turns:
        return score
    return replace(score, per_turn=(0.0,) * (len(t.turns) - 1) + (score.value,))


def invoke(reward: Reward, batch: Sequence[Trajectory]) -> object:
    """The reward's result for the batch, or the exception it raised."""
    try:
        return reward(batch)
    except Exception as exc:  # isolated: becomes a status in checked_scores
        return exc


async def settle(result: object) -> object:
    """``result`` awaited if it is awaitable (its exception returned, not raised)."""
    if not inspect.isawaitable(result):
        return result
    try:
        return await result
    except Exception as exc:  # CancelledError is a BaseException and propagates
        return exc


def _run(coro: Coroutine[Any, Any, _T]) -> _T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # no loop in this thread: the common, synchronous trainer
        return asyncio.run(coro)
    # asyncio.run refuses to nest; a worker thread gets a loop of its own
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlmap-reward") as pool:
        return pool.submit(asyncio.run, coro).result()


def checked_scores(name: str, result: object, batch: Sequence[Trajectory]) -> list[Score]:
    """One valid Score per trajectory of ``batch`` from whatever the reward produced."""
    n = len(batch)
    if isinstance(result, BaseException):
        status = _failure_status(result)
        return _fail_all(n, status, f"{name}: raised {type(result).__name__}: {result}")
    if not isinstance(result, Sequence) or isinstance(result, str) or len(result) != n:
        got = f"{len(result)} scores" if isinstance(result, Sequence) else type(result).__name__
        return _fail_all(
            n, RewardStatus.INFRA_ERROR, f"{name}: returned {got} for {n} trajectories"
        )
    return [_checked_one(name, s, t) for s, t in zip(result, batch, strict=True)]


def _checked_one(name: str, s: object, t: Trajectory) -> Score:
    if not isinstance(s, Score):
        return Score.failed(RewardStatus.INFRA_ERROR, f"{name}: {type(s).__name__} is not a Score")
    if s.status in FAILED_STATUSES:
        return s if s.value == 0.0 and s.per_turn is None else Score.failed(s.status, s.reason)
    if not all(math.isfinite(v) for v in (s.value, *(s.per_turn or ()))):
        return Score.failed(RewardStatus.INFRA_ERROR, f"{name}: non-finite score {s}")
    if s.per_turn is not None and len(s.per_turn) != len(t.turns):
        reason = f"{name}: {len(s.per_turn)} per-turn scores for {len(t.turns)} turns"
        return Score.failed(RewardStatus.INFRA_ERROR, reason)
    return s


def _fail_all(n: int, status: RewardStatus, reason: str) -> list[Score]:
    log.warning("reward failed for a batch of %d (%s): %s", n, status.name, reason)
    return [Score.failed(status, reason)] * n


def _failure_status(exc: BaseException) -> RewardStatus:
    timed_out = isinstance(exc, TimeoutError | asyncio.TimeoutError)  # distinct before 3.11
    return RewardStatus.TIMEOUT if timed_out else RewardStatus.INFRA_ERROR


def item_failure(name: str, exc: Exception) -> Score:
    """One trajectory's exception as a Score: InvalidOutput is the model's fault."""
    status = RewardStatus.INVALID if isinstance(exc, InvalidOutput) else _failure_status(exc)
    return Score.failed(status, f"{name}: {type(exc).__name__}: {exc}")
