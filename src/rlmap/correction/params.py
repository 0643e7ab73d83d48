"""Hyper-parameters of the behaviour axis: policy objective, ratio mode, corrections, KL.

These records are read by the recipe config and turned into keyword arguments by
the registered adapters; the math functions themselves never see them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

RatioMode = Literal["decoupled", "bypass"]
KLPlacement = Literal["none", "reward", "loss"]
KLEstimatorName = Literal["k1", "k2", "k3", "k3_iw"]


@dataclass(frozen=True)
class BehaviourParams:
    """Policy objective, ratio mode and behaviour corrections (docs/formulas.md §1, §3, §4)."""

    objective: str = "ppo_clip"
    """Name in ``rlmap.correction.registry``: pg, ppo_clip, cispo, gspo, sapo, direct_gate, dppo_tv,
    dppo_kl, dro, gmpo."""
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
    dppo_tv_low: float = 0.2
    """dppo_tv δ_low, a probability gap in [0, 1]: with Â < 0, a token whose probability fell by
    more than δ_low below the reference's (p_θ − p_ref < −δ_low) gets no policy gradient
    (prime-rl, SkyRL, verl: 0.2)."""
    dppo_tv_high: float = 0.2
    """dppo_tv δ_high, in [0, 1]: with Â > 0, a token whose probability rose by more than δ_high
    (p_θ − p_ref > δ_high) gets no policy gradient (prime-rl, SkyRL, verl: 0.2)."""
    dppo_kl_low: float = 0.05
    """dppo_kl δ_low, a binary KL in nats: with Â < 0, a token with p_θ < p_ref and
    KL(Bern(p_ref) ‖ Bern(p_θ)) > δ_low gets no policy gradient (SkyRL's advice, verl's example:
    0.05)."""
    dppo_kl_high: float = 0.05
    """dppo_kl δ_high: with Â > 0, a token with p_θ > p_ref and binary KL > δ_high gets no policy
    gradient (0.05, as dppo_kl_low)."""
    dppo_tau: float = 0.0
    """τ of the penalty τ·(log r)² that dppo_tv and dppo_kl add on every action token, masked ones
    too (prime-rl's default loss: 1e-3, the Kimi-K2.5 KL); 0 = off, as in the DPPO paper."""
    dro_beta: float = 0.05
    """DRO β > 0 of the penalty (β/2)·(log r)² (verl's and Tinker's examples: 0.05; verl has no
    default)."""
    gmpo_clip_low: float = 0.4
    """GMPO ε_low in *log* space: with Â_i < 0 each log r is clipped below at −ε_low (GMPO paper,
    TRL, verl's example: 0.4, i.e. a ratio band from e^−0.4 = 0.67)."""
    gmpo_clip_high: float = 0.4
    """GMPO ε_high in log space: with Â_i > 0 each log r is clipped above at ε_high (0.4: the band
    ends at e^0.4 = 1.49)."""
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
    m2po_threshold: float = 0.04
    """M2PO τ_M2 > 0: over each optimiser mini-batch, the tokens of largest (log κ)² are dropped
    until the mean (log κ)² of the rest is ≤ τ_M2 (AReaL's example: 0.04)."""
    opsm_delta: float = 1e-4
    """OPSM δ >= 0: a trajectory with Â < 0 whose mean log μ_old − log π_θ exceeds δ is dropped
    (DeepSeek-V3.2's off-policy sequence mask; slime: 1e-4). The mean is against the engine's
    μ, so it carries any engine mismatch: calibrate δ to the run's ``ratio/kappa`` (slime's
    1e-4 goes with its default reference, the trainer's recomputed π_old)."""
    positive_nll: float = 0.0
    """μ of VAPO's positive-example NLL term added to the loss (0 = off; VAPO: 0.1)."""
    routing_replay: bool = False
    """Mixture-of-experts policies: the learner's forward passes (π_θ, π_old) route every token
    through the experts the rollout engine used, with the learner router's probabilities
    renormalised over them (R3, Ma et al. 2025; :mod:`rlmap.models.routing`)."""
    replay_sampling_set: bool = False
    """Top-p kept-set replay: the rollout engine records the ids its top-p filter kept for every
    sampled token, and π_old, π_θ and π_ref are renormalised over that set (the sampled token
    always in it), as the engine's reported μ is, so ρ, κ and d compare like with like
    (slime #2102; docs/formulas.md §4.1). Needs generation.top_p < 1."""
    sampling_set_cap: int = 512
    """Largest kept set recorded, in ids: a larger one is not recorded and its token is scored
    over the full vocabulary (counted in ``sampling_set/overflow_frac``). Bounds the record's
    memory: (B, T, K) int32 with K at most this (prime-rl bounds top-k at 512)."""


@dataclass(frozen=True)
class KLParams:
    """KL to the reference policy (docs/formulas.md §6)."""

    placement: KLPlacement = "none"
    """none; reward: r_t ← r_t − β·k1_t (classic RLHF); loss: j ← j + β·k (GRPO)."""
    estimator: KLEstimatorName = "k3"
    """Estimator of KL(π_θ ‖ π_ref) per token when placed in the loss: k1, k2, k3, or k3_iw
    (ρ·k3 with ρ = π_θ/π_old not detached: DeepSeek-V3.2's unbiased KL)."""
    beta: float = 0.0
    """β, the KL coefficient (the initial one when ``target`` is set)."""
    target: float | None = None
    """Target KL of the adaptive β controller (Ziegler et al. 2019); None keeps β fixed."""
    horizon: int = 10000
    """Horizon of the adaptive β controller, in samples (n/horizon scales each update)."""
