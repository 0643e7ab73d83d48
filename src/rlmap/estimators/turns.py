"""Turn-level view of a token batch: one column per assistant turn, built by scatter/gather.

A (B, T) token matrix maps to a (B, K) turn matrix with K = T, an upper bound on the
number of turns that needs no host sync; slot k of row i holds turn k (its ``turn_id``).
Unused slots are masked out, so a recursion over turns simply skips them, as the token
recursion skips observation tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TurnIndex:
    """Where each action token's turn lives in the (B, K) turn matrix."""

    slot_BT: Tensor
    """(B, T) long: the token's turn id, clamped to 0 off the action mask (read with mask)."""
    token_mask_BT: Tensor
    """(B, T) bool: the action mask the index was built from."""
    first_BK: Tensor
    """(B, K) long: position of the turn's first action token (clamped into range)."""
    mask_BK: Tensor
    """(B, K) bool: the turn exists (has at least one action token)."""

    @classmethod
    def build(cls, turns_BT: Tensor, mask_BT: Tensor) -> TurnIndex:
        """Index from turn ids (``Batch.turns``: ≥ 0 on action tokens) and the action mask."""
        b, t = mask_BT.shape
        slot_BT = torch.where(mask_BT, turns_BT, 0).long()
        pos_BT = torch.arange(t, device=mask_BT.device).expand(b, t)
        first_BK = torch.full((b, t), t, dtype=torch.long, device=mask_BT.device)
        first_BK = first_BK.scatter_reduce(1, slot_BT, torch.where(mask_BT, pos_BT, t), "amin")
        return cls(slot_BT, mask_BT, first_BK.clamp(max=t - 1), first_BK < t)

    @property
    def counts_B(self) -> Tensor:
        """(B,) long: number of turns of each row."""
        return self.mask_BK.sum(-1)

    def sum(self, x_BT: Tensor) -> Tensor:
        """(B, K): Σ of ``x`` over each turn's action tokens."""
        x_BT = torch.where(self.token_mask_BT, x_BT, 0.0)
        return torch.zeros_like(x_BT).scatter_add(1, self.slot_BT, x_BT)

    def first(self, x_BT: Tensor) -> Tensor:
        """(B, K): ``x`` at each turn's first action token, 0 on missing turns."""
        return torch.where(self.mask_BK, x_BT.gather(1, self.first_BK), 0.0)

    def broadcast(self, x_BK: Tensor) -> Tensor:
        """(B, T): each turn's value on its action tokens, 0 elsewhere."""
        return torch.where(self.token_mask_BT, x_BK.gather(1, self.slot_BT), 0.0)
