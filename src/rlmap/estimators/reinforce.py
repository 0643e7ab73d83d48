"""REINFORCE with a batch baseline, and REINFORCE++ (token returns, whitened).

Notation (docs/formulas.md §2): R_i outcome reward, r_t per-step reward on action tokens
(R_i at the last action token, minus β·k1_t when the KL is in the reward), m_{i,t}
the action mask. ``valid_B`` / the mask exclude invalid rows from every statistic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.core.ops import masked_mean
from rlmap.estimators.group import group_stats
from rlmap.estimators.stats import broadcast_to_tokens, whiten


def reinforce_advantages(rewards_B: Tensor, valid_B: Tensor) -> Tensor:
    """REINFORCE (Williams 1992) with a batch baseline: A_i = R_i − mean_{j valid} R_j.

    (B,) → (B,), 0 on invalid rows. Differs from the paper: Williams leaves the baseline
    free; rlmap fixes it to the batch mean (no critic, no group).
    """
    baseline = masked_mean(rewards_B, valid_B)
    return torch.where(valid_B, rewards_B - baseline, 0.0)


def discounted_returns(
    rewards_BT: Tensor, mask_BT: Tensor, *, gamma: float, tail_B: Tensor | None = None
) -> Tensor:
    """G_t = Σ_{s≥t, s action} γ^{(number of action steps from t to s)} r_s, 0 off the mask.

    One step per action token: non-action tokens (prompt, observation, padding) are
    skipped, the running return carried across them. ``tail_B`` (B,): the return after the
    row's last step (0 when None; a later segment's, :mod:`rlmap.estimators.segments`).
    (B, T) → (B, T).
    """
    running_B = rewards_BT.new_zeros(rewards_BT.shape[0]) if tail_B is None else tail_B  # G_{t+1}
    returns_BT = torch.zeros_like(rewards_BT)
    for t in reversed(range(rewards_BT.shape[1])):
        act_B = mask_BT[:, t]
        running_B = torch.where(act_B, rewards_BT[:, t] + gamma * running_B, running_B)
        returns_BT[:, t] = torch.where(act_B, running_B, 0.0)
    return returns_BT


def reinforce_pp_advantages(
    rewards_BT: Tensor, mask_BT: Tensor, *, gamma: float = 1.0, eps: float = 1e-6
) -> Tensor:
    """REINFORCE++ (Hu 2025): A_t = whiten(G_t), G_t = Σ_{s≥t} γ^{s−t} r_s.

    Whitened over all masked (valid action) tokens of the batch: (G − mean)/(std + ε)
    with the biased std; the mean is not added back. (B, T) → (B, T), 0 off the mask.
    """
    return whiten(discounted_returns(rewards_BT, mask_BT, gamma=gamma), mask_BT, eps=eps)


def reinforce_pp_baseline_advantages(
    rewards_B: Tensor,
    group_id_B: Tensor,
    valid_B: Tensor,
    mask_BT: Tensor,
    *,
    eps: float = 1e-6,
    rows_B: Tensor | None = None,
) -> Tensor:
    """REINFORCE++-baseline (Hu 2025): A_i = R_i − mean_g R, then whitened over tokens.

    The group-centred outcome is broadcast to the action tokens and whitened over all
    action tokens of rows that have a baseline (biased std, mean not added back).
    Rows in a group with fewer than two valid members, and invalid rows, get 0 and stay
    out of the whitening statistics. ``rows_B`` (B,) long: the row whose centred return
    each row takes (segments: its episode's counted row, docs/formulas.md §2.5); None, its
    own. (B,), (B, T) → (B, T).
    """
    stats = group_stats(rewards_B, group_id_B, valid_B)
    has_B = valid_B & (stats.n_valid >= 2)
    centred_B = stats.centred
    if rows_B is not None:
        has_B, centred_B = has_B[rows_B], centred_B[rows_B]
    keep_BT = mask_BT & has_B.unsqueeze(-1)
    centred_BT = broadcast_to_tokens(centred_B, keep_BT)
    return whiten(centred_BT, keep_BT, eps=eps)
