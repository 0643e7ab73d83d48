"""Hyper-parameters of the feedback axis: where the reward comes from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RewardSource = Literal["verifier", "reward_model", "process_reward", "environment", "comparison"]


@dataclass(frozen=True)
class FeedbackParams:
    """Where the reward comes from and how it is shaped."""

    source: RewardSource = "verifier"
    """Kind of feedback: deterministic verifier, learned reward model, process reward,
    environment return, or pairwise comparisons."""
    verifier: str = "exact_match"
    """Name in ``rlmap.feedback.registry`` when ``source`` is ``verifier``."""
    overlong_cache: int | None = None
    """L_c of DAPO's soft overlong punishment (L_max is ``generation.max_new_tokens``);
    None turns the shaping off."""
