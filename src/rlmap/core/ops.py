"""Tensor operations every axis shares: the precision of statistics and the masked mean.

Statistics are accumulated in at least float32 whatever the input dtype: a float16
sum or count overflows at 65504, and bfloat16 has 8 bits of mantissa, so its
counts above 256 and its small differences of large log-probabilities are rounded.
"""

from __future__ import annotations

import torch
from torch import Tensor


def at_least_float32(x: Tensor) -> Tensor:
    """x as float32 if its dtype is narrower (float16, bfloat16, integer, bool); else x itself.

    float64 stays float64. The cast is differentiable, so gradients still reach x.
    """
    return x.to(torch.promote_types(x.dtype, torch.float32))


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Σ_{mask} x / max(Σ mask, 1): the mean of x over the entries where ``mask`` (bool) holds.

    Scalar tensor, 0 when the mask is empty, no host sync. Summed in at least float32,
    counted in int64. ``torch.where``, not a product with the mask, so NaN or inf off
    the mask cannot leak into the mean (NaN · 0 = NaN).
    """
    n = mask.sum().clamp(min=1)  # int64: exact
    return torch.where(mask, at_least_float32(x), 0.0).sum() / n
