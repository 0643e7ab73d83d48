"""The critic's clipped value loss and its explained variance (FORMULAS.md §2)."""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.core.ops import masked_mean


def value_loss(values_BT: Tensor, old_values_BT: Tensor, returns_BT: Tensor, clip: float) -> Tensor:
    """Per-token clipped value loss, (B, T); the reduction axis averages it.

    ½ · max((V − R)², (clip(V, V_old − ε_v, V_old + ε_v) − R)²), ε_v = ``clip``
    (PPO2 baselines; Schulman et al. 2017 leave value clipping out of the paper).
    """
    clipped_BT = old_values_BT + (values_BT - old_values_BT).clamp(-clip, clip)
    return 0.5 * torch.maximum((values_BT - returns_BT) ** 2, (clipped_BT - returns_BT) ** 2)


def explained_variance(values: Tensor, returns: Tensor, mask: Tensor) -> Tensor:
    """1 − Var[R − V] / Var[R] over the masked entries; scalar, detached.

    1 is a perfect critic, 0 no better than a constant, < 0 worse. NaN when Var[R] = 0
    (undefined, as in CleanRL). Both variances are biased; the ratio does not care.
    """
    v, r = values.detach(), returns.detach()
    mask = mask.bool()
    var_r = masked_mean((r - masked_mean(r, mask)) ** 2, mask)
    err = r - v
    var_err = masked_mean((err - masked_mean(err, mask)) ** 2, mask)
    return torch.where(var_r > 0, 1.0 - var_err / var_r, float("nan"))
