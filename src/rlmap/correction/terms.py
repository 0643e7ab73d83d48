"""The one input record every policy objective and behaviour correction takes."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rlmap.core.batch import Batch
from rlmap.correction.ratios import log_direct, log_kappa, log_rho, resolve_old


@dataclass(frozen=True)
class PolicyTerms:
    """Log-probabilities, advantages and masks of one (micro-)batch, shapes (B, T).

    Components read the fields they need and ignore the rest. The three log-ratios
    of docs/formulas.md §1 are derived properties, so every component forms them the same way.
    """

    logprobs: Tensor
    """(B, T) log π_θ of each sampled token, with grad."""
    old_logprobs: Tensor
    """(B, T) log π_old (equals ``behavior_logprobs`` in bypass mode)."""
    behavior_logprobs: Tensor
    """(B, T) log μ_old, as the rollout engine reported when it sampled."""
    advantages: Tensor
    """(B, T) Â, detached (0 off the action mask)."""
    mask: Tensor
    """(B, T) bool action mask m: policy-generated, trained tokens."""
    policy_version: Tensor | None = None
    """(B, T) long weight version that produced each action token (staleness)."""
    learner_version: int | None = None
    """The learner's current weight version; None if the caller does not track versions
    (the ``staleness`` correction then refuses to run rather than see a lag of 0)."""

    @property
    def log_rho(self) -> Tensor:
        """(B, T) log ρ = log π_θ − log π_old, clamped to [−20, 20]; with grad."""
        return log_rho(self.logprobs, self.old_logprobs)

    @property
    def log_kappa(self) -> Tensor:
        """(B, T) log κ = log π_old − log μ_old, clamped to [−20, 20]; detached."""
        return log_kappa(self.old_logprobs, self.behavior_logprobs)

    @property
    def log_d(self) -> Tensor:
        """(B, T) log d = log π_θ − log μ_old, clamped to [−20, 20]; with grad."""
        return log_direct(self.logprobs, self.behavior_logprobs)


def terms_from_batch(
    batch: Batch,
    logprobs_BT: Tensor,
    advantages_BT: Tensor,
    *,
    mode: str,
    learner_version: int | None = None,
) -> PolicyTerms:
    """PolicyTerms from a batch record, π_old resolved for the ratio ``mode``.

    Invalid trajectories (``batch.valid`` false) leave the action mask, so they
    contribute zero loss. ``learner_version`` is the learner's current weight version;
    the ``staleness`` correction needs it (None: not tracked).
    """
    return PolicyTerms(
        logprobs=logprobs_BT,
        old_logprobs=resolve_old(mode, batch.old_logprobs, batch.behavior_logprobs),
        behavior_logprobs=batch.behavior_logprobs,
        advantages=advantages_BT.detach(),
        mask=batch.action_mask & batch.valid.unsqueeze(-1),
        policy_version=batch.policy_version,
        learner_version=learner_version,
    )
