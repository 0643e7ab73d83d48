"""What every rule of :mod:`rlmap.diagnostics.rules` reads with: the settings of its trend
tests and rolling means, the traces it needs (or what it lacks), and how its evidence writes
numbers and steps.

No rule reads a single step: a step sees a few dozen samples. Trends compare the mean
of a span's first third with its last third (Welch t, :mod:`rlmap.diagnostics.stats`);
levels use rolling means.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlmap.diagnostics.run import RunData
from rlmap.diagnostics.stats import Point, Shift, trace

MIN_POINTS = 9
"""Fewest steps a trend test accepts: three per third, so each third has a spread."""
TREND_T = 3.0
"""Welch t a change between thirds must reach to count as a trend. On a flat trace of
independent noise |t| >= 3 happens by chance well under 1% of the time."""
WINDOW = 5
"""Steps in a rolling mean (and in the "start" of a trace): enough to damp one step's
sampling noise, short enough to see a change within ten steps."""
MIN_EVALS = 3
"""Held-out evaluations a held-out trend needs: before training, and two more."""


def wanted_traces(
    run: RunData, *wanted: tuple[str, int], why: str = ""
) -> tuple[list[list[Point]], tuple[str, ...]]:
    """Traces of the ``(metric, fewest steps)`` wanted, and what is missing of them."""
    traces, missing = [], []
    for name, count in wanted:
        points = trace(run.records, name)
        traces.append(points)
        if len(points) < count:
            missing.append(f"{name} on >= {count} steps, found {len(points)}{why}")
    return traces, tuple(missing)


def fmt(x: float) -> str:
    return f"{x:.4g}"


def steps_of(points: Sequence[Point]) -> tuple[int, int]:
    return (points[0][0], points[-1][0])


def values_of(points: Sequence[Point]) -> list[float]:
    return [v for _, v in points]


def shift_values(s: Shift) -> dict[str, float]:
    return {"before": s.before, "after": s.after, "t": s.t}
