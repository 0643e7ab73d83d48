"""Replaying a trajectory to turn k: the state a branch starts from.

Two trajectories of one prompt stop being comparable after their first turn: tool results and
the environment's randomness differ. A *branch* group compares continuations of one state
instead: the first k actions of a trajectory are re-run in a fresh environment, which then
stands where the trajectory stood before its turn k, and G continuations are drawn from there
— the same state by construction, not by matching observations after the fact (GiGPO's
anchor states, ``sampling.group_scope=turn``, find equal states; this makes them).

Notation: a trajectory is the prompt x, then turns a_0, o_0, a_1, o_1, … (action ids, then
the observation ids the environment returned). Its context at turn k is

    c_k = x ‖ a_0 ‖ o_0 ‖ … ‖ a_{k−1} ‖ o_{k−1}

the ids the policy saw before sampling a_k (c_0 = x).

Only an environment that declares itself replayable (``replayable``,
:func:`rlmap.tasks.env.is_replayable`) is replayed; any other is refused in one line. A
replay given the recorded c_k checks it token for token, so an environment that claims to be
replayable and is not raises :class:`ReplayMismatch` rather than seeding a group with a state
the trajectory never was in.

Pure of the sampler: nothing here generates; a caller replays, then samples from
``Branch.context`` and steps ``Branch.env``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rlmap.core.errors import ConfigError
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvFactory, Environment, EnvStep, is_replayable


class ReplayMismatch(RuntimeError):
    """A replayed context differs from the recorded one: the environment is not replayable."""


@dataclass(frozen=True)
class Branch:
    """A fresh environment re-run to turn k, and what it has shown."""

    env: Environment
    """Positioned at turn k: its next ``step`` takes a_k."""
    context: tuple[int, ...]
    """c_k: the prompt, then each replayed action and the observation after it."""
    prompt_len: int
    """len(x): the prompt's ids, where the responses start in ``context``."""
    turn_ids: tuple[int, ...]
    """Per id of ``context`` after the prompt: its turn's index on actions, -1 on observations
    (``rlmap.rollout.episodes.Episode.turn_ids``'s layout)."""
    steps: tuple[EnvStep, ...]
    """What the environment returned for each of the k actions (observations, rewards)."""


def turn_actions(response_ids: Sequence[int], turn_ids: Sequence[int]) -> list[tuple[int, ...]]:
    """The action ids of each turn of a recorded trajectory (an ``Episode``'s ``response_ids``
    and ``turn_ids``: -1 on observation ids), in turn order."""
    turns: dict[int, list[int]] = {}
    for token, turn in zip(response_ids, turn_ids, strict=True):
        if turn >= 0:
            turns.setdefault(turn, []).append(int(token))
    return [tuple(turns[k]) for k in sorted(turns)]


def context_at(
    prompt_ids: Sequence[int], response_ids: Sequence[int], turn_ids: Sequence[int], turn: int
) -> tuple[int, ...]:
    """c_k of a recorded trajectory: the prompt and every response id before turn ``turn``'s
    first (the whole trajectory when it has no such turn)."""
    starts = [i for i, t in enumerate(turn_ids) if t == turn]
    end = starts[0] if starts else len(response_ids)
    return (*(int(i) for i in prompt_ids), *(int(i) for i in response_ids[:end]))


def replay(
    make: EnvFactory,
    example: Example,
    actions: Sequence[Sequence[int]],
    turn: int,
    *,
    expected: Sequence[int] | None = None,
) -> Branch:
    """A fresh environment of ``example`` re-run through ``actions[:turn]``.

    ConfigError when the environment does not declare itself replayable; ValueError when
    ``turn`` is not in 0..len(actions) or a replayed action ends the episode (no state
    follows it to branch from); :class:`ReplayMismatch` when ``expected`` (the recorded c_k)
    is given and the replayed context differs from it. An exception of the environment's own
    propagates (an infrastructure failure, as in an episode).
    """
    if not 0 <= turn <= len(actions):
        raise ValueError(f"turn: must be in 0..{len(actions)} (the trajectory's turns), got {turn}")
    env = require_replayable(make(example))
    context = [int(i) for i in env.reset()]
    prompt_len, turn_ids, steps = len(context), [], []
    for k, action in enumerate(actions[:turn]):
        step = env.step(action)
        if step.terminated or step.truncated:
            raise ValueError(
                f"turn {k} ended the replayed episode: no state after it to branch from"
            )
        context += [int(i) for i in action] + list(step.observation)
        turn_ids += [k] * len(action) + [-1] * len(step.observation)
        steps.append(step)
    if expected is not None:
        _check(tuple(context), tuple(int(i) for i in expected), type(env).__name__)
    return Branch(env, tuple(context), prompt_len, tuple(turn_ids), tuple(steps))


def require_replayable(env: Environment) -> Environment:
    """``env``, when it declares itself replayable; else ConfigError, one line naming
    ``sampling.group_scope``."""
    if not is_replayable(env):
        raise ConfigError(
            f"sampling.group_scope: branch re-runs a trajectory's actions to draw continuations "
            f"from one state, and {type(env).__name__} does not declare itself replayable "
            "(replayable = True: reset and the same actions give the same observations)"
        )
    return env


def _check(replayed: tuple[int, ...], expected: tuple[int, ...], name: str) -> None:
    if replayed == expected:
        return
    at = next(
        (i for i, (a, b) in enumerate(zip(replayed, expected, strict=False)) if a != b),
        min(len(replayed), len(expected)),
    )
    raise ReplayMismatch(
        f"{name}: the replayed context differs from the trajectory's at id {at} "
        f"({len(replayed)} ids replayed, {len(expected)} recorded); it is not replayable"
    )


def branches(
    make: EnvFactory,
    example: Example,
    actions: Sequence[Sequence[int]],
    turn: int,
    n: int,
    *,
    expected: Sequence[int] | None = None,
) -> list[Branch]:
    """``n`` independent replays to turn ``turn`` (:func:`replay`): one environment per
    continuation, each in the same state, none sharing another's."""
    return [replay(make, example, actions, turn, expected=expected) for _ in range(n)]
