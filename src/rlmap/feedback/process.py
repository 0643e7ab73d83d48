"""Process rewards: scorers that judge each turn of a trajectory, not only its outcome.

A scorer maps a :class:`~rlmap.feedback.reward.Trajectory` to one score per policy turn.
The trainer puts turn k's score at turn k's last action token (``Batch.token_rewards``),
so turn-level GAE credits each turn with its own step reward; a group estimator sees
their sum. Select one with ``feedback.source=process_reward feedback.process_reward=NAME``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rlmap.core.registry import Registry
from rlmap.feedback.reward import Trajectory
from rlmap.feedback.verifiers import exact_match

TOOL_STEP_BONUS = 0.1
"""Reward of the first tool call whose result is the answer (calculator_steps)."""


@dataclass(frozen=True)
class ProcessScorer:
    """A registered per-turn scorer."""

    fn: Callable[[Trajectory], Sequence[float]]
    summary: str


def calculator_steps(t: Trajectory) -> list[float]:
    """Per turn of the calculator task: ``TOOL_STEP_BONUS`` for the first tool call whose
    observation holds the correct result, 0 for the other calls, and on the last turn the
    environment's verdict of the answer (its ``feedback.verifier``; exact match when the
    trajectory carries none). A truncated episode gave no answer. Only the first useful
    call earns the bonus, so calling the tool again and again earns nothing (an uncapped
    step reward would be hacked)."""
    scores = [0.0] * len(t.turns)
    useful = f"<result>{t.reference}</result>"
    for k, observation in enumerate(t.observations[: len(t.turns)]):  # obs k follows turn k
        if observation.strip() == useful:
            scores[k] = TOOL_STEP_BONUS
            break
    if t.turns and not t.truncated:
        env = tuple(t.metadata.get("rewards", ()))  # the environment's verdict, if it gave one
        scores[-1] += env[-1] if len(env) == len(t.turns) else exact_match(t.response, t.reference)
    return scores


registry: Registry[ProcessScorer] = Registry("process reward")
registry.add(
    "calculator_steps",
    ProcessScorer(calculator_steps, "0.1 for the first useful tool call, then the answer"),
)
