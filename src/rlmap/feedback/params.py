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
    eval_verifier: str | None = None
    """The verifier of the held-out evaluation (``eval/*``); None uses ``verifier``. A
    stricter one than training's makes reward hacking visible: ``reward/*`` rises while
    ``eval/pass@1`` does not (``eval/train_verifier_pass@1`` scores the same held-out
    samples with the training verifier)."""
    timeout_s: float | None = None
    """Run the verifier in its own process with this per-call timeout (seconds): a hang
    becomes status ``timeout``, a crash ``infra_error``, and training goes on. None runs
    it in-process (the built-in pure-Python verifiers need no more)."""
    overlong_cache: int | None = None
    """L_c of DAPO's soft overlong punishment (L_max is ``generation.max_new_tokens``);
    None turns the shaping off."""
