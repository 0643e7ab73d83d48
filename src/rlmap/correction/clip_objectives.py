"""The policy gradient and the objectives that bound its importance ratio: PPO's clip (with
Clip-Higher and the dual clip), CISPO's clipped weight, GSPO's and GMPO's sequence ratios,
SAPO's soft gate and SAO's direct gate (docs/formulas.md §3).

Pure functions: tensors and keyword hyper-parameters in, the unreduced (B, T) loss out.
Notation as in :mod:`rlmap.correction.objectives`, which registers each of them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.correction.ratios import sequence_mean


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
