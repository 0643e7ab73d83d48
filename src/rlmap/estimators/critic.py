"""The critic's clipped value loss and its diagnostics (docs/formulas.md §2.1)."""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.core.batch import last_action_onehot
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


def value_errors(values_BT: Tensor, returns_BT: Tensor, mask_BT: Tensor) -> dict[str, Tensor]:
    """Mean |V − return| at the first and at the last masked token of each row; detached.

    ``critic/value_error_first`` judges V(s_0), the value of the prompt alone, whose target
    is the whole trajectory's return; ``critic/value_error_last`` the value just before the
    outcome is revealed. A critic that only learned the mean reward does equally badly at
    both; one that reads the response improves at the last token first.
    (B, T) in; rows without a masked token do not count.
    """
    mask_BT = mask_BT.bool()
    err_BT = (values_BT.detach() - returns_BT.detach()).abs()
    first_BT = mask_BT & (mask_BT.cumsum(-1) == 1)
    last_BT = last_action_onehot(mask_BT).bool()
    return {
        "critic/value_error_first": masked_mean(err_BT, first_BT),
        "critic/value_error_last": masked_mean(err_BT, last_BT),
    }
