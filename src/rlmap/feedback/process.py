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
    tasks: tuple[str, ...]
    """The ``data.task`` values whose environments record what the scorer reads (any
    other task is refused before a run starts: the scorer would be blind there)."""


def calculator_steps(t: Trajectory) -> list[float]:
    """Per turn of the calculator task: ``TOOL_STEP_BONUS`` for the first tool call whose
    result is the answer, 0 for the other calls, and on the last turn the environment's
    verdict of the answer (its ``feedback.verifier``; exact match when the trajectory
    carries none). A truncated episode gave no answer. Only the first useful call earns
    the bonus, so calling the tool again and again earns nothing (an uncapped step reward
    would be hacked).

    The tool's results are the environment's own records (``metadata["tool_results"]``,
    one per step: :attr:`rlmap.tasks.env.EnvStep.tool_result`), so the format of the call
    does not matter: the embedded model's ``<calc>`` markers and a chat model's JSON
    ``<tool_call>`` alike (before, the observation's text was matched against
    ``<result>X</result>``, and a chat model never earned the bonus)."""
    scores = [0.0] * len(t.turns)
    results = tuple(t.metadata.get("tool_results", ()))[: len(t.turns)]
    for k, result in enumerate(results):  # step k follows turn k
        if result is not None and result.strip() == t.reference.strip():
            scores[k] = TOOL_STEP_BONUS
            break
    if t.turns and not t.truncated:
        env = tuple(t.metadata.get("rewards", ()))  # the environment's verdict, if it gave one
        scores[-1] += env[-1] if len(env) == len(t.turns) else exact_match(t.response, t.reference)
    return scores


registry: Registry[ProcessScorer] = Registry("process reward")
registry.add(
    "calculator_steps",
    ProcessScorer(
        calculator_steps, "0.1 for the first useful call, then the answer", ("calculator",)
    ),
)
