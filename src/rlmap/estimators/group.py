"""Group-baseline estimators: RLOO, GRPO, Dr. GRPO, and the group diagnostics.

Notation (docs/formulas.md §2): a group g is the trajectories sampled from one prompt,
identified by ``group_id``; R_i is trajectory i's outcome reward. Statistics use only
the group's *valid* members (``valid_B``); invalid rows neither enter them nor receive
an advantage. A group with fewer than two valid members has no baseline, so its
members get advantage 0 — with G >= 2 that happens when failed members were excluded
(their reward is not a zero, so they cannot serve as a baseline either). G = 1 itself is
a configuration error, caught before any work: the recipe checks
``Estimator.needs_group``.
Shapes: ``(B,)`` in, ``(B,)`` out; the caller broadcasts to the action tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor


class GroupStats(NamedTuple):
    """Per-trajectory view of its group's statistics over valid members, all (B,)."""

    n_valid: Tensor
    """Number of valid members of the trajectory's group."""
    mean: Tensor
    """mean_g R (0 for a group without valid members)."""
    centred: Tensor
    """R_i − mean_g R; exactly 0 in a group of equal rewards (0 on invalid rows)."""
    std: Tensor
    """Unbiased (G − 1) std_g R; 0 for a group with fewer than two valid members."""


def group_index(group_id_B: Tensor) -> tuple[Tensor, int]:
    """(B,) long in [0, n_groups) numbering the distinct group ids, and n_groups."""
    ids, index_B = torch.unique(group_id_B, return_inverse=True)
    return index_B, int(ids.numel())


def _group_extreme(
    rewards_B: Tensor, index_B: Tensor, valid_B: Tensor, n_groups: int, reduce: str
) -> Tensor:
    """(n_groups,): ``amin`` or ``amax`` of R over each group's valid members (±inf if none)."""
    fill = float("inf") if reduce == "amin" else float("-inf")
    masked_B = torch.where(valid_B, rewards_B, fill)
    return rewards_B.new_full((n_groups,), fill).scatter_reduce(0, index_B, masked_B, reduce)


def group_stats(rewards_B: Tensor, group_id_B: Tensor, valid_B: Tensor) -> GroupStats:
    """Count, mean, R − mean and unbiased std of R over each group's valid members.

    Rewards are shifted by the group's minimum before averaging, so a group of equal
    rewards gets a centred value of exactly 0 (no rounding residue for the std to blow up).
    """
    index_B, n_groups = group_index(group_id_B)
    low_G = _group_extreme(rewards_B, index_B, valid_B, n_groups, "amin")
    shift_B = torch.where(valid_B, rewards_B - low_G[index_B], 0.0)  # >= 0
    count_G = rewards_B.new_zeros(n_groups).index_add_(0, index_B, valid_B.to(rewards_B.dtype))
    mean_shift_G = rewards_B.new_zeros(n_groups).index_add_(0, index_B, shift_B)
    mean_shift_G = mean_shift_G / count_G.clamp(min=1)
    centred_B = torch.where(valid_B, shift_B - mean_shift_G[index_B], 0.0)
    sq_dev_G = rewards_B.new_zeros(n_groups).index_add_(0, index_B, centred_B**2)
    std_G = torch.where(count_G >= 2, (sq_dev_G / (count_G - 1).clamp(min=1)).sqrt(), 0.0)
    mean_G = torch.where(count_G > 0, low_G + mean_shift_G, 0.0)
    return GroupStats(count_G[index_B], mean_G[index_B], centred_B, std_G[index_B])


def _has_baseline(valid_B: Tensor, stats: GroupStats) -> Tensor:
    """(B,) bool: valid and in a group with at least two valid members."""
    return valid_B & (stats.n_valid >= 2)


def rloo_advantages(rewards_B: Tensor, group_id_B: Tensor, valid_B: Tensor) -> Tensor:
    """RLOO (Ahmadian et al. 2024, "Back to Basics"): leave-one-out baseline.

    A_i = R_i − (1/(G−1)) Σ_{j≠i, j∈g} R_j  =  G/(G−1) · (R_i − mean_g R),
    with G the number of valid members of i's group. (B,) → (B,).
    """
    stats = group_stats(rewards_B, group_id_B, valid_B)
    # Computed through the second form so that a group of equal rewards gets exactly 0.
    scale_B = stats.n_valid / (stats.n_valid - 1).clamp(min=1)
    return torch.where(_has_baseline(valid_B, stats), scale_B * stats.centred, 0.0)


def grpo_advantages(
    rewards_B: Tensor, group_id_B: Tensor, valid_B: Tensor, *, eps: float = 1e-6
) -> Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath): group-normalised outcome.

    A_i = (R_i − mean_g R) / (std_g R + ε), std unbiased (G − 1). (B,) → (B,).
    Differs from the paper: the paper leaves the std estimator unstated; rlmap uses the
    unbiased one (as ``torch.std`` does in common implementations).
    """
    stats = group_stats(rewards_B, group_id_B, valid_B)
    adv = stats.centred / (stats.std + eps)
    return torch.where(_has_baseline(valid_B, stats), adv, 0.0)


def dr_grpo_advantages(rewards_B: Tensor, group_id_B: Tensor, valid_B: Tensor) -> Tensor:
    """Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"): no std division.

    A_i = R_i − mean_g R. (B,) → (B,).
    """
    stats = group_stats(rewards_B, group_id_B, valid_B)
    return torch.where(_has_baseline(valid_B, stats), stats.centred, 0.0)


def group_diagnostics(
    rewards_B: Tensor, group_id_B: Tensor, valid_B: Tensor, returns_B: Tensor | None = None
) -> dict[str, Tensor]:
    """Fractions of groups (those with at least one valid member), detached scalars.

    - ``group/all_correct_frac``: min R over the group's valid members > 0;
    - ``group/all_wrong_frac``: max R over the group's valid members <= 0;
    - ``group/zero_adv_frac``: all valid members' returns are equal, so the group-centred
      advantage is 0 for the whole group (a group with one valid member counts here too:
      it has no baseline and also gets 0). REINFORCE++-baseline's later batch whitening may
      shift such a group by a uniform amount.

    R is the outcome ``rewards_B``; the return is ``returns_B`` (what the estimator centres:
    with the KL penalty in the reward, R − β·Σ k1, which differs within a group of equal
    outcomes), ``rewards_B`` when None.
    """
    r_B = rewards_B.detach()
    index_B, n_groups = group_index(group_id_B)
    low_G = _group_extreme(r_B, index_B, valid_B, n_groups, "amin")
    high_G = _group_extreme(r_B, index_B, valid_B, n_groups, "amax")
    if returns_B is not None:
        g_B = returns_B.detach()
        low_ret_G = _group_extreme(g_B, index_B, valid_B, n_groups, "amin")
        high_ret_G = _group_extreme(g_B, index_B, valid_B, n_groups, "amax")
    else:
        low_ret_G, high_ret_G = low_G, high_G
    present_G = r_B.new_zeros(n_groups).index_add_(0, index_B, valid_B.to(r_B.dtype)) > 0
    n_present = present_G.sum().clamp(min=1)

    def frac(flag_G: Tensor) -> Tensor:
        return (flag_G & present_G).sum() / n_present

    return {
        "group/all_correct_frac": frac(low_G > 0),
        "group/all_wrong_frac": frac(high_G <= 0),
        "group/zero_adv_frac": frac(high_ret_G == low_ret_G),
    }
