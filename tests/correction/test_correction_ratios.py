"""Ratios ρ, κ, d (FORMULAS §1): hand cases, a reference loop, the bypass mode, tail statistics."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmap.core.batch import make_batch
from rlmap.core.errors import ConfigError
from rlmap.correction.ratios import (
    LOG_RATIO_BOUND,
    log_direct,
    log_kappa,
    log_ratio,
    log_rho,
    masked_quantile,
    ratio_stats,
    resolve_old,
    sequence_mean,
)
from rlmap.correction.terms import PolicyTerms, terms_from_batch


def test_hand_case_three_ratios() -> None:
    # log π_θ = −1.0, log π_old = −1.5, log μ_old = −2.0
    # log ρ = −1.0 − (−1.5) = 0.5; log κ = −1.5 − (−2.0) = 0.5; log d = −1.0 − (−2.0) = 1.0
    lp, old, mu = torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), torch.tensor([[-2.0]])
    assert log_rho(lp, old).item() == pytest.approx(0.5)
    assert log_kappa(old, mu).item() == pytest.approx(0.5)
    assert log_direct(lp, mu).item() == pytest.approx(1.0)


def test_clamped_to_twenty_before_exp() -> None:
    # log π_θ = 0, log π_old = −30: the raw log ρ = 30 is clamped to 20, exp(20) ≈ 4.85e8 finite
    lp, old = torch.tensor([[0.0, -30.0]]), torch.tensor([[-30.0, 0.0]])
    out = log_rho(lp, old)
    assert out.tolist() == [[20.0, -20.0]]
    assert torch.isfinite(out.exp()).all()


def test_reference_loop_random() -> None:
    g = torch.Generator().manual_seed(0)
    lp, old, mu = (torch.randn(3, 5, generator=g) * 15 for _ in range(3))
    rho, kap, d = log_rho(lp, old), log_kappa(old, mu), log_direct(lp, mu)
    for i in range(3):
        for t in range(5):
            a, b, c = float(lp[i, t]), float(old[i, t]), float(mu[i, t])
            assert rho[i, t].item() == pytest.approx(min(max(a - b, -20.0), 20.0), abs=1e-5)
            assert kap[i, t].item() == pytest.approx(min(max(b - c, -20.0), 20.0), abs=1e-5)
            assert d[i, t].item() == pytest.approx(min(max(a - c, -20.0), 20.0), abs=1e-5)


def test_d_is_rho_plus_kappa_inside_the_clamp() -> None:
    g = torch.Generator().manual_seed(1)
    lp, old, mu = (torch.randn(4, 6, generator=g) for _ in range(3))
    torch.testing.assert_close(log_direct(lp, mu), log_rho(lp, old) + log_kappa(old, mu))


def test_bypass_gives_kappa_one_and_rho_equal_d() -> None:
    g = torch.Generator().manual_seed(2)
    mask = torch.rand(3, 6, generator=g) > 0.3
    mu = torch.randn(3, 6, generator=g)
    old = torch.randn(3, 6, generator=g)  # present but ignored in bypass mode
    batch = make_batch(mask, torch.ones(3), behavior_logprobs=mu, old_logprobs=old)
    lp = torch.randn(3, 6, generator=g, requires_grad=True)
    terms = terms_from_batch(batch, lp, torch.zeros(3, 6), mode="bypass")
    assert torch.equal(terms.log_kappa, torch.zeros(3, 6))  # κ ≡ 1
    assert torch.equal(terms.log_rho, terms.log_d)  # ρ = d
    decoupled = terms_from_batch(batch, lp, torch.zeros(3, 6), mode="decoupled")
    assert not torch.equal(decoupled.log_kappa, torch.zeros(3, 6))


def test_resolve_old_modes() -> None:
    old, mu = torch.full((1, 2), -1.0), torch.full((1, 2), -2.0)
    assert resolve_old("bypass", old, mu) is mu
    assert resolve_old("bypass", None, mu) is mu
    assert resolve_old("decoupled", old, mu) is old
    with pytest.raises(ConfigError, match=r"^behaviour.mode"):
        resolve_old("decoupled", None, mu)
    with pytest.raises(ConfigError, match=r"^behaviour.mode"):
        resolve_old("sideways", old, mu)


def test_terms_from_batch_drops_invalid_rows_from_the_mask() -> None:
    mask = torch.ones(2, 3, dtype=torch.bool)
    batch = make_batch(mask, torch.ones(2), reward_status=torch.tensor([0, 2]))
    terms = terms_from_batch(batch, torch.zeros(2, 3), torch.ones(2, 3), mode="bypass")
    assert terms.mask.tolist() == [[True] * 3, [False] * 3]


def test_ratio_stats_hand_case() -> None:
    # masked |log x| = {0.1, 0.3, 0.2} (5.0 is off the mask)
    # mean = 0.6 / 3 = 0.2; max = 0.3
    # p99: sorted (0.1, 0.2, 0.3), position 0.99·(3 − 1) = 1.98 → 0.2 + 0.98·(0.3 − 0.2) = 0.298
    log_x = torch.tensor([[0.1, -0.3, 5.0], [-0.2, 0.0, 0.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    s = ratio_stats(log_x, mask, "kappa")
    assert set(s) == {
        "ratio/kappa/mean_abs_log",
        "ratio/kappa/p99_abs_log",
        "ratio/kappa/max_abs_log",
    }
    assert s["ratio/kappa/mean_abs_log"].item() == pytest.approx(0.2)
    assert s["ratio/kappa/p99_abs_log"].item() == pytest.approx(0.298)
    assert s["ratio/kappa/max_abs_log"].item() == pytest.approx(0.3)


def test_ratio_stats_reference_loop_and_detached() -> None:
    g = torch.Generator().manual_seed(3)
    log_x = torch.randn(5, 7, generator=g, requires_grad=True)
    mask = torch.rand(5, 7, generator=g) > 0.4
    s = ratio_stats(log_x, mask, "rho")
    vals = sorted(
        abs(float(log_x[i, t].detach())) for i in range(5) for t in range(7) if mask[i, t]
    )
    pos = 0.99 * (len(vals) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    p99 = vals[lo] + (pos - lo) * (vals[hi] - vals[lo])
    assert s["ratio/rho/mean_abs_log"].item() == pytest.approx(sum(vals) / len(vals), rel=1e-5)
    assert s["ratio/rho/p99_abs_log"].item() == pytest.approx(p99, rel=1e-5)
    assert s["ratio/rho/max_abs_log"].item() == pytest.approx(max(vals), rel=1e-6)
    assert all(not v.requires_grad and v.dim() == 0 for v in s.values())


def test_ratio_stats_empty_mask_is_zero() -> None:
    s = ratio_stats(torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.bool), "d")
    assert all(v.item() == 0.0 for v in s.values())


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.floats(-50, 50), min_size=1, max_size=20),
    st.floats(0.0, 1.0),
)
def test_masked_quantile_matches_torch_quantile(values: list[float], q: float) -> None:
    x = torch.tensor(values, dtype=torch.float64).reshape(1, -1)
    mask = torch.ones_like(x, dtype=torch.bool)
    got = masked_quantile(x, mask, q)
    torch.testing.assert_close(got, torch.quantile(x.flatten(), q))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.floats(-50, 50), st.booleans()), min_size=1, max_size=20),
    st.floats(0.0, 1.0),
)
def test_masked_quantile_partial_mask_matches_torch_quantile(
    entries: list[tuple[float, bool]], q: float
) -> None:
    # masked-out entries hold garbage that must not move the quantile
    x = torch.tensor([[v if keep else 1e6 for v, keep in entries]], dtype=torch.float64)
    mask = torch.tensor([[keep for _, keep in entries]])
    got = masked_quantile(x, mask, q)
    want = torch.quantile(x[mask], q) if mask.any() else torch.zeros((), dtype=torch.float64)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("q", [0.0, 0.01, 0.25, 0.49, 0.5, 0.75, 0.99, 1.0])
def test_masked_quantile_partial_mask_every_q(q: float) -> None:
    # low quantiles (q < 0.5) take the mirrored path Q_q(x) = −Q_{1−q}(−x)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 9, generator=g, dtype=torch.float64)
    mask = torch.rand(6, 9, generator=g) > 0.4
    torch.testing.assert_close(masked_quantile(x, mask, q), torch.quantile(x[mask], q))


@pytest.mark.parametrize("q", [0.1, 0.5, 0.99])
def test_masked_quantile_empty_mask_is_zero(q: float) -> None:
    x = torch.randn(3, 4)
    assert masked_quantile(x, torch.zeros(3, 4, dtype=torch.bool), q).item() == 0.0


def test_masked_quantile_single_masked_value_is_that_value() -> None:
    x = torch.tensor([[3.0, -7.0, 1.0]])
    mask = torch.tensor([[False, True, False]])
    for q in (0.0, 0.3, 0.99):
        assert masked_quantile(x, mask, q).item() == -7.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_masked_quantile_low_precision_position(dtype: torch.dtype) -> None:
    # n = 1000, q = 0.99: position 0.99·999 = 989.01; in bfloat16 it rounds to 988 and the
    # interpolation is done in bfloat16. The values themselves are exact in either dtype.
    g = torch.Generator().manual_seed(5)
    x = torch.rand(10, 100, generator=g).to(dtype)
    mask = torch.ones(10, 100, dtype=torch.bool)
    got = masked_quantile(x, mask, 0.99)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.quantile(x.float().flatten(), 0.99))


def test_ratio_stats_float16_mean_does_not_overflow() -> None:
    # 70 000 tokens with |log x| = 0.5: a float16 token count is inf, the mean would be 0
    log_x = torch.full((7, 10_000), -0.5, dtype=torch.float16)
    s = ratio_stats(log_x, torch.ones(7, 10_000, dtype=torch.bool), "kappa")
    assert s["ratio/kappa/mean_abs_log"].item() == 0.5
    assert s["ratio/kappa/p99_abs_log"].item() == 0.5


def test_log_ratio_is_formed_in_float32_from_low_precision_inputs() -> None:
    # log π = −0.01 vs −10: the difference 9.99 is not a bfloat16 number (the step near 10
    # is 0.0625, so bfloat16 would give 10.0); the inputs are upcast before subtracting
    num = torch.tensor([[-0.01, -3.3]], dtype=torch.bfloat16)
    den = torch.tensor([[-10.0, -3.31]], dtype=torch.bfloat16)
    got = log_ratio(num, den)
    assert got.dtype == torch.float32
    assert torch.equal(got, num.float() - den.float())
    assert got[0, 0].item() != 10.0
    half = log_ratio(num.half(), den.half())
    assert half.dtype == torch.float32
    assert torch.equal(half, num.half().float() - den.half().float())


def test_log_ratio_keeps_float64_and_the_gradient() -> None:
    lp = torch.tensor([[-1.0]], dtype=torch.bfloat16, requires_grad=True)
    log_r = log_ratio(lp, torch.tensor([[-1.5]], dtype=torch.bfloat16))
    log_r.sum().backward()
    assert lp.grad is not None and lp.grad.item() == 1.0
    x64 = torch.tensor([[-1.0]], dtype=torch.float64)
    assert log_ratio(x64, x64 - 30).dtype == torch.float64
    assert log_ratio(x64, x64 - 30).item() == LOG_RATIO_BOUND


def test_sequence_mean_counts_tokens_exactly_in_bfloat16() -> None:
    # one row of 1001 action tokens, x = 1000 on the first and 0 elsewhere:
    # mean = 1000/1001 = 0.999001; a bfloat16 count rounds 1001 to 1000 and gives 1.0
    x = torch.zeros(1, 1001, dtype=torch.bfloat16)
    x[0, 0] = 1000.0
    got = sequence_mean(x, torch.ones(1, 1001, dtype=torch.bool))
    assert got.dtype == torch.float32
    assert got.item() == pytest.approx(1000 / 1001, rel=1e-6)


def test_policy_terms_properties_carry_gradient_only_through_theta() -> None:
    lp = torch.tensor([[-1.0]], requires_grad=True)
    old = torch.tensor([[-1.2]], requires_grad=True)
    terms = PolicyTerms(lp, old, torch.tensor([[-1.4]]), torch.ones(1, 1), torch.ones(1, 1).bool())
    assert terms.log_rho.requires_grad and terms.log_d.requires_grad
    assert not terms.log_kappa.requires_grad
