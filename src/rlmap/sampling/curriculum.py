"""Curriculum: the difficulty of the training prompts follows the rolling pass rate.

A curriculum is a ladder of levels, 0 (easiest) .. ``top`` (the task the run is evaluated
on). The outcomes of the trajectories generated at the current level fill a window of the
last ``window`` of them; once it is full, a pass rate (its mean) of at least ``up`` moves
one level up, and one of at most ``down`` (a collapse) one level down. A move empties the
window, so each decision rests on ``window`` outcomes of the level it is about. Pure
functions of plain data: the state goes into checkpoints as it is, so a resume is exact.
What a level *is* belongs to the task (:func:`rlmap.tasks.reasoning_gym.level_args`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Climb:
    """Where a curriculum stands: its level and the outcomes seen there since it arrived."""

    level: int = 0
    recent: tuple[float, ...] = ()
    """The last ``window`` outcomes (at most) at ``level``, oldest first."""


def climb(
    state: Climb, outcomes: Sequence[float], *, up: float, down: float, window: int, top: int
) -> Climb:
    """The state after ``outcomes`` (verifier outcomes in [0, 1], in the order generated)
    at ``state.level``: one level up when the full window's mean is ``>= up`` (unless at
    ``top``), one down when it is ``<= down`` (unless at 0), with an empty window after a
    move; else the window rolls on. At most one move per call: the outcomes of a step were
    all drawn at its level."""
    recent = (tuple(state.recent) + tuple(float(x) for x in outcomes))[-window:]
    if len(recent) < window:
        return Climb(state.level, recent)
    rate = pass_rate(recent)
    if rate >= up and state.level < top:
        return Climb(state.level + 1)
    if rate <= down and state.level > 0:
        return Climb(state.level - 1)
    return Climb(state.level, recent)


def pass_rate(recent: Sequence[float]) -> float:
    """Mean outcome of the window; NaN when it is empty (just moved, nothing seen yet)."""
    return sum(recent) / len(recent) if recent else float("nan")
