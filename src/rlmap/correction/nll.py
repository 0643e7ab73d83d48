"""VAPO's positive-example NLL: imitate the trajectories that succeeded (docs/formulas.md §3)."""

from __future__ import annotations

import torch
from torch import Tensor


def positive_nll(logprobs_BT: Tensor, mask_BT: Tensor, rewards_B: Tensor) -> tuple[Tensor, Tensor]:
    """loss_{i,t} = −log π_θ(t) on action tokens of trajectories with R_i > 0; (B, T) each.

    Paper: Yue et al. 2025 (VAPO), μ = 0.1. The term added to the loss is
    μ · Σ m⁺ (−log π_θ) / Σ m⁺ with m⁺ = m · 1[R_i > 0]; this function returns the
    loss and m⁺, and the token mean over m⁺ is the reduction axis's job. The loss is
    zero off m⁺.
    """
    keep_BT = mask_BT.bool() & (rewards_B > 0).unsqueeze(-1)
    return torch.where(keep_BT, -logprobs_BT, 0.0), keep_BT
