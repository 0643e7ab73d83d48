"""KL to the reference (FORMULAS §6): k1, k2, k3, KL in the reward, adaptive β."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmap.correction import adaptive_beta, k1, k2, k3, kl_estimators, kl_in_reward


def test_estimators_hand_values() -> None:
    # log π_θ = −1, log π_ref = −2: k1 = 1; k2 = ½·1² = 0.5; x = −2 − (−1) = −1,
    #   k3 = e^−1 − (−1) − 1 = 0.367879
    # log π_θ = −2, log π_ref = −1: k1 = −1; k2 = 0.5; x = 1, k3 = e − 1 − 1 = 0.718282
    lp, ref = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-2.0, -1.0]])
    torch.testing.assert_close(k1(lp, ref), torch.tensor([[1.0, -1.0]]))
    torch.testing.assert_close(k2(lp, ref), torch.tensor([[0.5, 0.5]]))
    torch.testing.assert_close(k3(lp, ref), torch.tensor([[0.367879, 0.718282]]))


def test_estimators_reference_loop_and_registry() -> None:
    g = torch.Generator().manual_seed(0)
    lp, ref = -torch.rand(3, 5, generator=g) * 4, -torch.rand(3, 5, generator=g) * 4
    got = {name: kl_estimators.get(name).fn(lp, ref) for name in ("k1", "k2", "k3")}
    for i in range(3):
        for t in range(5):
            a, b = float(lp[i, t]), float(ref[i, t])
            x = b - a
            want = {"k1": a - b, "k2": 0.5 * (a - b) ** 2, "k3": math.exp(x) - x - 1}
            for name, v in want.items():
                assert got[name][i, t].item() == pytest.approx(v, rel=1e-5, abs=1e-6)
    assert kl_estimators.names() == ("k1", "k2", "k3", "k3_iw")


@settings(max_examples=50, deadline=None)
@given(st.floats(-40, 0), st.floats(-40, 0))
def test_k3_is_nonnegative_bounded_and_has_finite_gradient(a: float, b: float) -> None:
    lp = torch.tensor([[a]], requires_grad=True)
    k = k3(lp, torch.tensor([[b]]))
    (grad,) = torch.autograd.grad(k.sum(), lp)
    assert 0.0 <= k.item() <= 10.0
    assert math.isfinite(grad.item())


def test_k3_nonnegative_for_tiny_differences() -> None:
    # x = 5.96e-8: float32 exp(x) rounds to 1, so exp(x) − x − 1 would be −5.96e-8 < 0;
    # k3 = expm1(x) − x ≈ x²/2 ≥ 0
    k = k3(torch.tensor([[-5.960464477539063e-08, 0.0]]), torch.tensor([[0.0, -5.96e-8]]))
    assert torch.all(k >= 0)


def test_k3_clamped_at_ten() -> None:
    # x = log π_ref − log π_θ = 5: e^5 − 5 − 1 = 142.4 → 10; x = −30: 30 − 1 + e^−20 ≈ 29 → 10
    k = k3(torch.tensor([[-10.0, 0.0]]), torch.tensor([[-5.0, -30.0]]))
    assert k.tolist() == [[10.0, 10.0]]


def test_kl_in_reward_hand_case() -> None:
    # β = 0.1. Token 0: r = 0, k1 = −1 − (−1.5) = 0.5 → 0 − 0.05 = −0.05
    # token 1 (last action): r = 1, k1 = −0.5 − (−0.3) = −0.2 → 1 + 0.02 = 1.02
    # token 2 off the mask: unchanged 0
    rewards = torch.tensor([[0.0, 1.0, 0.0]])
    lp = torch.tensor([[-1.0, -0.5, -9.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.3, -1.0]])
    mask = torch.tensor([[True, True, False]])
    out = kl_in_reward(rewards, lp, ref, mask, beta=0.1)
    torch.testing.assert_close(out, torch.tensor([[-0.05, 1.02, 0.0]]))
    assert not out.requires_grad


def test_kl_in_reward_reference_loop() -> None:
    g = torch.Generator().manual_seed(1)
    rewards, lp, ref = (torch.randn(3, 6, generator=g) for _ in range(3))
    mask = torch.rand(3, 6, generator=g) > 0.4
    out = kl_in_reward(rewards, lp, ref, mask, beta=0.05)
    for i in range(3):
        for t in range(6):
            r = float(rewards[i, t])
            want = r - 0.05 * (float(lp[i, t]) - float(ref[i, t])) if mask[i, t] else r
            assert out[i, t].item() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_adaptive_beta_hand_case() -> None:
    # β = 0.1, target 0.1, n/horizon = 100/1000 = 0.1
    # KL = 0.15: error 0.5 → clipped 0.2 → β = 0.1·(1 + 0.2·0.1) = 0.102
    # KL = 0.09: error −0.1 → β = 0.1·(1 − 0.1·0.1) = 0.099
    # KL = 0.0:  error −1 → clipped −0.2 → 0.1·(1 − 0.02) = 0.098
    assert adaptive_beta(0.1, 0.15, 0.1, 100, 1000) == pytest.approx(0.102)
    assert adaptive_beta(0.1, 0.09, 0.1, 100, 1000) == pytest.approx(0.099)
    assert adaptive_beta(0.1, 0.0, 0.1, 100, 1000) == pytest.approx(0.098)
    assert adaptive_beta(0.1, 0.1, 0.1, 100, 1000) == pytest.approx(0.1)


@settings(max_examples=50, deadline=None)
@given(
    st.floats(1e-3, 1.0),
    st.floats(0.0, 5.0),
    st.floats(1e-3, 1.0),
    st.integers(1, 1000),
    st.integers(1000, 100000),
)
def test_adaptive_beta_moves_toward_target_within_the_clip(
    beta: float, kl: float, target: float, n: int, horizon: int
) -> None:
    new = adaptive_beta(beta, kl, target, n, horizon)
    step = new / beta - 1.0
    assert abs(step) <= 0.2 * n / horizon + 1e-12
    if kl > target * (1 + 1e-9):
        assert new > beta  # KL too high → stronger penalty
    elif kl < target * (1 - 1e-9):
        assert new < beta


def test_estimators_form_the_log_ratio_in_float32() -> None:
    # log π_θ = −0.01, log π_ref = −10 in bfloat16: the difference 9.99 is not a bfloat16
    # number (step 0.0625 near 10); every estimator works on the float32 difference
    lp = torch.tensor([[-0.01, -2.0]], dtype=torch.bfloat16)
    ref = torch.tensor([[-10.0, -2.01]], dtype=torch.bfloat16)
    diff = lp.float() - ref.float()
    assert torch.equal(k1(lp, ref), diff)
    assert torch.equal(k2(lp, ref), 0.5 * diff.square())
    x = -diff
    torch.testing.assert_close(k3(lp, ref), torch.expm1(x) - x)
    assert all(k(lp, ref).dtype == torch.float32 for k in (k1, k2, k3))
