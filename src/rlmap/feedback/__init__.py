"""Feedback axis: is the reward reliable, and what does it mean?

``registry`` holds the deterministic verifiers by name (``verifiers``,
``math_equiv``; model-written code runs in ``sandbox``); ``shaping`` holds reward
shaping (DAPO soft overlong punishment). docs/verifiers.md says what each
verifier's reference is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlmap.core.registry import Registry
from rlmap.feedback import reasoning_gym as _reasoning_gym
from rlmap.feedback import verifiers
from rlmap.feedback.math_equiv import MathEquiv
from rlmap.feedback.params import FeedbackParams, RewardSource


@dataclass(frozen=True)
class Verifier:
    """A registered verifier: ``fn(response, reference) -> reward``."""

    fn: Callable[[str, str], float]
    summary: str
    waits: bool = True
    """A call may wait outside this process (math-verify's worker, the code sandbox, a
    service): environments that call it are stepped concurrently
    (:func:`rlmap.rollout.episodes.step_all`). False for pure Python, which threads under
    the GIL cannot speed up; True by default, as a verifier added later may wait."""
    items: bool = False
    """Its reference is the example's item key (:attr:`rlmap.tasks.arithmetic.Example.reference`,
    e.g. a reasoning-gym item), not the answer text."""
    isolated: bool = False
    """Always run in its isolation worker (``feedback.timeout_s``, or ``ISOLATION_TIMEOUT_S``
    when unset): code rlmap does not control, which may hang or crash."""
    answers: bool = True
    """Its reference (with ``items``, the example's answer) is itself a correct response, so
    ``rlmap train --preflight`` checks that it scores 1; False where the reference is a
    specification a response must meet (unit tests, a schema, a pattern)."""


ISOLATION_TIMEOUT_S = 30.0
"""The per-call timeout of an ``isolated`` verifier when ``feedback.timeout_s`` is unset."""


registry: Registry[Verifier] = Registry("verifier")


def _pure(fn: Callable[[str, str], float], summary: str) -> Verifier:
    return Verifier(fn, summary, waits=False)


def _spec(fn: Callable[[str, str], float], summary: str) -> Verifier:
    return Verifier(fn, summary, waits=False, answers=False)  # its reference is a specification


registry.add("exact_match", _pure(verifiers.exact_match, "1 if the answer equals the reference"))
registry.add("last_number", _pure(verifiers.last_number, "1 if the last number equals it"))
registry.add("math_equiv", Verifier(MathEquiv(), "1 if math-verify finds the answer equal to it"))
registry.add(
    "code_tests",
    Verifier(verifiers.code_tests, "1 if the code passes its unit tests", answers=False),
)
registry.add("json_schema", _spec(verifiers.json_schema, "1 if the JSON validates against it"))
registry.add("regex", _spec(verifiers.regex_format, "1 if the response fully matches it"))
registry.add(
    "reasoning_gym",
    Verifier(
        _reasoning_gym.score_full,
        "reasoning-gym's score_answer: 1 on a full score",
        items=True,
        isolated=True,
    ),
)
registry.add(
    "reasoning_gym_partial",
    Verifier(
        _reasoning_gym.score,
        "reasoning-gym's score_answer, partial credit kept",
        items=True,
        isolated=True,
    ),
)
registry.add(
    "contains_answer",
    _pure(verifiers.contains_answer, "LOOSE on purpose (hacking demo): its digits anywhere"),
)

__all__ = ["FeedbackParams", "RewardSource", "Verifier", "registry"]
