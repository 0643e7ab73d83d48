"""Generalised advantage estimation with terminal vs truncation, token or turn steps.

Notation (docs/formulas.md §2.1, Schulman et al. 2016 "High-Dimensional Continuous Control
Using Generalized Advantage Estimation"): per-step reward r_t, value V_t = V(s_t) of the
state before step t, discount γ, trace parameter λ.

    δ_t = r_t + γ · b_{t+1} · V_{t+1} − V_t
    Â_t = δ_t + γ · λ · c_{t+1} · Â_{t+1}
    return_t = Â_t + V_t                      (TD(λ) target of the critic)

Inside a trajectory b = c = 1. After its last step: terminal → b = c = 0; truncated →
b = 1 (V_{t+1} := V(s_final), the ``bootstrap_B`` value) and c = 0 (the trace stops).

Differs from the paper: a "step" is an action token (observation, prompt and padding
tokens are skipped, V and Â carried across them) or an assistant turn; VAPO's decoupled
λ (λ_critic for the return, λ_policy for the advantage) and length-adaptive λ_policy
(Yue et al. 2025) are options, and λ may differ per trajectory.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.estimators.turns import TurnIndex


def next_step_values(values_BT: Tensor, mask_BT: Tensor, final_B: Tensor) -> Tensor:
    """(B, T): V at the next masked column of the same row, or ``final_B`` after the last one.

    This is the V_{t+1} of the step recursion with unmasked columns skipped, found
    without a loop: a reversed running minimum of the masked column indices.
    """
    b, t = mask_BT.shape
    cols = torch.arange(t, device=mask_BT.device).expand(b, t)
    index_BT = torch.where(mask_BT, cols, t)  # t stands for "after the last step"
    # next_BT[:, j] = the smallest masked index > j (or t): reversed cummin, shifted by one.
    later = torch.cat([index_BT[:, 1:], index_BT.new_full((b, 1), t)], dim=1)
    next_BT = later.flip(1).cummin(1).values.flip(1)
    extended_BT1 = torch.cat([values_BT, final_B.unsqueeze(1)], dim=1)  # (B, T + 1)
    return extended_BT1.gather(1, next_BT)


def discounted_backward(delta_BT: Tensor, mask_BT: Tensor, decay: float | Tensor) -> Tensor:
    """x_t = δ_t + decay_t · x_{next step}, with x = 0 after the last step; (B, T), 0 off mask.

    The one loop over time. ``decay`` is a float, (B,) per trajectory, or (B, T) per
    step (V-trace's γ·c_t). Columns are walked in (T, B) layout so that every step
    reads contiguous memory.
    """
    delta_TB = delta_BT.t().contiguous()
    mask_TB = mask_BT.t().contiguous()
    decay = torch.as_tensor(decay, dtype=delta_BT.dtype, device=delta_BT.device)
    decay_TB = decay.t().contiguous() if decay.dim() == 2 else decay.expand(delta_TB.shape)
    out_TB = torch.zeros_like(delta_TB)
    carry_B = delta_TB.new_zeros(delta_TB.shape[1])
    for t in reversed(range(delta_TB.shape[0])):
        carry_B = torch.where(mask_TB[t], delta_TB[t] + decay_TB[t] * carry_B, carry_B)
        out_TB[t] = carry_B
    return torch.where(mask_BT, out_TB.t(), 0.0)


def gae_advantages(
    rewards_BT: Tensor,
    values_BT: Tensor,
    mask_BT: Tensor,
    *,
    bootstrap_B: Tensor,
    truncated_B: Tensor,
    gamma: float,
    lam: float | Tensor,
) -> Tensor:
    """Â_t = δ_t + γλ·Â_{t+1} over the masked columns (one step per masked column).

    rewards, values, mask: (B, T); bootstrap V(s_final), truncated: (B,); λ a float or
    (B,). Returns Â: (B, T), 0 off the mask. Unmasked columns carry V_{t+1} and Â_{t+1}
    through unchanged, so they neither add a δ nor break the trace. After the last step
    b·V = V(s_final) if truncated else 0, and c = 0.
    """
    final_B = torch.where(truncated_B, bootstrap_B, 0.0)  # b·V(s_final)
    next_value_BT = next_step_values(values_BT, mask_BT, final_B)
    delta_BT = rewards_BT + gamma * next_value_BT - values_BT
    return discounted_backward(delta_BT, mask_BT, gamma * torch.as_tensor(lam))


def gae(
    rewards_BT: Tensor,
    values_BT: Tensor,
    mask_BT: Tensor,
    *,
    bootstrap_B: Tensor,
    truncated_B: Tensor,
    gamma: float,
    lam_policy: float | Tensor,
    lam_critic: float | Tensor,
) -> tuple[Tensor, Tensor]:
    """Token-step GAE with decoupled λ: (Â(λ_policy), Â(λ_critic) + V), both (B, T).

    One step per masked (action) token; λ's are floats or (B,). Both recursions run in
    one backward pass (the batch stacked twice, one λ per copy). Outputs are 0 off the
    mask and detached.
    """
    b = rewards_BT.shape[0]
    dtype, device = rewards_BT.dtype, rewards_BT.device
    lam_2B = torch.cat(
        [torch.as_tensor(x, dtype=dtype, device=device).expand(b) for x in (lam_policy, lam_critic)]
    )
    v_BT = values_BT.detach()
    adv_2BT = gae_advantages(
        rewards_BT.detach().repeat(2, 1),
        v_BT.repeat(2, 1),
        mask_BT.repeat(2, 1),
        bootstrap_B=bootstrap_B.detach().repeat(2),
        truncated_B=truncated_B.repeat(2),
        gamma=gamma,
        lam=lam_2B,
    )
    adv_BT, critic_adv_BT = adv_2BT.split(b)
    return adv_BT, torch.where(mask_BT, critic_adv_BT + v_BT, 0.0)


def turn_gae(
    rewards_BT: Tensor,
    values_BT: Tensor,
    mask_BT: Tensor,
    turns_BT: Tensor,
    *,
    bootstrap_B: Tensor,
    truncated_B: Tensor,
    gamma: float,
    lam_policy: float | Tensor,
    lam_critic: float | Tensor,
) -> tuple[Tensor, Tensor]:
    """Turn-step GAE: one step per assistant turn, results broadcast to its tokens.

    The turn's value is V at its first action token, its reward the sum of r_t over its
    action tokens; the same recursion runs on the (B, K) turn matrix. The turn's
    advantage and return are broadcast to all its action tokens, so a value loss over
    action tokens trains every token of the turn toward the turn's return.
    (B, T) in (``turns_BT``: turn id ≥ 0 on action tokens), (B, T) × 2 out.
    """
    index = TurnIndex.build(turns_BT, mask_BT)
    adv_BK, ret_BK = gae(
        index.sum(rewards_BT),
        index.first(values_BT),
        index.mask_BK,
        bootstrap_B=bootstrap_B,
        truncated_B=truncated_B,
        gamma=gamma,
        lam_policy=lam_policy,
        lam_critic=lam_critic,
    )
    return index.broadcast(adv_BK), index.broadcast(ret_BK)


def adaptive_lambda(lengths_B: Tensor, *, alpha: float) -> Tensor:
    """Length-adaptive λ_policy = 1 − 1/(α · l), clamped to [0, 1] (VAPO; SAO). (B,) → (B,).

    l is the trajectory's length in GAE steps (action tokens or turns); l = 0 gives 0.
    Differs from the paper: the clamp. The paper's lengths (thousands of tokens) keep α·l
    far above 1; where α·l < 1 the formula gives λ < 0, which is clamped to 0 (pure TD(0)),
    so α must be scaled to the task's lengths (the vapo preset scales it by the length limits).
    """
    lengths_B = lengths_B.to(torch.get_default_dtype())
    return (1.0 - 1.0 / (alpha * lengths_B)).clamp(0.0, 1.0)
