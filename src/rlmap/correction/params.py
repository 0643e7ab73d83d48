"""Hyper-parameters of the behaviour axis: policy objective, ratio mode, corrections, KL.

These records are read by the recipe config and turned into keyword arguments by
the registered adapters; the math functions themselves never see them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RatioMode = Literal["decoupled", "bypass"]
KLPlacement = Literal["none", "reward", "loss"]
KLEstimatorName = Literal["k1", "k2", "k3"]


@dataclass(frozen=True)
class BehaviourParams:
    """Policy objective, ratio mode and behaviour corrections (docs/formulas.md §1, §3, §4)."""

    objective: str = "ppo_clip"
    """Name in ``rlmap.correction.registry``: pg, ppo_clip, cispo, gspo, sapo, direct_gate."""
    mode: RatioMode = "decoupled"
    """decoupled: π_old recomputed by the trainer; bypass: π_old := μ_old (κ ≡ 1, ρ = d)."""
    clip_low: float = 0.2
    """ε_low: lower clip of the ratio at 1 − ε_low (ppo_clip, cispo, gspo)."""
    clip_high: float = 0.2
    """ε_high: upper clip of the ratio at 1 + ε_high (Clip-Higher, DAPO: 0.28)."""
    dual_clip: float | None = None
    """c > 1 enables dual clip for Â < 0 (loss capped at −c·Â); None disables it."""
    gspo_token: bool = False
    """GSPO-token variant: s_{i,t} = sg(s_i)·π_θ/sg(π_θ), allowing per-token advantages."""
    sapo_tau_pos: float = 1.0
    """SAPO temperature τ for tokens with Â > 0."""
    sapo_tau_neg: float = 1.05
    """SAPO temperature τ for tokens with Â ≤ 0."""
    gate_low: float = 0.3
    """direct_gate ε_l: tokens with d ≤ 1 − ε_l get no gradient (SAO: 0.3 reasoning, 0.8 code)."""
    gate_high: float = 5.0
    """direct_gate ε_h: tokens with d ≥ 1 + ε_h get no gradient (SAO: 5.0 reasoning, 3.0 code)."""
    corrections: tuple[str, ...] = ()
    """Names in ``rlmap.correction.corrections`` whose detached weights multiply the objective."""
    tis_cap: float = 2.0
    """C of truncated importance sampling: w = min(κ, C)."""
    tis_level: Literal["token", "sequence"] = "token"
    """TIS on each token's κ_t, or on the sequence ratio κ_seq = exp(Σ_t log κ_t)."""
    icepop_low: float = 0.5
    """IcePop α: tokens with κ < α are masked."""
    icepop_high: float = 5.0
    """IcePop β: tokens with κ > β are masked."""
    masked_is_low: float = 0.5
    """masked_is α: a trajectory whose geometric-mean κ is below α is dropped."""
    masked_is_high: float = 2.0
    """masked_is β: a trajectory whose geometric-mean κ is above β is dropped."""
    max_staleness: int = 4
    """η: trajectories whose oldest token lags the learner by more than η versions are dropped."""
    decoupled_cap: float = 2.0
    """AReaL cap on the behaviour weight sg(π_prox/μ) of the decoupled correction."""
    positive_nll: float = 0.0
    """μ of VAPO's positive-example NLL term added to the loss (0 = off; VAPO: 0.1)."""
    routing_replay: bool = False
    """Mixture-of-experts policies: the learner's forward passes (π_θ, π_old) route every token
    through the experts the rollout engine used, with the learner router's probabilities
    renormalised over them (R3, Ma et al. 2025; :mod:`rlmap.system.routing`)."""


@dataclass(frozen=True)
class KLParams:
    """KL to the reference policy (docs/formulas.md §6)."""

    placement: KLPlacement = "none"
    """none; reward: r_t ← r_t − β·k1_t (classic RLHF); loss: j ← j + β·k (GRPO)."""
    estimator: KLEstimatorName = "k3"
    """Estimator of KL(π_θ ‖ π_ref) per token when placed in the loss: k1, k2 or k3."""
    beta: float = 0.0
    """β, the KL coefficient (the initial one when ``target`` is set)."""
    target: float | None = None
    """Target KL of the adaptive β controller (Ziegler et al. 2019); None keeps β fixed."""
    horizon: int = 10000
    """Horizon of the adaptive β controller, in samples (n/horizon scales each update)."""
