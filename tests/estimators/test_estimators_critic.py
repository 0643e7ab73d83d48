"""Clipped value loss and explained variance."""

from __future__ import annotations

import math

import pytest
import torch

from rlmap.estimators import explained_variance, value_errors, value_loss


def test_value_loss_hand_cases() -> None:
    # ε_v = 0.5.
    # (a) V = 1.0, V_old = 0.2, R = 0.5: clip(V) = 0.2 + 0.5 = 0.7; (1 − 0.5)² = 0.25,
    #     (0.7 − 0.5)² = 0.04 → ½·max = 0.125
    # (b) V = 0.0, V_old = 0.2, R = 1.0: V − V_old = −0.2 inside the clip → ½·1² = 0.5
    # (c) V = 0.9, V_old = 0.0, R = 1.0: clip(V) = 0.5; (0.9 − 1)² = 0.01, (0.5 − 1)² = 0.25
    #     → ½·0.25 = 0.125 (the pessimistic branch wins)
    v = torch.tensor([[1.0, 0.0, 0.9]])
    old = torch.tensor([[0.2, 0.2, 0.0]])
    ret = torch.tensor([[0.5, 1.0, 1.0]])
    torch.testing.assert_close(value_loss(v, old, ret, 0.5), torch.tensor([[0.125, 0.5, 0.125]]))


def test_value_loss_matches_reference_and_has_gradient() -> None:
    gen = torch.Generator().manual_seed(0)
    v = torch.randn(3, 5, generator=gen, requires_grad=True)
    old, ret = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    got = value_loss(v, old, ret, 0.3)
    want = torch.zeros(3, 5)
    for i in range(3):
        for t in range(5):
            vi, oi, ri = float(v[i, t].detach()), float(old[i, t]), float(ret[i, t])
            clipped = min(max(vi, oi - 0.3), oi + 0.3)
            want[i, t] = 0.5 * max((vi - ri) ** 2, (clipped - ri) ** 2)
    torch.testing.assert_close(got.detach(), want)
    got.sum().backward()
    assert v.grad is not None and torch.isfinite(v.grad).all()


def test_value_loss_reduces_to_squared_error_when_v_stays_in_the_clip() -> None:
    v = torch.tensor([[0.1, -0.2]])
    ret = torch.tensor([[1.0, 2.0]])
    torch.testing.assert_close(value_loss(v, v, ret, 0.5), 0.5 * (v - ret) ** 2)


def test_explained_variance_hand_cases() -> None:
    # R = (1, 2, 3), masked 4th entry is NaN garbage.
    # V = R → Var[R − V] = 0 → 1.
    # V = (1, 2, 4): R − V = (0, 0, −1), mean −1/3, var = (1/9 + 1/9 + 4/9)/3 = 2/9;
    #   Var[R] = 2/3 → 1 − (2/9)/(2/3) = 2/3.
    # V = R + 5 (constant offset) → Var[R − V] = 0 → 1.
    ret = torch.tensor([1.0, 2.0, 3.0, float("nan")])
    mask = torch.tensor([True, True, True, False])
    nan = float("nan")
    assert float(explained_variance(torch.tensor([1.0, 2, 3, nan]), ret, mask)) == pytest.approx(1)
    got = explained_variance(torch.tensor([1.0, 2, 4, nan]), ret, mask)
    assert float(got) == pytest.approx(2 / 3)
    assert float(explained_variance(ret + 5, ret, mask)) == pytest.approx(1.0)


def test_explained_variance_constant_returns_is_nan() -> None:
    ev = explained_variance(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), torch.ones(2))
    assert math.isnan(float(ev))


def test_explained_variance_matches_reference() -> None:
    gen = torch.Generator().manual_seed(1)
    v, r = torch.randn(4, 6, generator=gen), torch.randn(4, 6, generator=gen)
    mask = torch.rand(4, 6, generator=gen) < 0.7
    pairs = [(float(v[i, t]), float(r[i, t])) for i in range(4) for t in range(6) if mask[i, t]]

    def var(xs: list[float]) -> float:
        m = sum(xs) / len(xs)
        return sum((x - m) ** 2 for x in xs) / len(xs)

    want = 1 - var([b - a for a, b in pairs]) / var([b for _, b in pairs])
    assert float(explained_variance(v, r, mask)) == pytest.approx(want, rel=1e-5)


def test_value_errors_at_the_first_and_last_action_token() -> None:
    # Row 0: [prompt | a a a], V = (0.2, 0.5, 0.9), return = (1, 1, 1): first |0.2 − 1| = 0.8,
    #        last |0.9 − 1| = 0.1.
    # Row 1: [prompt | a | pad pad], V = 0.3, return 0: first = last = 0.3.
    # Row 2: no action token (e.g. an excluded row): it does not count.
    # first = (0.8 + 0.3) / 2 = 0.55, last = (0.1 + 0.3) / 2 = 0.2; garbage off the mask is ignored.
    mask = torch.tensor([[0, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    values = torch.tensor([[9.0, 0.2, 0.5, 0.9], [9.0, 0.3, 9.0, 9.0], [9.0, 9.0, 9.0, 9.0]])
    returns = torch.tensor([[0.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    errors = value_errors(values, returns, mask)
    assert float(errors["critic/value_error_first"]) == pytest.approx(0.55)
    assert float(errors["critic/value_error_last"]) == pytest.approx(0.2)
