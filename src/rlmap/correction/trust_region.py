"""Objectives that keep π_θ near the policy that sampled without clipping the ratio: DPPO's
trust-region masks (a token whose probability moved too far in the advantage's direction is
dropped; the kept ones carry the raw ratio) and DRO's quadratic penalty on log r
(docs/formulas.md §3).

Pure functions: tensors and keyword hyper-parameters in, the unreduced (B, T) loss (or the
(B, T) masks) out. Notation as in :mod:`rlmap.correction.objectives`, which registers them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.core.ops import at_least_float32
from rlmap.correction.clip_objectives import pg_loss


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
