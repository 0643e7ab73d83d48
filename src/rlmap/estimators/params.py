"""The credit axis's settings: which estimator, its discount and traces, and the critic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class CreditParams:
    """Which advantage estimator runs and its hyper-parameters (docs/formulas.md §2).

    Values and combinations are checked by ``rlmap.recipes.validate``, which names the field.
    """

    estimator: str = "grpo"
    """Registry name in ``rlmap.estimators.registry`` (e.g. ``grpo``, ``gae``, ``vtrace``)."""
    gamma: float = 1.0
    """Discount γ per time step (per action token or per assistant turn, see ``time_unit``)."""
    lam: float = 0.95
    """GAE λ, used for both the critic's return and the policy's advantage unless overridden."""
    lam_critic: float | None = None
    """Decoupled λ of the critic's TD(λ) return (VAPO: 1.0); None uses ``lam``."""
    lam_policy: float | None = None
    """λ of the policy's advantage; None uses ``lam``; ignored when ``adaptive_alpha`` is set."""
    adaptive_alpha: float | None = None
    """α of the length-adaptive λ_policy = 1 − 1/(α·l) (VAPO 0.05, SAO 1.5); None turns it off."""
    length_unit: Literal["token", "turn"] | None = None
    """Unit of the length l in the adaptive λ; None means the GAE time step (``time_unit``)."""
    time_unit: Literal["token", "turn"] = "token"
    """GAE/V-trace step: one per action token, or one per assistant turn."""
    std_eps: float = 1e-6
    """ε added to the std in GRPO's normalisation and in REINFORCE++ whitening."""
    rho_bar: float = 1.0
    """V-trace ρ̄, the truncation of the importance weight in the value target's TD error."""
    c_bar: float = 1.0
    """V-trace c̄, the truncation of the trace coefficient (ρ̄ ≥ c̄)."""
    rho_bar_pg: float = 1.0
    """V-trace ρ̄ of the importance weight on the policy advantage."""
    allow_length_unit_mismatch: bool = False
    """Explicit override: accept an adaptive-λ ``length_unit`` other than ``time_unit``."""
    step_advantage_weight: float = 1.0
    """ω of GiGPO's A = A^E + ω·A^S, the weight of the step advantage over anchor states
    (``sampling.group_scope=turn``; docs/formulas.md §2.4); GiGPO's 1.0."""

    @property
    def resolved_lam_critic(self) -> float:
        """λ of the critic's return: ``lam_critic`` or ``lam``."""
        return self.lam if self.lam_critic is None else self.lam_critic

    @property
    def resolved_lam_policy(self) -> float:
        """Constant λ of the policy advantage: ``lam_policy`` or ``lam`` (adaptive λ aside)."""
        return self.lam if self.lam_policy is None else self.lam_policy

    @property
    def resolved_length_unit(self) -> Literal["token", "turn"]:
        """Unit of l in the adaptive λ: ``length_unit`` or the GAE time step."""
        return self.time_unit if self.length_unit is None else self.length_unit


@dataclass(frozen=True)
class CriticParams:
    """The value critic used by critic-based credit (``gae``, ``vtrace``)."""

    enabled: bool = False
    """A value critic is trained; the estimators ``gae`` and ``vtrace`` need it."""
    value_clip: float = 0.5
    """ε_v of the clipped value loss: V is clipped to V_old ± ε_v."""
    updates_per_step: int = 1
    """Critic updates per actor update (SAO: K = 2)."""
    warmup_steps: int = 0
    """Critic-only steps before the first actor update."""
    pretrain_mc: bool = False
    """VAPO: pretrain the critic on Monte-Carlo returns before any policy update."""
