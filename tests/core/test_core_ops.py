"""Shared tensor operations: the masked mean and the precision of statistics."""

from __future__ import annotations

import pytest
import torch

from rlmap.core import ops
from rlmap.correction import ratios
from rlmap.estimators import stats


def test_masked_mean_hand_case_and_garbage_off_the_mask() -> None:
    # masked values 1, 2, 6 → 9/3 = 3; NaN and inf sit off the mask and must not leak
    x = torch.tensor([[1.0, float("nan"), 2.0], [6.0, float("inf"), 0.0]])
    mask = torch.tensor([[True, False, True], [True, False, False]])
    assert ops.masked_mean(x, mask).item() == 3.0


def test_masked_mean_empty_mask_is_zero() -> None:
    assert ops.masked_mean(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool)).item() == 0.0


def test_masked_mean_float16_does_not_overflow() -> None:
    # 70 000 entries of 1.0: a float16 sum or count is 70 000 > 65 504 = inf → NaN or inf;
    # accumulated in float32 the mean is 1
    x = torch.ones(70_000, dtype=torch.float16)
    got = ops.masked_mean(x, torch.ones(70_000, dtype=torch.bool))
    assert got.dtype == torch.float32 and got.item() == 1.0


def test_masked_mean_bfloat16_sum_is_not_rounded() -> None:
    # 257 entries of 1.0: in bfloat16 (8-bit mantissa) 257 rounds to 256 → 256/257 ≠ 1
    x = torch.ones(257, dtype=torch.bfloat16)
    assert ops.masked_mean(x, torch.ones(257, dtype=torch.bool)).item() == 1.0


def test_masked_mean_keeps_float64_and_promotes_integers() -> None:
    mask = torch.tensor([True, True, False])
    x64 = torch.tensor([1.0, 2.0, 9.0], dtype=torch.float64)
    assert ops.masked_mean(x64, mask).dtype == torch.float64
    got = ops.masked_mean(torch.tensor([1, 2, 9]), mask)  # (1 + 2)/2
    assert got.dtype == torch.float32 and got.item() == 1.5


def test_masked_mean_carries_the_gradient() -> None:
    # d/dx of (x_0 + x_2)/2 = (0.5, 0, 0.5)
    x = torch.tensor([1.0, 5.0, 3.0], requires_grad=True)
    ops.masked_mean(x, torch.tensor([True, False, True])).backward()
    assert x.grad is not None and x.grad.tolist() == [0.5, 0.0, 0.5]


@pytest.mark.parametrize(
    ("dtype", "want"),
    [
        (torch.float16, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
        (torch.long, torch.float32),
        (torch.bool, torch.float32),
    ],
)
def test_at_least_float32(dtype: torch.dtype, want: torch.dtype) -> None:
    assert ops.at_least_float32(torch.zeros(2, dtype=dtype)).dtype == want


def test_one_masked_mean_serves_both_axes() -> None:
    assert ratios.masked_mean is ops.masked_mean
    assert stats.masked_mean is ops.masked_mean
