"""V-trace off-policy value targets and policy advantages (Espeholt et al. 2018, IMPALA).

Notation (docs/formulas.md §2.3): π the learner's policy (π_old, the trainer's own forward
pass), μ the behaviour policy (the rollout engine's log-probs), V_s = V(s_s), ρ̄ ≥ c̄.

    ρ_s = min(ρ̄, π/μ),  c_s = min(c̄, π/μ)          (ratios formed in log space, clamped
                                                     to [−20, 20] before exp)
    δ_s = ρ_s (r_s + γ V_{s+1} − V_s)
    v_s − V_s = δ_s + γ c_s (v_{s+1} − V_{s+1})
    advantage_s = min(ρ̄_pg, π/μ) (r_s + γ v_{s+1} − V_s)

After the last step, terminal: γ·(1 − done) = 0, i.e. V_{s+1} = v_{s+1} = 0; truncated:
V_{s+1} = v_{s+1} = V(s_final). Outputs are detached.

Differs from the paper: a step is an action token (observation/prompt/padding tokens
skipped, values carried across them) or an assistant turn (the turn's ratio is the
product of its tokens' ratios); the paper's n-step truncation of the sum is not used
(the trace runs to the end of the trajectory, as in its recursive form).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.estimators.gae import discounted_backward, next_step_values
from rlmap.estimators.turns import TurnIndex


def vtrace(
    rewards_BT: Tensor,
    values_BT: Tensor,
    mask_BT: Tensor,
    target_logprobs_BT: Tensor,
    behavior_logprobs_BT: Tensor,
    *,
    bootstrap_B: Tensor,
    truncated_B: Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    rho_bar_pg: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """(advantage_s, v_s), both (B, T), 0 off the mask, by one backward pass over columns.

    The recursion is GAE's (:func:`discounted_backward`) with per-step decay γ·c_s on
    δ_s; V_{s+1} and v_{s+1} are read at the next action token (:func:`next_step_values`).

    rewards, values, log π, log μ, mask: (B, T); bootstrap V(s_final), truncated: (B,).
    """
    r_BT, v_BT = rewards_BT.detach(), values_BT.detach()
    log_ratio_BT = (target_logprobs_BT - behavior_logprobs_BT).detach().clamp(-20.0, 20.0)
    ratio_BT = log_ratio_BT.exp()
    rho_BT, c_BT, rho_pg_BT = (ratio_BT.clamp(max=x) for x in (rho_bar, c_bar, rho_bar_pg))
    final_B = torch.where(truncated_B, bootstrap_B.detach(), 0.0)  # V = v after the last step
    next_value_BT = next_step_values(v_BT, mask_BT, final_B)  # V_{s+1}
    delta_BT = rho_BT * (r_BT + gamma * next_value_BT - v_BT)
    # v_s − V_s = δ_s + γ c_s (v_{s+1} − V_{s+1}), and v − V = 0 after the last step.
    vs_BT = torch.where(mask_BT, v_BT + discounted_backward(delta_BT, mask_BT, gamma * c_BT), 0.0)
    next_vs_BT = next_step_values(vs_BT, mask_BT, final_B)  # v_{s+1}
    adv_BT = torch.where(mask_BT, rho_pg_BT * (r_BT + gamma * next_vs_BT - v_BT), 0.0)
    return adv_BT, vs_BT


def turn_vtrace(
    rewards_BT: Tensor,
    values_BT: Tensor,
    mask_BT: Tensor,
    turns_BT: Tensor,
    target_logprobs_BT: Tensor,
    behavior_logprobs_BT: Tensor,
    *,
    bootstrap_B: Tensor,
    truncated_B: Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    rho_bar_pg: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace with one step per assistant turn, results broadcast to the turn's tokens.

    Turn value: V at its first action token; turn reward: Σ r_t over its action tokens;
    turn log-ratio: Σ (log π − log μ) over its action tokens (clamped after summing).
    """
    index = TurnIndex.build(turns_BT, mask_BT)
    adv_BK, vs_BK = vtrace(
        index.sum(rewards_BT),
        index.first(values_BT),
        index.mask_BK,
        index.sum(target_logprobs_BT),
        index.sum(behavior_logprobs_BT),
        bootstrap_B=bootstrap_B,
        truncated_B=truncated_B,
        gamma=gamma,
        rho_bar=rho_bar,
        c_bar=c_bar,
        rho_bar_pg=rho_bar_pg,
    )
    return index.broadcast(adv_BK), index.broadcast(vs_BK)
