"""Policy objectives (FORMULAS §3): hand cases, reference loops, gradient properties."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from rlmap.core.errors import UnknownComponentError
from rlmap.correction import BehaviourParams, PolicyTerms, registry
from rlmap.correction.clip_objectives import gspo_loss, ppo_clip_loss, sapo_loss
from rlmap.correction.params import RatioMode

NAMES = (
    "pg",
    "ppo_clip",
    "cispo",
    "gspo",
    "sapo",
    "direct_gate",
    "dppo_tv",
    "dppo_kl",
    "dro",
    "gmpo",
)


def terms_for(
    log_r: list[list[float]],
    adv: list[list[float]],
    *,
    logp: float = -1.0,
    mask: list[list[bool]] | None = None,
    log_kappa: float = 0.0,
) -> tuple[PolicyTerms, Tensor]:
    """Terms with log π_θ = logp (a leaf with grad), log π_old = logp − log r, κ = e^log_kappa."""
    lr = torch.tensor(log_r)
    lp = torch.full_like(lr, logp).requires_grad_(True)
    old = lp.detach() - lr
    m = torch.ones_like(lr, dtype=torch.bool) if mask is None else torch.tensor(mask)
    terms = PolicyTerms(lp, old, old - log_kappa, torch.tensor(adv), m)
    return terms, lp


def loss_and_grad(name: str, terms: PolicyTerms, lp: Tensor, p: BehaviourParams) -> tuple:
    j, diag = registry.get(name).fn(terms, p)
    (g,) = torch.autograd.grad(j.sum(), lp)
    return j.detach(), g, diag


# ---------------------------------------------------------------- registry


def test_registry_names_and_unknown() -> None:
    assert registry.names() == NAMES
    for name in NAMES:
        entry = registry.get(name)
        assert entry.summary and entry.paper
    with pytest.raises(UnknownComponentError, match="known: pg, ppo_clip"):
        registry.get("trpo")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("mode", ["decoupled", "bypass"])
def test_zero_off_mask_no_nan_and_detached_diagnostics(name: str, mode: RatioMode) -> None:
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(4, 6, generator=g) > 0.3
    lp = torch.where(mask, -torch.rand(4, 6, generator=g), -1e9).requires_grad_(True)
    mu = torch.where(mask, lp.detach() + 0.1 * torch.randn(4, 6, generator=g), 0.0)
    old = mu if mode == "bypass" else lp.detach() + 0.05
    adv = torch.where(mask, torch.randn(4, 6, generator=g), 0.0)
    terms = PolicyTerms(lp, old, mu, adv, mask)
    j, diag = registry.get(name).fn(terms, BehaviourParams(objective=name, mode=mode))
    (grad,) = torch.autograd.grad(j.sum(), lp)
    assert j.shape == (4, 6)
    assert torch.all(j[~mask] == 0) and torch.all(grad[~mask] == 0)
    assert torch.isfinite(j).all() and torch.isfinite(grad).all()
    assert all(v.dim() == 0 and not v.requires_grad for v in diag.values())
    assert {"ratio/d/mean_abs_log", "ratio/d/p99_abs_log", "ratio/d/max_abs_log"} <= set(diag)
    has_rho_kappa = {"ratio/rho/mean_abs_log", "ratio/kappa/max_abs_log"} <= set(diag)
    assert has_rho_kappa == (mode == "decoupled")


# ---------------------------------------------------------------- pg


def test_pg_hand_case() -> None:
    # Â = 2, log π_θ = −0.5: j = −2·(−0.5) = 1.0; dj/dlog π_θ = −Â = −2
    terms, lp = terms_for([[0.0]], [[2.0]], logp=-0.5)
    j, g, _ = loss_and_grad("pg", terms, lp, BehaviourParams(objective="pg"))
    assert j.item() == pytest.approx(1.0)
    assert g.item() == pytest.approx(-2.0)


# ---------------------------------------------------------------- ppo_clip


def test_ppo_clip_hand_case() -> None:
    # ε = 0.2, band [0.8, 1.2]
    # r=1.5, Â=+1: −min(1.5, 1.2) = −1.2    r=0.5, Â=+1: −min(0.5, 0.8) = −0.5
    # r=0.5, Â=−1: −min(−0.5, −0.8) = 0.8   r=1.5, Â=−1: −min(−1.5, −1.2) = 1.5
    # r=1.0, Â=+2: −2
    r = [[1.5, 0.5, 0.5, 1.5, 1.0]]
    adv = [[1.0, 1.0, -1.0, -1.0, 2.0]]
    terms, _ = terms_for([[math.log(x) for x in r[0]]], adv)
    j, diag = registry.get("ppo_clip").fn(terms, BehaviourParams())
    torch.testing.assert_close(j.detach(), torch.tensor([[-1.2, -0.5, 0.8, 1.5, -2.0]]))
    # clipped in the direction of Â: token 0 (high) and token 2 (low) → 2/5
    assert diag["ratio/rho/clipped_frac"].item() == pytest.approx(0.4)
    assert diag["ratio/rho/clipped_high_frac"].item() == pytest.approx(0.2)
    assert diag["ratio/rho/clipped_low_frac"].item() == pytest.approx(0.2)


def test_ppo_clip_bypass_diagnostics_keep_the_rho_keys_but_measure_d() -> None:
    # bypass: π_old := μ_old, so the clipped ratio is d = π_θ/μ_old. With d = (1.5, 1.0),
    # Â = +1, ε = 0.2: token 0 is clipped → ratio/rho/clipped_frac = 1/2 (d's fraction),
    # and no ratio/rho tail statistics are reported (only ratio/d/*).
    lp = torch.full((1, 2), -1.0, requires_grad=True)
    mu = lp.detach() - torch.tensor([[math.log(1.5), 0.0]])
    terms = PolicyTerms(lp, mu, mu, torch.ones(1, 2), torch.ones(1, 2, dtype=torch.bool))
    _, diag = registry.get("ppo_clip").fn(terms, BehaviourParams(mode="bypass"))
    assert diag["ratio/rho/clipped_frac"].item() == pytest.approx(0.5)
    assert diag["ratio/rho/clipped_high_frac"].item() == pytest.approx(0.5)
    assert diag["ratio/d/max_abs_log"].item() == pytest.approx(math.log(1.5))
    assert "ratio/rho/max_abs_log" not in diag


def test_ppo_clip_gradient_zero_exactly_where_clipped_towards_the_advantage() -> None:
    # Clip-Higher ε_low = 0.2, ε_high = 0.28 → band [0.8, 1.28]
    r = [1.3, 1.1, 0.7, 0.7, 0.9, 1.3]
    adv = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0]
    zero = [True, False, False, True, False, False]
    terms, lp = terms_for([[math.log(x) for x in r]], [adv])
    _, g, _ = loss_and_grad("ppo_clip", terms, lp, BehaviourParams(clip_high=0.28))
    for t in range(len(r)):
        assert (g[0, t].item() == 0.0) == zero[t], (t, g[0, t])
    # where not clipped, dj/dlog π_θ = −Â·r
    assert g[0, 1].item() == pytest.approx(-1.1)
    assert g[0, 5].item() == pytest.approx(1.3)


def test_dual_clip_caps_the_loss_for_negative_advantages() -> None:
    # c = 3. r = 5, Â = −1: ppo loss = −min(−5, −1.2) = 5; dual: min(5, −3·(−1)) = 3, no gradient
    # r = 2, Â = −1: ppo loss 2 < 3, unchanged, gradient −Â·r = 2
    # r = 5, Â = +1: Â ≥ 0 unchanged: −min(5, 1.2) = −1.2
    terms, lp = terms_for([[math.log(5.0), math.log(2.0), math.log(5.0)]], [[-1.0, -1.0, 1.0]])
    p = BehaviourParams(dual_clip=3.0)
    j, g, diag = loss_and_grad("ppo_clip", terms, lp, p)
    torch.testing.assert_close(j, torch.tensor([[3.0, 2.0, -1.2]]))
    assert g[0, 0].item() == 0.0
    assert g[0, 1].item() == pytest.approx(2.0)
    assert diag["ratio/rho/dual_clipped_frac"].item() == pytest.approx(1 / 3)
    j_plain, _, _ = loss_and_grad("ppo_clip", terms, lp, BehaviourParams())
    assert j_plain[0, 0].item() == pytest.approx(5.0)


def ref_ppo(r: float, a: float, lo: float, hi: float, c: float | None) -> float:
    surr = min(r * a, min(max(r, 1 - lo), 1 + hi) * a)
    if c is not None and a < 0:
        surr = max(surr, c * a)
    return -surr


@pytest.mark.parametrize("dual", [None, 3.0])
def test_ppo_clip_reference_loop(dual: float | None) -> None:
    g = torch.Generator().manual_seed(4)
    log_r = torch.randn(4, 8, generator=g)
    adv = torch.randn(4, 8, generator=g)
    j = ppo_clip_loss(log_r, adv, clip_low=0.2, clip_high=0.28, dual_clip=dual)
    for i in range(4):
        for t in range(8):
            r, a = math.exp(float(log_r[i, t])), float(adv[i, t])
            assert j[i, t].item() == pytest.approx(ref_ppo(r, a, 0.2, 0.28, dual), rel=1e-5)


# ---------------------------------------------------------------- cispo


def test_cispo_hand_case_and_gradient_survives_the_clip() -> None:
    # r = 1.5, ε_high = 0.2 → weight sg(1.2); Â = 1, log π_θ = −0.3: j = −1.2·1·(−0.3) = 0.36
    # dj/dlog π_θ = −1.2·Â = −1.2 (nonzero although r is clipped; PPO would give 0 here)
    # r = 0.5, Â = −1: weight 0.8, j = −0.8·(−1)·(−0.3) = −0.24, gradient +0.8
    terms, lp = terms_for([[math.log(1.5), math.log(0.5)]], [[1.0, -1.0]], logp=-0.3)
    j, g, diag = loss_and_grad("cispo", terms, lp, BehaviourParams(objective="cispo"))
    torch.testing.assert_close(j, torch.tensor([[0.36, -0.24]]))
    torch.testing.assert_close(g, torch.tensor([[-1.2, 0.8]]))
    assert diag["ratio/rho/clipped_frac"].item() == pytest.approx(1.0)
    _, g_ppo, _ = loss_and_grad("ppo_clip", terms, lp, BehaviourParams())
    assert g_ppo[0, 0].item() == 0.0


def test_cispo_reference_loop() -> None:
    g = torch.Generator().manual_seed(5)
    log_r = 0.5 * torch.randn(3, 6, generator=g)
    adv = torch.randn(3, 6, generator=g).tolist()
    terms, lp = terms_for(log_r.tolist(), adv, logp=-0.7)
    p = BehaviourParams(objective="cispo", clip_low=10.0, clip_high=0.28)
    j, grad, _ = loss_and_grad("cispo", terms, lp, p)
    for i in range(3):
        for t in range(6):
            w = min(math.exp(float(log_r[i, t])), 1.28)  # ε_low = 10: no lower clip
            assert j[i, t].item() == pytest.approx(-w * adv[i][t] * -0.7, rel=1e-5, abs=1e-7)
            assert grad[i, t].item() == pytest.approx(-w * adv[i][t], rel=1e-5, abs=1e-7)


# ---------------------------------------------------------------- gspo


def test_gspo_sequence_ratio_is_exp_of_mean_token_log_ratio() -> None:
    # row 0: log r = (0.1, 0.3), third token off the mask → mean 0.2 → s = e^0.2 = 1.22140
    # with Â = 1, wide clip (ε = 0.3: band [0.7, 1.3]): j_i = −s = −1.22140 on each action token
    # row 1: log r = (−0.2, 0.0, 0.5) → mean 0.1 → s = e^0.1 = 1.10517, Â = −2 → j = 2.21034
    log_r = [[0.1, 0.3, 9.0], [-0.2, 0.0, 0.5]]
    mask = [[True, True, False], [True, True, True]]
    j = gspo_loss(
        torch.tensor(log_r),
        torch.tensor([[1.0, 1.0, 0.0], [-2.0, -2.0, -2.0]]),
        torch.tensor(mask),
        clip_low=0.3,
        clip_high=0.3,
    )
    assert j[0, 0].item() == pytest.approx(-math.exp(0.2), rel=1e-6)
    assert j[0, 1].item() == pytest.approx(-math.exp(0.2), rel=1e-6)
    assert j[1].tolist() == pytest.approx([2 * math.exp(0.1)] * 3, rel=1e-6)


def ref_gspo_sequence(log_r: list[float], a: float, lo: float, hi: float) -> float:
    s = math.exp(sum(log_r) / len(log_r))
    return -min(s * a, min(max(s, 1 - lo), 1 + hi) * a)


def test_gspo_reference_loop() -> None:
    g = torch.Generator().manual_seed(6)
    log_r = 1e-3 * torch.randn(5, 7, generator=g)
    mask = torch.rand(5, 7, generator=g) > 0.3
    mask[:, 0] = True
    adv = torch.randn(5, 1, generator=g).expand(5, 7)
    j = gspo_loss(log_r, adv, mask, clip_low=3e-4, clip_high=4e-4)
    for i in range(5):
        toks = [float(log_r[i, t]) for t in range(7) if mask[i, t]]
        want = ref_gspo_sequence(toks, float(adv[i, 0]), 3e-4, 4e-4)
        for t in range(7):
            if mask[i, t]:
                assert j[i, t].item() == pytest.approx(want, rel=1e-5)


def response_mean(j: Tensor, mask: Tensor) -> Tensor:
    m = mask.float()
    return ((j * m).sum(-1) / m.sum(-1)).mean()


@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.2, 0.2)])
def test_gspo_token_value_and_gradient_equal_gspo(eps: tuple[float, float]) -> None:
    g = torch.Generator().manual_seed(7)
    log_r = 0.05 * torch.randn(4, 6, generator=g)
    mask = torch.rand(4, 6, generator=g) > 0.3
    mask[:, 0] = True
    adv = torch.randn(4, 1, generator=g).expand(4, 6).tolist()
    out = {}
    for token in (False, True):
        terms, lp = terms_for(log_r.tolist(), adv, mask=mask.tolist())
        p = BehaviourParams(objective="gspo", clip_low=eps[0], clip_high=eps[1], gspo_token=token)
        j, diag = registry.get("gspo").fn(terms, p)
        loss = response_mean(j, mask)
        (grad,) = torch.autograd.grad(loss, lp)
        out[token] = (j.detach(), grad, diag["ratio/rho/clipped_frac"])
    torch.testing.assert_close(out[True][0], out[False][0])
    torch.testing.assert_close(out[True][1], out[False][1])
    torch.testing.assert_close(out[True][2], out[False][2])


def test_gspo_and_gspo_token_differ_when_the_advantage_varies_along_a_sequence() -> None:
    # Not an equivalence: GSPO is defined with one sequence advantage Â_i, and the paper
    # claims GSPO-token = GSPO only when every token carries that Â_i. GSPO-token exists
    # to admit per-token Â_{i,t}; rlmap's GSPO reduces them to their masked mean.
    # One row, log r = 0 (s = 1, inside the clip), Â = (1, 3), response_mean weights 1/2:
    #   GSPO:        Â_i = 2, j = (−2, −2); loss = −2s, ∂s/∂log π_θ(t) = s/2 → grad (−1, −1)
    #   GSPO-token:  j_t = −s_t·Â_t = (−1, −3); ∂j_t/∂log π_θ(t) = −Â_t → grad (−1/2, −3/2)
    want = {False: ([-2.0, -2.0], [-1.0, -1.0]), True: ([-1.0, -3.0], [-0.5, -1.5])}
    for token, (value, grad) in want.items():
        terms, lp = terms_for([[0.0, 0.0]], [[1.0, 3.0]])
        p = BehaviourParams(objective="gspo", gspo_token=token)
        j, _ = registry.get("gspo").fn(terms, p)
        (g,) = torch.autograd.grad(response_mean(j, terms.mask), lp)
        assert j.detach()[0].tolist() == pytest.approx(value)
        assert g[0].tolist() == pytest.approx(grad)


def test_objective_levels() -> None:
    levels = {n: registry.get(n).sequence_level for n in NAMES}
    assert levels == dict.fromkeys(NAMES, False) | {"gspo": True, "gmpo": True}
    switches = {n: registry.get(n).token_switch for n in NAMES}
    assert switches == dict.fromkeys(NAMES) | {"gspo": "gspo_token"}
    fields = {f.name: f.type for f in dataclasses.fields(BehaviourParams)}
    assert all(fields[s] == "bool" for s in switches.values() if s is not None)
    assert registry.get("gspo").is_sequence_level(BehaviourParams())
    assert not registry.get("gspo").is_sequence_level(BehaviourParams(gspo_token=True))
    assert not registry.get("ppo_clip").is_sequence_level(BehaviourParams(gspo_token=True))


def test_gspo_response_mean_is_the_sequence_mean() -> None:
    # response_mean of the token placement = (1/B) Σ_i j_i, the paper's GSPO objective
    g = torch.Generator().manual_seed(8)
    log_r = 0.1 * torch.randn(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]).bool()
    adv = torch.tensor([[0.5], [-1.0], [2.0]]).expand(3, 5)
    j = gspo_loss(log_r, adv, mask, clip_low=0.2, clip_high=0.2)
    seq = [
        ref_gspo_sequence(
            [float(log_r[i, t]) for t in range(5) if mask[i, t]], float(adv[i, 0]), 0.2, 0.2
        )
        for i in range(3)
    ]
    assert response_mean(j, mask).item() == pytest.approx(sum(seq) / 3, rel=1e-5)


# ---------------------------------------------------------------- sapo


def test_sapo_hand_case() -> None:
    # r = 1: f = σ(0)·4/τ = 2/τ. Â = +1, τ_pos = 1 → j = −2
    # Â = −1, τ_neg = 1.05 → j = +2/1.05 = 1.904762
    # r = 2, Â = +1, τ = 1: f = σ(1)·4 = 0.7310586·4 = 2.924234 → j = −2.924234
    terms, _ = terms_for([[0.0, 0.0, math.log(2.0)]], [[1.0, -1.0, 1.0]])
    j, _ = registry.get("sapo").fn(terms, BehaviourParams(objective="sapo"))
    torch.testing.assert_close(j.detach(), torch.tensor([[-2.0, 2.0 / 1.05, -2.924234]]))


def test_sapo_gradient_at_r_one_is_the_policy_gradient() -> None:
    # dj/dlog π_θ = −Â·f'(r)·r, f'(1) = τ·σ'(0)·4/τ = 4·0.25 = 1 → −Â
    adv = [[1.5, -0.7, 3.0, -2.0]]
    terms, lp = terms_for([[0.0] * 4], adv)
    _, g, _ = loss_and_grad("sapo", terms, lp, BehaviourParams(objective="sapo"))
    torch.testing.assert_close(g, -torch.tensor(adv))


def test_sapo_reference_loop() -> None:
    g = torch.Generator().manual_seed(9)
    log_r = 0.5 * torch.randn(3, 6, generator=g)
    adv = torch.randn(3, 6, generator=g)
    j = sapo_loss(log_r, adv, tau_pos=1.0, tau_neg=1.05)
    for i in range(3):
        for t in range(6):
            r, a = math.exp(float(log_r[i, t])), float(adv[i, t])
            tau = 1.0 if a > 0 else 1.05
            f = 1 / (1 + math.exp(-tau * (r - 1))) * 4 / tau
            assert j[i, t].item() == pytest.approx(-f * a, rel=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.floats(-3, 3), st.floats(-5, 5).filter(lambda a: abs(a) > 1e-3))
def test_sapo_soft_gate_keeps_the_sign_and_decays_away_from_one(log_r: float, a: float) -> None:
    # dj/dlog π_θ = −Â·4σ'(τ(r−1))·r: same sign as the policy gradient −Â (no hard zero), and
    # smaller in magnitude than at r = 1 once r is far from 1: at |log r| = 1.5, 4σ'(τ(r−1))·r is
    # 0.52 (r = 4.48, τ = 1) and 0.19 (r = 0.22); near r = 2 it exceeds 1 (1.57), so no bound there
    terms, lp = terms_for([[log_r]], [[a]])
    _, g, _ = loss_and_grad("sapo", terms, lp, BehaviourParams(objective="sapo"))
    assert g.item() * a <= 0
    if abs(log_r) <= 2:  # beyond, σ' underflows in float32 (σ(19) rounds to 1 at r = e^3)
        assert g.item() * a < 0
    if abs(log_r) > 1.5:
        assert abs(g.item()) < abs(a)


# ---------------------------------------------------------------- direct_gate


def test_direct_gate_hand_case() -> None:
    # ε = (0.3, 5.0): band 0.7 < d < 6.0. log π_θ = −0.5.
    # d = 1.2, Â = 1 → w = 1.2, j = −1.2·1·(−0.5) = 0.6
    # d = 0.5 (below 0.7) → 0; d = 7 (above 6) → 0; d = 2, Â = −1 → j = −2·(−1)·(−0.5) = −1.0
    d = [1.2, 0.5, 7.0, 2.0]
    terms, _ = terms_for([[0.0] * 4], [[1.0, 1.0, 1.0, -1.0]], logp=-0.5)
    terms = PolicyTerms(
        terms.logprobs,
        terms.old_logprobs,
        terms.logprobs.detach() - torch.tensor([[math.log(x) for x in d]]),
        terms.advantages,
        terms.mask,
    )
    j, diag = registry.get("direct_gate").fn(terms, BehaviourParams(objective="direct_gate"))
    torch.testing.assert_close(j.detach(), torch.tensor([[0.6, 0.0, 0.0, -1.0]]))
    assert diag["ratio/d/masked_frac"].item() == pytest.approx(0.5)


@pytest.mark.parametrize("a", [1.0, -1.0])
def test_direct_gate_zero_gradient_outside_band_on_both_sides(a: float) -> None:
    d = [0.5, 0.69, 0.71, 1.0, 5.9, 6.1, 50.0]
    inside = [False, False, True, True, True, False, False]
    lp = torch.full((1, 7), -1.0, requires_grad=True)
    mu = lp.detach() - torch.tensor([[math.log(x) for x in d]])
    terms = PolicyTerms(lp, mu, mu, torch.full((1, 7), a), torch.ones(1, 7, dtype=torch.bool))
    _, g, _ = loss_and_grad("direct_gate", terms, lp, BehaviourParams(objective="direct_gate"))
    for t in range(7):
        assert (g[0, t].item() != 0.0) == inside[t], (t, d[t], g[0, t])
        if inside[t]:  # −sg(w)·Â
            assert g[0, t].item() == pytest.approx(-d[t] * a, rel=1e-5)


def test_direct_gate_uses_d_not_rho() -> None:
    # ρ = 1 (inside any band) but d = 10 (outside): the gate reads d = π_θ/μ_old
    lp = torch.full((1, 1), -1.0, requires_grad=True)
    terms = PolicyTerms(
        lp, lp.detach(), lp.detach() - math.log(10.0), torch.ones(1, 1), torch.ones(1, 1).bool()
    )
    j, _ = registry.get("direct_gate").fn(terms, BehaviourParams(objective="direct_gate"))
    assert j.item() == 0.0
