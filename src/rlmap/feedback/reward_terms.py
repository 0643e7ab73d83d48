"""The rewards rlmap composes (:mod:`rlmap.feedback.reward` has the interface they keep):
an outcome verifier's, a format check, DAPO's overlong punishment, a length budget, per-turn
(process) rewards, an async adapter, and their weighted sum (:func:`compose`).

Outcome rewards (verifier, format, overlong, length) put their value on the last turn
(``per_turn = (0, …, 0, value)``), so they sum per turn with a :class:`ProcessReward`.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import torch

from rlmap.feedback.reward import (
    FAILED_STATUSES,
    Reward,
    Score,
    Trajectory,
    Verify,
    checked_scores,
    invoke,
    item_failure,
    on_last_turn,
    settle,
    verify_score,
    worst,
)
from rlmap.feedback.shaping import overlong_penalty


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
        results = [invoke(reward, batch) for _, reward in self.terms]
        if any(inspect.isawaitable(r) for r in results):
            return self._gather(batch, results)
        return self._combine(batch, results)

    async def _gather(self, batch: Sequence[Trajectory], results: list[object]) -> list[Score]:
        return self._combine(batch, await asyncio.gather(*(settle(r) for r in results)))

    def _combine(self, batch: Sequence[Trajectory], results: Sequence[object]) -> list[Score]:
        checked = [
            checked_scores(reward.name, result, batch)
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
            return on_last_turn(item_failure(self.name, exc), t)
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


def _weighted_sum(weights: Sequence[float], scores: Sequence[Score]) -> Score:
    status = worst(s.status for s in scores)
    reason = "; ".join(s.reason for s in scores if s.reason)
    if status in FAILED_STATUSES:
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
