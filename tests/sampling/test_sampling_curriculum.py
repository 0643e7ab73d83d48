"""The curriculum's level policy (:func:`rlmap.sampling.curriculum.climb`): by hand, against
a plain reference loop, and its invariants."""

from __future__ import annotations

import random

import pytest

from rlmap.sampling.curriculum import Climb, climb, pass_rate

RULE = {"up": 0.75, "down": 0.25, "window": 4, "top": 2}


def test_by_hand() -> None:
    # 3 outcomes: the window of 4 is not full, no decision
    s = climb(Climb(0), [1, 1, 0], **RULE)
    assert s == Climb(0, (1.0, 1.0, 0.0))
    # a 4th: window (1, 1, 0, 1), mean 3/4 = 0.75 >= up -> level 1, window emptied
    s = climb(s, [1], **RULE)
    assert s == Climb(1, ())
    # 6 outcomes at level 1: the window keeps the last 4, (0, 1, 0, 1): 2/4 = 0.5, no move
    s = climb(s, [1, 1, 0, 1, 0, 1], **RULE)
    assert s == Climb(1, (0.0, 1.0, 0.0, 1.0))
    # two more zeros: (0, 1, 0, 0) = 1/4 = 0.25 <= down -> level 0
    assert climb(s, [0, 0], **RULE) == Climb(0, ())


def test_the_top_and_the_bottom_hold() -> None:
    at_top = climb(Climb(2, (1.0,) * 3), [1, 1], **RULE)  # full window of ones at the top
    assert at_top == Climb(2, (1.0,) * 4)  # stays, the window rolls on
    at_bottom = climb(Climb(0), [0] * 9, **RULE)
    assert at_bottom == Climb(0, (0.0,) * 4)


def test_partial_outcomes_count_by_their_value() -> None:
    # reasoning_gym_partial: 0.9 + 0.9 + 0.6 + 0.6 = 3.0, / 4 = 0.75 >= up
    assert climb(Climb(0), [0.9, 0.9, 0.6, 0.6], **RULE).level == 1
    assert climb(Climb(0), [0.9, 0.9, 0.6, 0.5], **RULE).level == 0  # 2.9 / 4 < 0.75


def _reference(
    level: int,
    recent: list[float],
    batch: list[float],
    up: float,
    down: float,
    window: int,
    top: int,
) -> tuple[int, list[float]]:
    """The rule spelt out: append, keep the last ``window``, decide once on a full window."""
    for x in batch:
        recent.append(x)
        if len(recent) > window:
            recent.pop(0)
    if len(recent) == window:
        mean = sum(recent) / window
        if mean >= up and level < top:
            return level + 1, []
        if mean <= down and level > 0:
            return level - 1, []
    return level, recent


@pytest.mark.parametrize("seed", range(20))
def test_matches_the_reference_loop_and_keeps_its_invariants(seed: int) -> None:
    rng = random.Random(seed)
    rule = {
        "up": rng.choice([0.5, 0.7, 1.0]),
        "down": rng.choice([0.0, 0.2, 0.4]),
        "window": rng.randint(1, 9),
        "top": rng.randint(0, 5),
    }
    state, level, recent = Climb(0), 0, []
    skill = rng.random()
    for _ in range(60):
        batch = [float(rng.random() < skill) for _ in range(rng.randint(0, 7))]
        after = climb(state, batch, **rule)
        level, recent = _reference(level, recent, batch, **rule)
        assert (after.level, list(after.recent)) == (level, recent)
        assert 0 <= after.level <= rule["top"]
        assert len(after.recent) <= rule["window"]
        assert abs(after.level - state.level) <= 1  # one move per call at most
        if after.level != state.level:
            assert after.recent == ()
        state = after


def test_a_restored_window_of_lists_climbs_like_the_original() -> None:
    # a checkpoint may hand back lists: the same state, the same decision
    assert climb(Climb(0, [1.0, 1.0, 1.0]), [1], **RULE) == Climb(1, ())  # type: ignore[arg-type]
    assert pass_rate(()) != pass_rate(())  # NaN: nothing seen at the level yet
