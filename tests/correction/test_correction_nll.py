"""VAPO positive-example NLL (FORMULAS §3)."""

from __future__ import annotations

import pytest
import torch

from rlmap.correction import positive_nll


def test_hand_case() -> None:
    # R = (1, 0, −1, 0.5): only rows 0 and 3 have R > 0.
    # row 0: tokens (−0.5, −1.0) on the mask → loss (0.5, 1.0); row 3: first token only → 0.2
    lp = torch.tensor([[-0.5, -1.0], [-2.0, -2.0], [-3.0, -3.0], [-0.2, -7.0]])
    mask = torch.tensor([[True, True], [True, True], [True, True], [True, False]])
    loss, keep = positive_nll(lp, mask, torch.tensor([1.0, 0.0, -1.0, 0.5]))
    assert keep.tolist() == [[True, True], [False, False], [False, False], [True, False]]
    torch.testing.assert_close(loss, torch.tensor([[0.5, 1.0], [0, 0], [0, 0], [0.2, 0.0]]))
    # the token mean over m⁺ (the reduction's job) = (0.5 + 1.0 + 0.2) / 3 = 0.566667
    assert (loss.sum() / keep.sum()).item() == pytest.approx(0.566667, rel=1e-5)


def test_reference_loop_and_gradient() -> None:
    g = torch.Generator().manual_seed(0)
    lp = (-torch.rand(5, 4, generator=g)).requires_grad_(True)
    mask = torch.rand(5, 4, generator=g) > 0.3
    rewards = torch.randn(5, generator=g)
    loss, keep = positive_nll(lp, mask, rewards)
    (grad,) = torch.autograd.grad(loss.sum(), lp)
    for i in range(5):
        for t in range(4):
            on = bool(mask[i, t]) and float(rewards[i]) > 0
            assert bool(keep[i, t]) == on
            assert loss[i, t].item() == pytest.approx(-float(lp[i, t].detach()) if on else 0.0)
            assert grad[i, t].item() == (-1.0 if on else 0.0)
