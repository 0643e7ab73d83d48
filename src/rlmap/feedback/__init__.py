"""Feedback axis: is the reward reliable, and what does it mean?

``registry`` holds the deterministic verifiers by name; ``shaping`` holds reward
shaping (DAPO soft overlong punishment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlmap.core.registry import Registry
from rlmap.feedback import verifiers
from rlmap.feedback.params import FeedbackParams, RewardSource


@dataclass(frozen=True)
class Verifier:
    """A registered verifier: ``fn(response, reference) -> reward``."""

    fn: Callable[[str, str], float]
    summary: str


registry: Registry[Verifier] = Registry("verifier")
registry.add("exact_match", Verifier(verifiers.exact_match, "1 if the answer equals the reference"))
registry.add("last_number", Verifier(verifiers.last_number, "1 if the last number equals it"))

__all__ = ["FeedbackParams", "RewardSource", "Verifier", "registry"]
