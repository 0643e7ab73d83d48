"""Policy objectives: per-token losses j_{i,t} to minimise (docs/formulas.md §3).

Notation: Â = advantages (B, T), m = action mask, r = exp(log ρ) the ratio the
mode selects (ρ in decoupled mode; d in bypass mode, where π_old := μ_old), sg =
stop-gradient. Every objective returns the *unreduced* (B, T) loss, zero off the
mask; averaging it is the reduction axis's job (docs/formulas.md §5).

Each objective comes in two layers: a pure ``*_loss`` function (tensors and keyword
hyper-parameters in, loss out) and a registered adapter ``fn(terms, p)`` that reads
:class:`BehaviourParams`, masks the loss and adds detached diagnostics: clip
fractions and the tails of every ratio in use (ρ and κ in decoupled mode, d always).
The clip fractions are keyed ``ratio/rho/*`` in both modes; in bypass mode the
clipped ratio is d (see :func:`_clip_fracs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlmap.core.ops import at_least_float32, masked_mean
from rlmap.core.registry import Registry
from rlmap.correction.params import BehaviourParams
from rlmap.correction.ratios import ratio_stats, sequence_mean
from rlmap.correction.terms import PolicyTerms

ObjectiveFn = Callable[[PolicyTerms, BehaviourParams], tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class Objective:
    """A registered policy objective: ``fn(terms, p) -> (j_BT, diagnostics)``."""

    fn: ObjectiveFn
    summary: str
    paper: str
    params: tuple[str, ...] = ()
    """The :class:`BehaviourParams` fields this objective reads (shown by ``rlmap explain``)."""
    uses_ratio: bool = True
    """False for on-policy objectives with no importance ratio: reusing a batch for a
    second update would make them silently off-policy."""
    sequence_level: bool = False
    """True if j_{i,t} is one sequence loss j_i copied onto every action token of i, so
    each token's log π_θ gets gradient through every other token's copy. A per-token
    correction weight then cannot stop a token's gradient (docs/formulas.md §4): combining
    them is a configuration error (:func:`rlmap.correction.loss.check_behaviour`)."""
    token_switch: str | None = None
    """The boolean :class:`BehaviourParams` field that, when true, makes a sequence-level
    objective token-level (gspo: ``gspo_token``); None if there is none."""
    code: str = ""
    """The anchor implementations (repository, file::function) the objective was checked
    against, where docs/formulas.md §3 says how each differs; empty where none was read."""

    def is_sequence_level(self, p: BehaviourParams) -> bool:
        """Whether the objective is sequence-level under the settings ``p``."""
        switched = self.token_switch is not None and bool(getattr(p, self.token_switch))
        return self.sequence_level and not switched


# ---------------------------------------------------------------- pure math


def pg_loss(logprobs_BT: Tensor, advantages_BT: Tensor) -> Tensor:
    """j = −Â · log π_θ (on-policy REINFORCE; no ratio); (B, T).

    Paper: Williams 1992. Used on-policy (one update per batch), where π_θ = π_old.
    """
    return -advantages_BT * logprobs_BT


def ppo_clip_loss(
    log_ratio_BT: Tensor,
    advantages_BT: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> Tensor:
    """j = −min(r·Â, clip(r, 1−ε_low, 1+ε_high)·Â) = max(−r·Â, −clip(r)·Â); (B, T).

    Paper: Schulman et al. 2017 (PPO); Clip-Higher ε_high = 0.28 (DAPO, Yu et al. 2025).
    The gradient is zero where the clip is active in the direction of the advantage
    (Â > 0 and r > 1+ε_high; Â < 0 and r < 1−ε_low).

    Dual clip (Ye et al. 2020), ``dual_clip`` = c > 1, for Â < 0 only. The paper
    maximises max(min(r·Â, clip(r)·Â), c·Â); negating for a loss to minimise:
        j = min(max(−r·Â, −clip(r)·Â), −c·Â)   for Â < 0,
    i.e. the loss r·|Â|, unbounded as r → ∞ when Â < 0, is capped from above at
    c·|Â| = −c·Â (and carries no gradient there). Â ≥ 0 is unchanged.
    """
    r = log_ratio_BT.exp()  # (B, T)
    unclipped = -advantages_BT * r
    clipped = -advantages_BT * r.clamp(1.0 - clip_low, 1.0 + clip_high)
    j = torch.maximum(unclipped, clipped)  # (B, T)
    if dual_clip is not None:
        capped = torch.minimum(j, -dual_clip * advantages_BT)
        j = torch.where(advantages_BT < 0, capped, j)
    return j


def cispo_loss(
    logprobs_BT: Tensor,
    log_ratio_BT: Tensor,
    advantages_BT: Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> Tensor:
    """j = −sg(clip(r, 1−ε_low, 1+ε_high)) · Â · log π_θ; (B, T).

    Paper: MiniMax-M1 (MiniMax 2025), CISPO. Only the importance weight is clipped,
    so every token keeps a gradient (unlike PPO, which drops clipped tokens). The
    paper leaves ε_low effectively unbounded and tunes ε_high.
    """
    weight = log_ratio_BT.exp().clamp(1.0 - clip_low, 1.0 + clip_high).detach()  # (B, T)
    return -weight * advantages_BT * logprobs_BT


def gspo_loss(
    log_ratio_BT: Tensor,
    advantages_BT: Tensor,
    mask_BT: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    token_level: bool = False,
) -> Tensor:
    """GSPO: the PPO clip on the sequence ratio s_i = exp(mean_t log r_{i,t}); (B, T).

    Paper: Zheng et al. 2025 (Qwen, GSPO); ε_low = 3e-4, ε_high = 4e-4.

        log s_i = Σ_t m_{i,t} log r_{i,t} / |o_i|
        j_i     = −min(s_i·Â_i, clip(s_i, 1−ε_low, 1+ε_high)·Â_i)

    Placement on tokens: j_i is written on *every* action token of trajectory i.
    The response_mean reduction (1/B) Σ_i (Σ_t m_{i,t} j_i)/|o_i| then equals the
    paper's sequence mean (1/B) Σ_i j_i, value and gradient. (Under token_mean a
    sequence would weigh |o_i|/Σ|o|, which the paper does not do.)
    Â_i is the masked mean of Â over the trajectory — the scalar itself for outcome
    estimators, which broadcast one advantage to all tokens. Because every token's
    log π_θ gets gradient through every copy of j_i, a per-token correction weight
    cannot stop one token's gradient; ``check_behaviour`` rejects token-level
    corrections unless ``gspo_token`` is set.

    GSPO-token (``token_level``): s_{i,t} = sg(s_i) · π_θ(t)/sg(π_θ(t)) with the
    per-token Â_{i,t}. Its value equals s_i and its gradient w.r.t. log π_θ(t) is
    s_i, so with a constant per-sequence Â it matches GSPO under response_mean.
    """
    log_s_B1 = sequence_mean(log_ratio_BT, mask_BT).unsqueeze(-1)  # (B, 1)
    if token_level:
        # value s_i, gradient routed to each token's own log π_θ
        log_s_BT = log_s_B1.detach() + log_ratio_BT - log_ratio_BT.detach()
        adv_BT = advantages_BT
    else:
        log_s_BT = log_s_B1.expand_as(log_ratio_BT)
        adv_BT = sequence_mean(advantages_BT, mask_BT).unsqueeze(-1).expand_as(log_ratio_BT)
    return ppo_clip_loss(log_s_BT, adv_BT, clip_low=clip_low, clip_high=clip_high)


def sapo_loss(
    log_ratio_BT: Tensor, advantages_BT: Tensor, *, tau_pos: float, tau_neg: float
) -> Tensor:
    """j = −f(r)·Â, f(r) = σ(τ(r − 1))·4/τ, τ = τ_pos if Â > 0 else τ_neg; (B, T).

    Paper: Gao et al. 2025 (Qwen, SAPO). A soft gate instead of a hard clip:
    f'(r) = 4·σ'(τ(r−1)) peaks at 1 when r = 1 (so the gradient w.r.t. log π_θ is
    −Â there, the plain policy gradient) and decays smoothly away from it, faster
    for negative advantages (τ_neg > τ_pos).
    """
    r = log_ratio_BT.exp()  # (B, T)
    tau = torch.where(advantages_BT > 0, tau_pos, tau_neg).to(r.dtype)  # (B, T)
    f = torch.sigmoid(tau * (r - 1.0)) * 4.0 / tau
    return -f * advantages_BT


def direct_gate_loss(
    logprobs_BT: Tensor,
    log_d_BT: Tensor,
    advantages_BT: Tensor,
    *,
    gate_low: float,
    gate_high: float,
) -> Tensor:
    """j = −sg(w)·Â·log π_θ, w = d · 1[1−ε_l < d < 1+ε_h], d = π_θ/μ_old; (B, T).

    Paper: SAO ("DIS", direct importance sampling with a double-sided acceptance
    gate); ε = (0.3, 5.0) reasoning, (0.8, 3.0) coding. The gate is double-sided
    regardless of the sign of Â: a token outside the band gets no gradient at all.
    """
    d = log_d_BT.exp()  # (B, T)
    inside = (d > 1.0 - gate_low) & (d < 1.0 + gate_high)
    weight = torch.where(inside, d, 0.0).detach()
    return -weight * advantages_BT * logprobs_BT


def ppo_clip_active(
    ratio_BT: Tensor, advantages_BT: Tensor, *, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """(high, low) bool (B, T): where PPO's clip removes the gradient.

    high: Â > 0 and r > 1+ε_high; low: Â < 0 and r < 1−ε_low.
    """
    high = (advantages_BT > 0) & (ratio_BT > 1.0 + clip_high)
    low = (advantages_BT < 0) & (ratio_BT < 1.0 - clip_low)
    return high, low


def log_ratio_penalty(log_ratio_BT: Tensor) -> Tensor:
    """(log r)², the quadratic proximity penalty of DRO (×β/2) and of prime-rl's DPPO (×τ); (B, T).

    Its gradient w.r.t. log π_θ is 2·log r: zero at r = 1, pulling π_θ back towards the
    reference from either side. Every action token pays it, whatever its advantage or mask
    (the Kimi-K2.5 KL, arXiv 2602.02276; Kimi k1.5 puts it on the sequence log-ratio instead).
    """
    return log_ratio_BT.square()


def dppo_tv_dropped(
    logprobs_BT: Tensor,
    ref_logprobs_BT: Tensor,
    advantages_BT: Tensor,
    *,
    delta_low: float,
    delta_high: float,
) -> tuple[Tensor, Tensor]:
    """(high, low) bool (B, T): where DPPO's binary-TV trust region drops the policy gradient.

    Paper: Qi et al. 2026, arXiv 2602.04879, Eq. 13. With Δ = p_θ − p_ref, a gap of
    *probabilities* (not a ratio), chosen by the sign of Â:

        high = 1[Â > 0 ∧ Δ > δ_high]      low = 1[Â < 0 ∧ Δ < −δ_low]

    Both are computed without gradient (the mask is a constant of the update).
    Differs from prime-rl and verl: at Â = 0 they apply the low test; here nothing is
    dropped (as SkyRL). The loss is the same (Â = 0 has no policy gradient); only the
    mask fraction differs.
    """
    gap = at_least_float32(logprobs_BT.detach()).exp() - at_least_float32(ref_logprobs_BT).exp()
    high = (advantages_BT > 0) & (gap > delta_high)
    low = (advantages_BT < 0) & (gap < -delta_low)
    return high, low


def binary_kl(log_p_BT: Tensor, log_q_BT: Tensor) -> Tensor:
    """KL(Bern(p) ‖ Bern(q)) = p·ln(p/q) + (1−p)·ln((1−p)/(1−q)) per token; (B, T).

    The KL between the two-outcome distributions "this token" / "any other token". The 1e-8
    in the second term is verl's and SkyRL's: it keeps it finite when p or q rounds to 1.
    """
    log_p, log_q = at_least_float32(log_p_BT), at_least_float32(log_q_BT)
    p, q = log_p.exp(), log_q.exp()
    return p * (log_p - log_q) + (1.0 - p) * torch.log((1.0 - p + 1e-8) / (1.0 - q + 1e-8))


def dppo_kl_dropped(
    logprobs_BT: Tensor,
    ref_logprobs_BT: Tensor,
    advantages_BT: Tensor,
    *,
    delta_low: float,
    delta_high: float,
) -> tuple[Tensor, Tensor]:
    """(high, low) bool (B, T): where DPPO's binary-KL trust region drops the policy gradient.

    Paper: Qi et al. 2026, arXiv 2602.04879, Eq. 14. With D = KL(Bern(p_ref) ‖ Bern(p_θ))
    (:func:`binary_kl`, reference first, as verl and SkyRL):

        high = 1[Â > 0 ∧ p_θ > p_ref ∧ D > δ_high]   low = 1[Â < 0 ∧ p_θ < p_ref ∧ D > δ_low]

    Unlike the TV gap, D grows fast near p = 0 or 1: p_ref = 0.9 → p_θ = 0.99 is a TV gap of
    0.09 but a binary KL of 0.144. At Â = 0 nothing is dropped (verl: the low test).
    """
    logp = logprobs_BT.detach()
    kl = binary_kl(ref_logprobs_BT, logp)
    high = (advantages_BT > 0) & (logp > ref_logprobs_BT) & (kl > delta_high)
    low = (advantages_BT < 0) & (logp < ref_logprobs_BT) & (kl > delta_low)
    return high, low


def dppo_loss(
    log_ratio_BT: Tensor, advantages_BT: Tensor, dropped_BT: Tensor, *, tau: float = 0.0
) -> Tensor:
    """j = −M·r·Â + τ·(log r)², M = 1 − dropped (DPPO's binary trust-region mask); (B, T).

    Paper: Qi et al. 2026 ("Rethinking the Trust Region in LLM RL", DPPO), arXiv 2602.04879,
    Eq. 11: PPO's ratio clip is replaced by a mask on the probability gap
    (:func:`dppo_tv_dropped`, :func:`dppo_kl_dropped`); a kept token carries the *raw*,
    unclipped ratio, so its gradient is −Â·r·∇log π_θ, a dropped one has none. With no token
    dropped and τ = 0, j is the unclipped surrogate −r·Â (ppo_clip with an infinite ε).
    The optional τ term (prime-rl's default loss; 0 in the paper) applies to every token.
    Differs from verl: its j = −M·Â·sg(min(r, C))·log π_θ (C = ``clip_ratio_c``, 3 by
    default) has the same gradient wherever r < C, another value; rlmap does not truncate.
    """
    pg = torch.where(dropped_BT, 0.0, -log_ratio_BT.exp() * advantages_BT)  # (B, T)
    return pg + tau * log_ratio_penalty(log_ratio_BT)


def dro_loss(
    logprobs_BT: Tensor, log_ratio_BT: Tensor, advantages_BT: Tensor, *, beta: float
) -> Tensor:
    """j = −Â·log π_θ + (β/2)·(log r)²; (B, T). ∂j/∂log π_θ = −Â + β·log r.

    Direct Reward Optimization: Richemond et al. 2024 (arXiv 2405.19107) and Kimi k1.5
    (Kimi Team 2025, arXiv 2501.12599), as verl's ``compute_policy_loss_dro`` and Tinker's
    ``loss_fn="dro"`` write it. The plain policy gradient plus a quadratic pull towards the
    reference of r, so that a batch can be reused off-policy. Not "distributionally robust".
    Differs from Kimi k1.5: the penalty is per token, not on the sequence log-ratio (as both
    anchors). At r = 1 (one update per batch in decoupled mode) it is exactly ``pg``.
    """
    return pg_loss(logprobs_BT, advantages_BT) + 0.5 * beta * log_ratio_penalty(log_ratio_BT)


def gmpo_clipped_log_ratio(
    log_ratio_BT: Tensor, seq_advantages_B1: Tensor, *, clip_low: float, clip_high: float
) -> Tensor:
    """ℓ̃ = min(log r, ε_high) if Â_i > 0, max(log r, −ε_low) otherwise; (B, T).

    PPO's one-sided clip written in log space (GMPO): the clip binds only in the direction
    the advantage pushes, and a clipped token gets no gradient.
    """
    high = log_ratio_BT.clamp(max=clip_high)
    low = log_ratio_BT.clamp(min=-clip_low)
    return torch.where(seq_advantages_B1 > 0, high, low)


def gmpo_loss(
    log_ratio_BT: Tensor,
    advantages_BT: Tensor,
    mask_BT: Tensor,
    *,
    clip_low: float,
    clip_high: float,
) -> Tensor:
    """GMPO: −Â_i · s_i, s_i the *geometric* mean of the clipped token ratios; (B, T).

    Paper: Zhao et al. 2025 (Geometric-Mean Policy Optimization), arXiv 2507.20673;
    ε = 0.4 in log space.

        ℓ̃_{i,t} = min(log r, ε_high) if Â_i > 0 else max(log r, −ε_low)
        s_i     = exp(Σ_t m_{i,t} ℓ̃_{i,t} / |o_i|)
        j_i     = −Â_i · s_i

    Â_i is the masked mean of Â over the trajectory (the scalar itself for outcome
    estimators). As :func:`gspo_loss`, j_i is written on every action token of i, so the
    ``response_mean`` reduction gives the paper's (1/B) Σ_i j_i, value and gradient, with
    rows of |o_i| = 0 contributing 0 and still counting in B (verl's ``torch.mean``, TRL's
    ``.mean()``). verl's ``geo_mean`` ignores ``loss_agg_mode``; rlmap applies the
    configured reduction (under ``token_mean`` a sequence would weigh |o_i|/N).
    Differs from verl: verl clips by the sign of each token's Â and does not clamp log r
    to ±20; the two agree for outcome advantages (one Â per trajectory).
    """
    adv_B1 = sequence_mean(advantages_BT, mask_BT).unsqueeze(-1)  # (B, 1) Â_i
    clipped = gmpo_clipped_log_ratio(log_ratio_BT, adv_B1, clip_low=clip_low, clip_high=clip_high)
    s_B1 = sequence_mean(clipped, mask_BT).exp().unsqueeze(-1)  # (B, 1)
    return (-adv_B1 * s_B1).expand_as(log_ratio_BT)


# ---------------------------------------------------------------- adapters


def _ratio_tails(terms: PolicyTerms, p: BehaviourParams) -> dict[str, Tensor]:
    """Tails of d always; of ρ and κ too in decoupled mode (in bypass ρ = d, κ ≡ 1)."""
    stats = ratio_stats(terms.log_d, terms.mask, "d")
    if p.mode == "decoupled":
        stats |= ratio_stats(terms.log_rho, terms.mask, "rho")
        stats |= ratio_stats(terms.log_kappa, terms.mask, "kappa")
    return stats


def _on_mask(j_BT: Tensor, terms: PolicyTerms) -> Tensor:
    """j where m, 0 elsewhere (``where``, not a product, so garbage off the mask cannot leak)."""
    return torch.where(terms.mask, j_BT, 0.0)


def _clip_fracs(high_BT: Tensor, low_BT: Tensor, mask_BT: Tensor) -> dict[str, Tensor]:
    """Fractions of action tokens where the clip removes the gradient (upper, lower, either).

    Keys: ``ratio/rho/clipped_frac``, ``ratio/rho/clipped_high_frac``,
    ``ratio/rho/clipped_low_frac``. The keys name ρ whatever the mode: in bypass mode
    π_old := μ_old, so the clipped ratio is the direct ratio d = π_θ/μ_old (= ρ there),
    and these fractions are d's. The names stay fixed so that a metric keeps one key
    across modes; read them together with ``behaviour.mode``.
    """
    return {
        "ratio/rho/clipped_frac": masked_mean((high_BT | low_BT).float(), mask_BT),
        "ratio/rho/clipped_high_frac": masked_mean(high_BT.float(), mask_BT),
        "ratio/rho/clipped_low_frac": masked_mean(low_BT.float(), mask_BT),
    }


def _pg(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    j = pg_loss(terms.logprobs, terms.advantages)
    return _on_mask(j, terms), _ratio_tails(terms, p)


def _ppo_clip(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip on the mode's ratio r (ρ in decoupled mode, d in bypass mode).

    Diagnostics ``ratio/rho/clipped_*`` and ``ratio/rho/dual_clipped_frac`` measure r:
    in bypass mode they are the clip fractions of d, not of a recomputed ρ
    (see :func:`_clip_fracs`).
    """
    log_r, adv = terms.log_rho, terms.advantages
    j = ppo_clip_loss(log_r, adv, clip_low=p.clip_low, clip_high=p.clip_high, dual_clip=p.dual_clip)
    r = log_r.detach().exp()
    high, low = ppo_clip_active(r, adv, clip_low=p.clip_low, clip_high=p.clip_high)
    diag = _clip_fracs(high, low, terms.mask) | _ratio_tails(terms, p)
    if p.dual_clip is not None:
        dual = (adv < 0) & (r > p.dual_clip)
        diag["ratio/rho/dual_clipped_frac"] = masked_mean(dual.float(), terms.mask)
    return _on_mask(j, terms), diag


def _cispo(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    log_r = terms.log_rho
    j = cispo_loss(
        terms.logprobs, log_r, terms.advantages, clip_low=p.clip_low, clip_high=p.clip_high
    )
    r = log_r.detach().exp()
    high, low = r > 1.0 + p.clip_high, r < 1.0 - p.clip_low  # the weight is clipped
    return _on_mask(j, terms), _clip_fracs(high, low, terms.mask) | _ratio_tails(terms, p)


def _gspo(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    log_r, adv, mask = terms.log_rho, terms.advantages, terms.mask
    j = gspo_loss(
        log_r, adv, mask, clip_low=p.clip_low, clip_high=p.clip_high, token_level=p.gspo_token
    )
    s_B1 = sequence_mean(log_r.detach(), mask).exp().unsqueeze(-1)  # (B, 1)
    adv_sign = adv if p.gspo_token else sequence_mean(adv, mask).unsqueeze(-1)
    high, low = ppo_clip_active(
        s_B1.expand_as(adv), adv_sign.expand_as(adv), clip_low=p.clip_low, clip_high=p.clip_high
    )
    return _on_mask(j, terms), _clip_fracs(high, low, mask) | _ratio_tails(terms, p)


def _sapo(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    j = sapo_loss(terms.log_rho, terms.advantages, tau_pos=p.sapo_tau_pos, tau_neg=p.sapo_tau_neg)
    return _on_mask(j, terms), _ratio_tails(terms, p)


def _direct_gate(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    log_d = terms.log_d
    j = direct_gate_loss(
        terms.logprobs, log_d, terms.advantages, gate_low=p.gate_low, gate_high=p.gate_high
    )
    d = log_d.detach().exp()
    outside = (d <= 1.0 - p.gate_low) | (d >= 1.0 + p.gate_high)
    diag = {"ratio/d/masked_frac": masked_mean(outside.float(), terms.mask)}
    return _on_mask(j, terms), diag | _ratio_tails(terms, p)


def _dppo(
    terms: PolicyTerms, p: BehaviourParams, high: Tensor, low: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO on the mode's r. The mask's reference is the same π_old as r's: the trainer's
    recomputation in decoupled mode, μ_old in bypass mode (the paper's, prime-rl's, SkyRL's).

    ``ratio/rho/clipped_*`` are the dropped fractions (high: Â > 0, low: Â < 0): a dropped
    token loses its gradient exactly as a clipped one does in ppo_clip.
    """
    j = dppo_loss(terms.log_rho, terms.advantages, high | low, tau=p.dppo_tau)
    return _on_mask(j, terms), _clip_fracs(high, low, terms.mask) | _ratio_tails(terms, p)


def _dppo_tv(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    high, low = dppo_tv_dropped(
        terms.logprobs,
        terms.old_logprobs,
        terms.advantages,
        delta_low=p.dppo_tv_low,
        delta_high=p.dppo_tv_high,
    )
    return _dppo(terms, p, high, low)


def _dppo_kl(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    high, low = dppo_kl_dropped(
        terms.logprobs,
        terms.old_logprobs,
        terms.advantages,
        delta_low=p.dppo_kl_low,
        delta_high=p.dppo_kl_high,
    )
    return _dppo(terms, p, high, low)


def _dro(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    j = dro_loss(terms.logprobs, terms.log_rho, terms.advantages, beta=p.dro_beta)
    return _on_mask(j, terms), _ratio_tails(terms, p)


def _gmpo(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    """``ratio/rho/clipped_*``: tokens whose log r the clip holds (no gradient), high for
    Â_i > 0 and log r > ε_high, low for Â_i < 0 and log r < −ε_low (TRL's clip_ratio/*)."""
    log_r, adv, mask = terms.log_rho, terms.advantages, terms.mask
    j = gmpo_loss(log_r, adv, mask, clip_low=p.gmpo_clip_low, clip_high=p.gmpo_clip_high)
    adv_B1 = sequence_mean(adv, mask).unsqueeze(-1)  # (B, 1)
    log_r = log_r.detach()
    high = (adv_B1 > 0) & (log_r > p.gmpo_clip_high)
    low = (adv_B1 < 0) & (log_r < -p.gmpo_clip_low)
    return _on_mask(j, terms), _clip_fracs(high, low, mask) | _ratio_tails(terms, p)


registry: Registry[Objective] = Registry("policy objective")
_CLIP = ("clip_low", "clip_high")
registry.add(
    "pg",
    Objective(_pg, "−Â·log π_θ, on-policy REINFORCE", "Williams 1992", uses_ratio=False),
)
registry.add(
    "ppo_clip",
    Objective(
        _ppo_clip,
        "PPO clip on ρ, asymmetric ε, optional dual clip",
        "Schulman et al. 2017",
        (*_CLIP, "dual_clip"),
    ),
)
registry.add(
    "cispo",
    Objective(_cispo, "clipped, detached IS weight × Â·log π_θ", "MiniMax-M1, 2025", _CLIP),
)
registry.add(
    "gspo",
    Objective(
        _gspo,
        "PPO clip on the sequence ratio",
        "Zheng et al. 2025 (GSPO)",
        (*_CLIP, "gspo_token"),
        sequence_level=True,
        token_switch="gspo_token",
    ),
)
registry.add(
    "sapo",
    Objective(
        _sapo,
        "soft sigmoid gate instead of a clip",
        "Gao et al. 2025 (SAPO)",
        ("sapo_tau_pos", "sapo_tau_neg"),
    ),
)
registry.add(
    "direct_gate",
    Objective(
        _direct_gate,
        "d·Â·log π_θ gated to 1−ε_l < d < 1+ε_h (DIS)",
        "Hou et al. (SAO)",
        ("gate_low", "gate_high"),
    ),
)
_DPPO_PAPER = "Qi et al. 2026, Rethinking the Trust Region in LLM RL (DPPO), arXiv 2602.04879"
registry.add(
    "dppo_tv",
    Objective(
        _dppo_tv,
        "raw r·Â; a token whose probability moved past δ in Â's direction is dropped (TV)",
        _DPPO_PAPER + ", Eq. 13",
        ("dppo_tv_low", "dppo_tv_high", "dppo_tau"),
        code="verl trainer/ppo/core_algos.py::compute_policy_loss_dppo_tv (0.9.1); prime-rl "
        "trainer/rl/loss.py::default_loss_fn; SkyRL skyrl_train/utils/ppo_utils.py::"
        "dppo_policy_loss (binary_tv)",
    ),
)
registry.add(
    "dppo_kl",
    Objective(
        _dppo_kl,
        "raw r·Â; a token whose binary KL to the reference passed δ in Â's direction is dropped",
        _DPPO_PAPER + ", Eq. 14",
        ("dppo_kl_low", "dppo_kl_high", "dppo_tau"),
        code="verl trainer/ppo/core_algos.py::compute_policy_loss_dppo_kl (0.9.1); SkyRL "
        "skyrl_train/utils/ppo_utils.py::dppo_policy_loss (binary_kl)",
    ),
)
registry.add(
    "dro",
    Objective(
        _dro,
        "−Â·log π_θ + (β/2)(log r)², direct reward optimisation",
        "Richemond et al. 2024, arXiv 2405.19107; Kimi Team 2025, Kimi k1.5, arXiv 2501.12599",
        ("dro_beta",),
        code="verl trainer/ppo/core_algos.py::compute_policy_loss_dro (0.9.1); Tinker "
        'loss_fn="dro" (tinker-docs /tinker/losses/dro)',
    ),
)
registry.add(
    "gmpo",
    Objective(
        _gmpo,
        "−Â_i × geometric mean of the log-space-clipped token ratios",
        "Zhao et al. 2025, Geometric-Mean Policy Optimization (GMPO), arXiv 2507.20673",
        ("gmpo_clip_low", "gmpo_clip_high"),
        sequence_level=True,
        code="verl trainer/ppo/core_algos.py::compute_policy_loss_geo_mean (0.9.1); TRL "
        "trl/experimental/gmpo/gmpo_trainer.py::GMPOTrainer._compute_loss",
    ),
)
