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
from rlmap.feedback import verifiers
from rlmap.feedback.math_equiv import MathEquiv
from rlmap.feedback.params import FeedbackParams, RewardSource


@dataclass(frozen=True)
class Verifier:
    """A registered verifier: ``fn(response, reference) -> reward``."""

    fn: Callable[[str, str], float]
    summary: str
    waits: bool = False
    """A call waits on another process (math-verify's worker, the code sandbox): the
    environments that call it are stepped concurrently (:func:`rlmap.system.rollout.step_all`).
    False: pure Python under the GIL, which threads cannot speed up."""


registry: Registry[Verifier] = Registry("verifier")
registry.add("exact_match", Verifier(verifiers.exact_match, "1 if the answer equals the reference"))
registry.add("last_number", Verifier(verifiers.last_number, "1 if the last number equals it"))
registry.add(
    "math_equiv",
    Verifier(MathEquiv(), "1 if math-verify finds the answer equal to it", waits=True),
)
registry.add(
    "code_tests",
    Verifier(verifiers.code_tests, "1 if the code passes its unit tests", waits=True),
)
registry.add("json_schema", Verifier(verifiers.json_schema, "1 if the JSON validates against it"))
registry.add("regex", Verifier(verifiers.regex_format, "1 if the response fully matches it"))
registry.add(
    "contains_answer",
    Verifier(verifiers.contains_answer, "LOOSE on purpose (hacking demo): its digits anywhere"),
)

__all__ = ["FeedbackParams", "RewardSource", "Verifier", "registry"]
