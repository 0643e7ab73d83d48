"""The trace statistics behind the symptom rules, on small hand-computed cases."""

from __future__ import annotations

import math

import pytest

from rlmap.diagnostics.stats import correlation, rolling, shift, step_noise, trace, welch_t


def test_trace_keeps_finite_numbers_in_step_order() -> None:
    records = [{"step": 2, "x": 1.5}, {"step": 0}, {"step": 1, "x": None}, {"step": 3, "x": 4}]
    assert trace(records, "x") == [(2, 1.5), (3, 4.0)]  # null (NaN in the run) is left out


def test_welch_t_by_hand() -> None:
    # means 2 and 5; variances 1 and 1 (n = 3 each): se = sqrt(1/3 + 1/3) = 0.8165
    assert welch_t([1, 2, 3], [4, 5, 6]) == pytest.approx(3 / math.sqrt(2 / 3))
    assert welch_t([1, 1], [1, 1]) == 0.0
    assert welch_t([1, 1], [2, 2]) == math.inf  # no noise, a real difference


def test_shift_compares_thirds() -> None:
    points = [(s, float(v)) for s, v in enumerate([1, 2, 3, 10, 10, 10, 4, 5, 6], start=1)]
    moved = shift(points)  # thirds: steps 1–3 (mean 2) and steps 7–9 (mean 5)
    assert (moved.before, moved.after) == (2.0, 5.0)
    assert (moved.before_steps, moved.after_steps) == ((1, 3), (7, 9))
    assert moved.relative == 1.5 and moved.t == pytest.approx(3 / math.sqrt(2 / 3))
    with pytest.raises(ValueError, match="at least 3 points"):
        shift(points[:2])


def test_rolling_mean_sits_at_the_window_end() -> None:
    assert rolling([(1, 1.0), (2, 2.0), (3, 6.0)], 2) == [(2, 1.5), (3, 4.0)]


def test_step_noise_ignores_a_jump_and_a_trend() -> None:
    # 0, 1, 0, 2, 0, 1, 0, 2, ...: differences +1, -1, +2, -2 ten times each; their median
    # is 0 and the median of |d| is 1.5, so sd = 1.4826 · 1.5 / √2
    wobble = [(0.0, 1.0, 0.0, 2.0)[i % 4] for i in range(41)]
    assert step_noise(wobble) == pytest.approx(1.4826 * 1.5 / math.sqrt(2))
    # a jump of 10 at index 20 turns one difference -2 into +8: the median difference
    # moves to 1, |d - 1| is 3 (×9), 2, 0, 1 (×10 each) and 7; its median is still 1.5
    jump = [v + (10.0 if i >= 20 else 0.0) for i, v in enumerate(wobble)]
    assert step_noise(jump) == pytest.approx(step_noise(wobble))
    assert step_noise([0.1 * i for i in range(40)]) == pytest.approx(0.0, abs=1e-12)


def test_correlation_over_shared_steps() -> None:
    a = [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    assert correlation(a, [(1, 2.0), (2, 4.0), (3, 6.0), (9, 0.0)]) == pytest.approx(1.0)
    assert correlation(a, [(s, -v) for s, v in a]) == pytest.approx(-1.0)
    assert math.isnan(correlation(a, [(1, 1.0)]))
