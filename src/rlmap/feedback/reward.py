"""One reward interface, and rewards that compose.

A reward scores a *batch* of whole trajectories — the prompt, every policy turn, the
environment's observations between them, the task's reference and metadata — and
returns one :class:`Score` per trajectory: a value (optionally split per turn) and a
status. It may be synchronous or ``async``. :func:`score_batch` (or
:func:`ascore_batch` inside a running event loop) is the only way the trainer calls a
reward: it awaits, and it turns every failure into a status instead of a number.

Statuses (:class:`rlmap.core.batch.RewardStatus`), and who is at fault:

- ``OK`` — the value is the reward. A wrong or badly formatted answer is ``OK`` with a
  low value: :class:`FormatReward` scores a format miss 0.0 with status ``OK``.
- ``INVALID`` — the *model's* output is malformed in a way a verifier was promised it
  would not be (it raised :class:`InvalidOutput`). The model's fault; the value is the
  low reward the reward gives it (0.0 from that verifier; a :class:`Weighted` sum keeps
  its other terms).
- ``INFRA_ERROR`` / ``TIMEOUT`` — the reward's infrastructure failed or ran out of time.
  Not the model's fault; the value is 0.0 and means nothing.

The trainer trains only on ``OK`` (``Batch.valid``): every other status is excluded
from the loss and the group statistics and counted (``reward/*_frac``), so a failed
trajectory's 0.0 is never used as a reward. docs/rewards.md has the whole contract.

Outcome rewards (verifier, format, overlong, length) put their value on the last turn
(``per_turn = (0, …, 0, value)``), so they sum per turn with a :class:`ProcessReward`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch

from rlmap.core.batch import RewardStatus
from rlmap.feedback.shaping import overlong_penalty

log = logging.getLogger(__name__)

Verify = Callable[[str, str], float]
"""A verifier: (response, reference) → reward (``rlmap.feedback.registry``)."""

_T = TypeVar("_T")

_SEVERITY = (RewardStatus.OK, RewardStatus.INVALID, RewardStatus.TIMEOUT, RewardStatus.INFRA_ERROR)
"""Least to most severe: the status a sum of terms takes is its terms' most severe."""

_FAILED = frozenset({RewardStatus.INFRA_ERROR, RewardStatus.TIMEOUT})
"""Statuses whose value means nothing (always 0.0)."""


class InvalidOutput(Exception):
    """Raised by a verifier when the response is not in the form it was promised.

    For a verifier that relies on a contract the model must keep (a constrained
    decoder promised JSON, a tool protocol promised one call per turn) and cannot
    judge a response that breaks it. The trajectory gets status ``INVALID``: the
    model's fault, unlike any other exception (``INFRA_ERROR``). A plain format check
    should not raise it — score the miss 0.0 (:class:`FormatReward`).
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
    result = _invoke(reward, batch)
    if inspect.isawaitable(result):
        result = _run(_settle(result))
    return _checked(reward.name, result, batch)


async def ascore_batch(reward: Reward, batch: Sequence[Trajectory]) -> list[Score]:
    """:func:`score_batch` for async callers: awaits the reward on the running loop."""
    if not batch:
        return []
    return _checked(reward.name, await _settle(_invoke(reward, batch)), batch)


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
        return _item_failure(name, exc)


@dataclass(frozen=True)
class VerifierReward:
    """R = verify(response, reference) of the last turn (an outcome reward)."""

    verify: Verify
    """A verifier of the registry, possibly isolated (``IsolatedVerifier``)."""
    name: str = "verifier"

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        return [
            on_last_turn(verify_score(self.verify, t.response, t.reference, self.name), t)
            for t in batch
        ]


@dataclass(frozen=True)
class FormatReward:
    """R_format = 1 if the whole response (ends stripped) matches ``pattern``, else 0.

    A miss is a legitimate low reward (status ``OK``), not ``INVALID``: the format is
    what is being taught. ``pattern`` is a Python ``re`` pattern (``re.fullmatch``),
    e.g. ``r"(?s)<think>.*</think>\\s*<answer>.*</answer>"``.
    """

    pattern: str
    name: str = "format"

    def __post_init__(self) -> None:
        re.compile(self.pattern)  # a bad pattern fails at construction, not per batch

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        return [on_last_turn(Score(self._matches(t.response)), t) for t in batch]

    def _matches(self, response: str) -> float:
        return float(re.fullmatch(self.pattern, response.strip()) is not None)


@dataclass(frozen=True)
class OverlongPunishment:
    """R_len, DAPO's soft overlong punishment on |y| = ``length`` and L_max = ``max_length``.

    0 up to L_max − L_c, linear down to −1 at L_max, −1 beyond
    (:func:`rlmap.feedback.shaping.overlong_penalty`). DAPO adds it to the outcome
    reward with weight 1. A trajectory whose ``max_length`` is below ``cache`` makes
    the batch fail (``INFRA_ERROR``, with the reason): validate L_c ≤ L_max in config.
    """

    cache: int
    """L_c, the punishment interval in tokens (0: hard punishment beyond L_max)."""
    name: str = "overlong"

    def __post_init__(self) -> None:
        if self.cache < 0:
            raise ValueError(f"OverlongPunishment: cache must be >= 0, got {self.cache}")

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        values = [0.0] * len(batch)
        by_limit: dict[int, list[int]] = {}  # one tensor call per distinct L_max
        for i, t in enumerate(batch):
            by_limit.setdefault(t.max_length, []).append(i)
        for max_len, rows in by_limit.items():
            lengths_B = torch.tensor([batch[i].length for i in rows])  # (B',)
            penalty_B = overlong_penalty(lengths_B, max_len, self.cache)  # (B',)
            for i, v in zip(rows, penalty_B.tolist(), strict=True):
                values[i] = v
        return [on_last_turn(Score(v), t) for v, t in zip(values, batch, strict=True)]


@dataclass(frozen=True)
class LengthReward:
    """R_length = −|length − target| / scale: a reward for hitting a token budget.

    For budgeted answers (L1-style length control): 0 at the target, falling by 1 per
    ``scale`` tokens either way, so both rambling and truncating cost. ``scale =
    target`` makes it the relative deviation. Unlike the overlong punishment it also
    punishes answers that are too short.
    """

    target: int
    """The budget in generated tokens (over all turns)."""
    scale: float
    """Tokens of deviation that cost 1."""
    name: str = "length"

    def __post_init__(self) -> None:
        if self.target < 0 or not self.scale > 0:
            raise ValueError(
                f"LengthReward: need target >= 0 and scale > 0; "
                f"got target={self.target}, scale={self.scale}"
            )

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        return [on_last_turn(Score(-abs(t.length - self.target) / self.scale), t) for t in batch]


@dataclass(frozen=True)
class Weighted:
    """R = Σ_k w_k · R_k, each term called once per batch (async terms concurrently).

    - status: ``OK`` only if every term is; else the most severe (:func:`worst`).
    - value: the weighted sum; for ``INVALID`` the invalid term contributes its 0.0
      and the others their values; for ``INFRA_ERROR`` / ``TIMEOUT`` it is 0.0.
    - per_turn: the weighted sum per turn when every term gives one, else None.

    A term that raises or returns garbage fails on its own (as in
    :func:`score_batch`), and that failure is the combined status.
    """

    terms: tuple[tuple[float, Reward], ...]
    """(w_k, R_k) pairs."""
    name: str = ""
    """Defaults to the sum written out, e.g. ``1*exact_match+0.5*format``."""

    def __post_init__(self) -> None:
        if not self.terms:
            raise ValueError("Weighted: needs at least one term")
        bad = [w for w, _ in self.terms if not math.isfinite(w)]
        if bad:
            raise ValueError(f"Weighted: weights must be finite, got {bad}")
        if not self.name:
            object.__setattr__(self, "name", "+".join(f"{w:g}*{r.name}" for w, r in self.terms))

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score] | Awaitable[list[Score]]:
        results = [_invoke(reward, batch) for _, reward in self.terms]
        if any(inspect.isawaitable(r) for r in results):
            return self._gather(batch, results)
        return self._combine(batch, results)

    async def _gather(self, batch: Sequence[Trajectory], results: list[object]) -> list[Score]:
        return self._combine(batch, await asyncio.gather(*(_settle(r) for r in results)))

    def _combine(self, batch: Sequence[Trajectory], results: Sequence[object]) -> list[Score]:
        checked = [
            _checked(reward.name, result, batch)
            for (_, reward), result in zip(self.terms, results, strict=True)
        ]
        weights = [w for w, _ in self.terms]
        return [_weighted_sum(weights, scores) for scores in zip(*checked, strict=True)]


@dataclass(frozen=True)
class AsyncReward:
    """Adapts an ``async def fn(batch) -> scores`` (a remote reward model, a judge) to Reward.

    With ``timeout_s`` the whole batch must be scored within it (``asyncio.wait_for``),
    else every trajectory of the batch is ``TIMEOUT``. For per-trajectory deadlines,
    let ``fn`` return ``Score.failed(RewardStatus.TIMEOUT)`` for the late ones.
    """

    fn: Callable[[Sequence[Trajectory]], Awaitable[Sequence[Score]]]
    name: str = "async"
    timeout_s: float | None = None
    """Seconds per batch; None waits for ever."""

    def __post_init__(self) -> None:
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"AsyncReward: timeout_s must be > 0, got {self.timeout_s}")

    async def __call__(self, batch: Sequence[Trajectory]) -> Sequence[Score]:
        return await asyncio.wait_for(self.fn(batch), self.timeout_s)


@dataclass(frozen=True)
class ProcessReward:
    """Per-turn (process) rewards: r_t = ``score_turns(trajectory)[t]``, R = Σ_t r_t.

    ``score_turns`` returns one score per turn (e.g. a process reward model judging
    each step); the Score carries them in ``per_turn`` for turn-level credit
    assignment. A raise costs that trajectory only (:func:`verify_score`'s mapping);
    a list of the wrong length makes it ``INFRA_ERROR``.
    """

    score_turns: Callable[[Trajectory], Sequence[float]]
    name: str = "process"

    def __call__(self, batch: Sequence[Trajectory]) -> list[Score]:
        return [self._one(t) for t in batch]

    def _one(self, t: Trajectory) -> Score:
        try:
            per_turn = tuple(float(x) for x in self.score_turns(t))
        except Exception as exc:  # one trajectory's failure, never the batch's
            return on_last_turn(_item_failure(self.name, exc), t)
        return Score(math.fsum(per_turn), per_turn=per_turn)


def compose(
    verifier: Reward | None,
    *,
    format_pattern: str | None = None,
    format_weight: float = 0.0,
    overlong_cache: int | None = None,
    length_target: int | None = None,
    length_weight: float = 0.0,
) -> Reward | None:
    """The usual sum, from config values::

        R = R_verifier + format_weight · R_format + R_overlong + length_weight · R_length

    Each optional term is present only when configured; the overlong punishment has
    weight 1 (DAPO). The length reward uses ``scale = target`` (relative deviation), so
    ``length_weight`` is the reward lost per 100 % off the budget. ``verifier`` alone is
    returned as it is. A weight without its term, or a term with weight 0, raises.
    ``verifier=None`` gives the shaping terms alone (the trainer adds them to its base
    reward), or None when none is configured.
    """
    _require_pair("format_pattern", format_pattern, "format_weight", format_weight)
    _require_pair("length_target", length_target, "length_weight", length_weight)
    terms: list[tuple[float, Reward]] = [] if verifier is None else [(1.0, verifier)]
    if format_pattern is not None:
        terms.append((format_weight, FormatReward(format_pattern)))
    if overlong_cache is not None:
        terms.append((1.0, OverlongPunishment(overlong_cache)))
    if length_target is not None:
        terms.append((length_weight, LengthReward(length_target, scale=max(length_target, 1))))
    if not terms:
        return None
    return terms[0][1] if len(terms) == 1 and verifier is not None else Weighted(tuple(terms))


def _require_pair(term: str, value: object, weight_name: str, weight: float) -> None:
    if (value is None) != (weight == 0.0):
        raise ValueError(
            f"compose: {term} and {weight_name} go together (a term needs a non-zero "
            f"weight); got {term}={value!r}, {weight_name}={weight}"
        )


def _invoke(reward: Reward, batch: Sequence[Trajectory]) -> object:
    """The reward's result for the batch, or the exception it raised."""
    try:
        return reward(batch)
    except Exception as exc:  # isolated: becomes a status in _checked
        return exc


async def _settle(result: object) -> object:
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


def _checked(name: str, result: object, batch: Sequence[Trajectory]) -> list[Score]:
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
    if s.status in _FAILED:
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


def _item_failure(name: str, exc: Exception) -> Score:
    """One trajectory's exception as a Score: InvalidOutput is the model's fault."""
    status = RewardStatus.INVALID if isinstance(exc, InvalidOutput) else _failure_status(exc)
    return Score.failed(status, f"{name}: {type(exc).__name__}: {exc}")


def on_last_turn(score: Score, t: Trajectory) -> Score:
    """An outcome's value placed on the last turn, so it sums per turn with process rewards."""
    if score.status in _FAILED or not t.turns:
        return score
    return replace(score, per_turn=(0.0,) * (len(t.turns) - 1) + (score.value,))


def _weighted_sum(weights: Sequence[float], scores: Sequence[Score]) -> Score:
    status = worst(s.status for s in scores)
    reason = "; ".join(s.reason for s in scores if s.reason)
    if status in _FAILED:
        return Score.failed(status, reason)
    value = math.fsum(w * s.value for w, s in zip(weights, scores, strict=True))
    splits = [s.per_turn for s in scores]
    per_turn = None
    if all(p is not None for p in splits):
        columns = zip(*(p for p in splits if p is not None), strict=True)  # one column per turn
        per_turn = tuple(
            math.fsum(w * r for w, r in zip(weights, col, strict=True)) for col in columns
        )
    return Score(value, status, per_turn, reason)
