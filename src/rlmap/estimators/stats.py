"""Masked statistics shared by the estimators: mean, std, whitening, broadcasting.

Every statistic is over the entries where ``mask`` is True; masked-out entries never
enter (they may hold NaN or garbage, which ``torch.where`` keeps out). The masked
mean itself is :func:`rlmap.core.ops.masked_mean`, shared with the behaviour axis.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.core.ops import masked_mean


def masked_std(x: Tensor, mask: Tensor) -> Tensor:
    """Biased (population, divide by N) std of ``x`` over ``mask``; scalar tensor."""
    mean = masked_mean(x, mask)
    return masked_mean((x - mean) ** 2, mask).sqrt()


def whiten(x: Tensor, mask: Tensor, *, eps: float) -> Tensor:
    """(x − mean) / (std + eps) over ``mask``, biased std, mean NOT added back; 0 off mask.

    REINFORCE++ (Hu 2025) whitens its advantages over all action tokens of the batch.
    Some implementations (TRL's ``masked_whiten(shift_mean=False)``) add the mean back;
    rlmap does not: the whitened advantage has mean 0 over the batch's action tokens.
    """
    white = (x - masked_mean(x, mask)) / (masked_std(x, mask) + eps)
    return torch.where(mask, white, 0.0)


def broadcast_to_tokens(scalar_B: Tensor, mask_BT: Tensor) -> Tensor:
    """(B, T): each row's scalar on its masked tokens, 0 elsewhere."""
    return torch.where(mask_BT, scalar_B.unsqueeze(-1), 0.0)


def advantage_diagnostics(advantages_BT: Tensor, mask_BT: Tensor) -> dict[str, Tensor]:
    """``adv/mean`` and ``adv/std`` (biased) over the masked tokens, detached."""
    adv = advantages_BT.detach()
    return {"adv/mean": masked_mean(adv, mask_BT), "adv/std": masked_std(adv, mask_BT)}
