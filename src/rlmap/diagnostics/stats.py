"""Robust statistics over metric traces, for the symptom rules (``rlmap diagnose``).

A trace is one metric's ``(step, value)`` points in step order. A training step
sees a few dozen samples, so a single step is noise: no rule reads one step. The
rules compare *means of thirds* (the first third of a span against its last
third, with a Welch t statistic so a difference has to stand out of the noise),
*rolling means* (a window of steps), and a *robust per-step noise* estimated from
first differences (a jump or a trend barely moves the median difference).

Pure functions over plain floats: no torch, no I/O.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Point = tuple[int, float]
"""(step, value) of one metric."""


def trace(records: Sequence[Mapping[str, Any]], name: str) -> list[Point]:
    """The steps and finite values of metric ``name``, in step order.

    Steps that do not log it, and values written as ``null`` (NaN or ±inf in the
    run), are left out.
    """
    points = []
    for record in records:
        value = record.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            points.append((int(record["step"]), float(value)))
    return sorted(points)


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean; NaN for no values."""
    return sum(values) / len(values) if values else math.nan


def _variance(values: Sequence[float]) -> float:
    """Unbiased sample variance; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / (len(values) - 1)


def welch_t(before: Sequence[float], after: Sequence[float]) -> float:
    """Welch's t of ``mean(after) − mean(before)``: the difference in standard errors.

    ``(m_a − m_b) / sqrt(s_a²/n_a + s_b²/n_b)``; ±inf when both samples are constant
    but differ, 0 when they are constant and equal.
    """
    diff = mean(after) - mean(before)
    se = math.sqrt(_variance(before) / len(before) + _variance(after) / len(after))
    if se == 0.0:
        return 0.0 if diff == 0.0 else math.copysign(math.inf, diff)
    return diff / se


@dataclass(frozen=True)
class Shift:
    """How a trace moved: the mean of its first third against the mean of its last third."""

    before: float
    """Mean of the first third."""
    after: float
    """Mean of the last third."""
    before_steps: tuple[int, int]
    """First and last step of the first third."""
    after_steps: tuple[int, int]
    """First and last step of the last third."""
    t: float
    """Welch t of ``after − before`` (see :func:`welch_t`)."""

    @property
    def change(self) -> float:
        """``after − before``."""
        return self.after - self.before

    @property
    def relative(self) -> float:
        """``(after − before) / |before|``; ±inf when ``before`` is 0 and it moved."""
        if self.before == 0.0:
            return 0.0 if self.change == 0.0 else math.copysign(math.inf, self.change)
        return self.change / abs(self.before)

    def describe(self) -> str:
        """``0.21 (steps 1–33) → 0.78 (steps 67–100), t = 9.1``."""
        (a, b), (c, d) = self.before_steps, self.after_steps
        before, after = f"{self.before:.4g} (steps {a}–{b})", f"{self.after:.4g} (steps {c}–{d})"
        return f"{before} → {after}, t = {self.t:.1f}"


def shift(points: Sequence[Point]) -> Shift:
    """First third against last third of ``points`` (at least 3 points; the caller checks)."""
    if len(points) < 3:
        raise ValueError(f"shift: needs at least 3 points, got {len(points)}")
    third = len(points) // 3
    first, last = points[:third], points[-third:]
    return Shift(
        before=mean([v for _, v in first]),
        after=mean([v for _, v in last]),
        before_steps=(first[0][0], first[-1][0]),
        after_steps=(last[0][0], last[-1][0]),
        t=welch_t([v for _, v in first], [v for _, v in last]),
    )


def rolling(points: Sequence[Point], width: int) -> list[Point]:
    """Means of ``width`` consecutive points, each at the step of its window's last point."""
    values = [v for _, v in points]
    return [
        (points[i + width - 1][0], mean(values[i : i + width]))
        for i in range(len(points) - width + 1)
    ]


def step_noise(values: Sequence[float]) -> float:
    """Robust standard deviation of one step's value around the local level.

    From the first differences d_i = x_{i+1} − x_i: for independent noise of sd σ,
    d has sd σ·√2, and 1.4826 · MAD(d) estimates sd(d) while ignoring the few
    differences that carry a jump. A slow trend adds almost nothing to d.
    """
    diffs = [b - a for a, b in itertools.pairwise(values)]
    if not diffs:
        return 0.0
    centre = _median(diffs)
    mad = _median([abs(d - centre) for d in diffs])
    return 1.4826 * mad / math.sqrt(2.0)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def correlation(a: Sequence[Point], b: Sequence[Point]) -> float:
    """Pearson correlation of two traces over the steps both log; NaN if undefined."""
    joined = dict(a)
    pairs = [(joined[s], v) for s, v in b if s in joined]
    if len(pairs) < 3:
        return math.nan
    xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
    mx, my = mean(xs), mean(ys)
    sxy = sum((x - mx) * (y - my) for x, y in pairs)
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else math.nan


def within(points: Sequence[Point], first: int, last: int) -> list[Point]:
    """The points with ``first <= step <= last``."""
    return [p for p in points if first <= p[0] <= last]
