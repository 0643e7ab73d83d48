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
    format_pattern: str | None = None
    """A regular expression the final answer must fully match for the format reward."""
    format_weight: float = 0.0
    """Weight of the format reward (1 on a match, else 0); non-zero with ``format_pattern``."""
    length_target: int | None = None
    """Generated-token target of the length reward −|L − target| / target."""
    length_weight: float = 0.0
    """Weight of the length reward; non-zero with ``length_target``."""
    process_reward: str | None = None
    """A per-turn scorer (``rlmap.feedback.process.registry``) for ``source=process_reward``:
    its per-turn scores sit at each turn's last token (turn-level credit)."""
