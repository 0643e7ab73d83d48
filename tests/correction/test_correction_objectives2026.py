"""dppo_tv, dppo_kl, dro and gmpo (docs/formulas.md §3): hand cases, reference loops, properties.

The hand cases use the research note's fixture F1 (two responses of one prompt, bypass mode,
so r = d = p_θ/p_μ), every value re-derived in a comment:

    token   p_μ    p_θ    d        log d       Δ = p_θ − p_μ   Â
    (1,1)   0.50   0.62   1.24      0.215111    +0.12          +1
    (1,2)   0.20   0.45   2.25      0.810930    +0.25          +1
    (1,3)   0.90   0.90   1.00      0            0             +1
    (2,1)   0.50   0.25   0.50     −0.693147    −0.25          −1
    (2,2)   0.30   0.28   0.93333  −0.068993    −0.02          −1
    (2,3)   off the action mask

(log d)² = 0.046273, 0.657608, 0, 0.480453, 0.004760; Σ = 1.189094.

The last tests compare with verl's own functions where verl is importable (skipped otherwise).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from anchors import anchor
from torch import Tensor

from rlmap.core.errors import ConfigError
from rlmap.correction import BehaviourParams, KLParams, PolicyTerms, check_behaviour, registry
from rlmap.correction.clip_objectives import gmpo_loss, gspo_loss, ppo_clip_loss
from rlmap.correction.params import RatioMode
from rlmap.correction.trust_region import binary_kl, dppo_kl_dropped, dppo_loss, dppo_tv_dropped
from rlmap.recipes import build_config

P_MU = [[0.50, 0.20, 0.90], [0.50, 0.30, 0.50]]
P_THETA = [[0.62, 0.45, 0.90], [0.25, 0.28, 0.50]]
ADV = [[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]]
MASK = [[True, True, True], [True, True, False]]


def f1(mode: RatioMode = "bypass") -> tuple[PolicyTerms, Tensor]:
    """F1 as PolicyTerms; decoupled mode puts π_old = π_θ (the first optimiser step)."""
    lp = torch.tensor(P_THETA).log().requires_grad_(True)
    mu = torch.tensor(P_MU).log()
    old = mu if mode == "bypass" else lp.detach().clone()
    return PolicyTerms(lp, old, mu, torch.tensor(ADV), torch.tensor(MASK)), lp


def run(name: str, terms: PolicyTerms, lp: Tensor, **params: Any) -> tuple[Tensor, Tensor, dict]:
    """(j, ∂Σj/∂log π_θ, diagnostics) of a registered objective."""
    mode = "bypass" if terms.old_logprobs is terms.behavior_logprobs else "decoupled"
    p = BehaviourParams(objective=name, mode=mode, **params)
    j, diag = registry.get(name).fn(terms, p)
    (grad,) = torch.autograd.grad(j.sum(), lp)
    return j.detach(), grad, diag


def response_mean(j: Tensor, mask: Tensor) -> Tensor:
    """(1/B) Σ_i (Σ_t m j)/|o_i|, an empty row counting in B with 0."""
    m = mask.float()
    return ((j * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()


def random_terms(seed: int, mode: RatioMode, b: int = 4, t: int = 6) -> tuple[PolicyTerms, Tensor]:
    """Probabilities in (0.02, 0.98), a ragged mask (every row has a first token), one Â per
    row, μ up to ~0.4 away in log space; decoupled mode has its own π_old."""
    g = torch.Generator().manual_seed(seed)
    p = 0.02 + 0.96 * torch.rand(b, t, generator=g)
    lp = p.log().requires_grad_(True)
    mu = (p.log() + 0.4 * torch.randn(b, t, generator=g)).clamp(max=-1e-3)
    old = (
        mu
        if mode == "bypass"
        else (p.log() + 0.3 * torch.randn(b, t, generator=g)).clamp(max=-1e-3)
    )
    mask = torch.rand(b, t, generator=g) > 0.3
    mask[:, 0] = True
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous()
    return PolicyTerms(lp, old, mu, adv, mask), lp


# ---------------------------------------------------------------- registry


def test_registry_entries_cite_paper_and_code_and_name_their_fields() -> None:
    fields = {
        "dppo_tv": ("dppo_tv_low", "dppo_tv_high", "dppo_tau"),
        "dppo_kl": ("dppo_kl_low", "dppo_kl_high", "dppo_tau"),
        "dro": ("dro_beta",),
        "gmpo": ("gmpo_clip_low", "gmpo_clip_high"),
    }
    for name, params in fields.items():
        entry = registry.get(name)
        assert entry.params == params and entry.uses_ratio
        assert "arXiv" in entry.paper and "::" in entry.code, name
        assert all(hasattr(BehaviourParams(), f) for f in params)
    assert [registry.get(n).sequence_level for n in fields] == [False, False, False, True]
    assert registry.get("gmpo").token_switch is None


def test_defaults_are_the_quoted_ones() -> None:
    p = BehaviourParams()
    assert (p.dppo_tv_low, p.dppo_tv_high, p.dppo_kl_low, p.dppo_kl_high) == (0.2, 0.2, 0.05, 0.05)
    assert (p.dppo_tau, p.dro_beta, p.gmpo_clip_low, p.gmpo_clip_high) == (0.0, 0.05, 0.4, 0.4)


# ---------------------------------------------------------------- dppo: hand cases (F1)


def test_dppo_tv_hand_case_f1() -> None:
    # δ = 0.2. (1,2): Â > 0 and Δ = +0.25 > 0.2 → dropped; (2,1): Â < 0 and Δ = −0.25 < −0.2 →
    # dropped; (1,1) Δ = 0.12 and (2,2) Δ = −0.02 stay inside. j = −M·d·Â:
    #   (1,1) −1.24·1 = −1.24  (1,2) 0  (1,3) −1·1 = −1  (2,1) 0  (2,2) −0.933333·(−1) = +0.933333
    # ∂j/∂log π_θ = −M·Â·d (∂d/∂log π_θ = d): the same numbers.
    # Token mean over N = 5: (−1.24 − 1 + 0.933333)/5 = −1.306667/5 = −0.261333 (note: −0.26133).
    terms, lp = f1()
    j, grad, diag = run("dppo_tv", terms, lp)
    want = torch.tensor([[-1.24, 0.0, -1.0], [0.0, 0.28 / 0.30, 0.0]])
    torch.testing.assert_close(j, want)
    torch.testing.assert_close(grad, want)
    assert j.sum().item() / 5 == pytest.approx(-0.261333, abs=1e-6)
    # dropped: 1 of 5 with Â > 0 (high), 1 of 5 with Â < 0 (low)
    assert diag["ratio/rho/clipped_frac"].item() == pytest.approx(0.4)
    assert diag["ratio/rho/clipped_high_frac"].item() == pytest.approx(0.2)
    assert diag["ratio/rho/clipped_low_frac"].item() == pytest.approx(0.2)


def test_dppo_tv_with_prime_rl_tau_and_the_tighter_delta_f1() -> None:
    # τ = 1e-3 adds τ·(log d)² on every action token, dropped ones too:
    # token mean = −0.261333 + 1e-3·1.189094/5 = −0.261333 + 0.000238 = −0.261096 (note: −0.26110).
    # Gradient of a dropped token is the penalty's alone, 2τ·log d:
    #   (1,2) 2e-3·0.810930 = 0.001622;  (2,1) 2e-3·(−0.693147) = −0.001386
    # and of a kept one −Â·d + 2τ·log d: (1,1) −1.24 + 2e-3·0.215111 = −1.239570.
    terms, lp = f1()
    j, grad, _ = run("dppo_tv", terms, lp, dppo_tau=1e-3)
    assert j.sum().item() / 5 == pytest.approx(-0.261096, abs=1e-6)
    assert grad[0, 1].item() == pytest.approx(0.001622, abs=1e-6)
    assert grad[1, 0].item() == pytest.approx(-0.001386, abs=1e-6)
    assert grad[0, 0].item() == pytest.approx(-1.239570, abs=1e-6)
    assert grad[1, 2].item() == 0.0  # off the mask: no penalty either
    # δ = 0.1 (prime-rl #3236): (1,1) with Δ = 0.12 is dropped too; j sums to −1 + 0.933333
    # = −0.066667, token mean −0.013333 (note: −0.01333)
    j, _, _ = run("dppo_tv", terms, lp, dppo_tv_low=0.1, dppo_tv_high=0.1)
    assert j.sum().item() / 5 == pytest.approx(-0.013333, abs=1e-6)


def test_binary_kl_hand_values() -> None:
    # KL(Bern(p) ‖ Bern(q)) = p ln(p/q) + (1−p) ln((1−p)/(1−q)):
    #   (0.5, 0.62): 0.5·(−0.215111) + 0.5·0.274437 = 0.029663
    #   (0.2, 0.45): 0.2·(−0.810930) + 0.8·0.374693 = −0.162186 + 0.299754 = 0.137569
    #   (0.5, 0.25): 0.5·0.693147 + 0.5·(−0.405465) = 0.143841
    #   (0.3, 0.28): 0.3·0.068993 + 0.7·(−0.028171) = 0.020698 − 0.019720 = 0.000978
    #   (0.9, 0.99): 0.9·(−0.095310) + 0.1·2.302585 = −0.085779 + 0.230259 = 0.144479
    p = torch.tensor([0.5, 0.2, 0.5, 0.3, 0.9])
    q = torch.tensor([0.62, 0.45, 0.25, 0.28, 0.99])
    got = binary_kl(p.log(), q.log())
    want = torch.tensor([0.029663, 0.137569, 0.143841, 0.000978, 0.144479])
    torch.testing.assert_close(got, want, atol=2e-6, rtol=0)
    assert binary_kl(p.log(), p.log()).abs().max().item() < 1e-6  # zero at p = q


def test_dppo_kl_hand_case_f1_and_where_it_parts_from_tv() -> None:
    # δ = 0.05 on D = KL(Bern(p_μ) ‖ Bern(p_θ)) = 0.029663, 0.137569, 0, 0.143841, 0.000978:
    # (1,2) has Â > 0, p_θ > p_μ, D > 0.05 → dropped; (2,1) has Â < 0, p_θ < p_μ, D > 0.05 →
    # dropped; the rest kept — the same tokens as TV at 0.2, so the same j.
    terms, lp = f1()
    j, grad, diag = run("dppo_kl", terms, lp)
    want = torch.tensor([[-1.24, 0.0, -1.0], [0.0, 0.28 / 0.30, 0.0]])
    torch.testing.assert_close(j, want)
    torch.testing.assert_close(grad, want)
    assert diag["ratio/rho/clipped_frac"].item() == pytest.approx(0.4)
    # Near p = 1 the two part: p_ref = 0.9 → p_θ = 0.99 is a TV gap of 0.09 (< 0.2, kept) but a
    # binary KL of 0.144479 (> 0.05, dropped) for Â > 0; with Â < 0 the move (upwards) is not in
    # the advantage's direction and neither drops it.
    lp1, ref = torch.tensor([[math.log(0.99)] * 2]), torch.tensor([[math.log(0.9)] * 2])
    adv = torch.tensor([[1.0, -1.0]])
    kl_high, kl_low = dppo_kl_dropped(lp1, ref, adv, delta_low=0.05, delta_high=0.05)
    tv_high, tv_low = dppo_tv_dropped(lp1, ref, adv, delta_low=0.2, delta_high=0.2)
    assert kl_high.tolist() == [[True, False]] and not kl_low.any()
    assert not tv_high.any() and not tv_low.any()


def test_dppo_drops_only_in_the_direction_of_the_advantage() -> None:
    # Δ = +0.4 with Â < 0, Δ = −0.4 with Â > 0: the update moves away from where Â pushes, so
    # neither is dropped (gradient −Â·r survives); the mirrored tokens are dropped.
    p_ref = torch.tensor([[0.3, 0.7, 0.3, 0.7]])
    p_th = torch.tensor([[0.7, 0.3, 0.7, 0.3]])
    adv = torch.tensor([[-1.0, 1.0, 1.0, -1.0]])
    for dropped in (dppo_tv_dropped, dppo_kl_dropped):
        high, low = dropped(p_th.log(), p_ref.log(), adv, delta_low=0.2, delta_high=0.2)
        assert (high | low).tolist() == [[False, False, True, True]], dropped.__name__
        # Â = 0 has no policy gradient to drop: nothing is dropped (SkyRL; prime-rl and verl
        # apply the low test, which changes only the dropped fraction)
        high, low = dropped(
            p_th.log(), p_ref.log(), torch.zeros(1, 4), delta_low=0.2, delta_high=0.2
        )
        assert not (high | low).any(), dropped.__name__


# ---------------------------------------------------------------- dppo: reference and properties


def test_dppo_reference_is_the_modes_pi_old() -> None:
    # decoupled, first optimiser step: π_old = π_θ, so Δ = 0 and r = 1 whatever μ is: nothing
    # dropped, j = −Â and ∂j/∂log π_θ = −Â (the on-policy gradient). Bypass on the same tensors
    # compares with μ and drops (1,2), (2,1) as above.
    for name in ("dppo_tv", "dppo_kl"):
        terms, lp = f1("decoupled")
        j, grad, diag = run(name, terms, lp)
        on_mask = torch.tensor(MASK)
        want = torch.where(on_mask, -torch.tensor(ADV), 0.0)
        torch.testing.assert_close(j, want)
        torch.testing.assert_close(grad, want)
        assert diag["ratio/rho/clipped_frac"].item() == 0.0
        terms, lp = f1("bypass")
        assert run(name, terms, lp)[2]["ratio/rho/clipped_frac"].item() == pytest.approx(0.4)


def ref_dppo(
    p_th: float, p_ref: float, a: float, kind: str, lo: float, hi: float, tau: float
) -> tuple[float, float]:
    """(j, ∂j/∂log π_θ) of one token, written out."""
    gap = p_th - p_ref
    kl = p_ref * math.log(p_ref / p_th) + (1 - p_ref) * math.log((1 - p_ref) / (1 - p_th))
    if kind == "tv":
        dropped = (a > 0 and gap > hi) or (a < 0 and gap < -lo)
    else:
        dropped = (a > 0 and gap > 0 and kl > hi) or (a < 0 and gap < 0 and kl > lo)
    r, log_r = p_th / p_ref, math.log(p_th / p_ref)
    j = (0.0 if dropped else -r * a) + tau * log_r**2
    g = (0.0 if dropped else -r * a) + 2 * tau * log_r
    return j, g


@pytest.mark.parametrize("mode", ["decoupled", "bypass"])
@pytest.mark.parametrize(
    ("name", "kind", "delta"), [("dppo_tv", "tv", 0.1), ("dppo_kl", "kl", 0.02)]
)
def test_dppo_reference_loop(mode: RatioMode, name: str, kind: str, delta: float) -> None:
    terms, lp = random_terms(11, mode)
    fields = {f"{name}_low": delta, f"{name}_high": 1.5 * delta, "dppo_tau": 0.01}
    j, grad, _ = run(name, terms, lp, **fields)
    p_th, p_ref = terms.logprobs.detach().exp(), terms.old_logprobs.exp()
    for i in range(4):
        for t in range(6):
            if not terms.mask[i, t]:
                assert j[i, t].item() == 0.0 and grad[i, t].item() == 0.0
                continue
            want_j, want_g = ref_dppo(
                float(p_th[i, t]),
                float(p_ref[i, t]),
                float(terms.advantages[i, t]),
                kind,
                delta,
                1.5 * delta,
                0.01,
            )
            assert j[i, t].item() == pytest.approx(want_j, rel=1e-5, abs=1e-6)
            assert grad[i, t].item() == pytest.approx(want_g, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dppo_with_nothing_dropped_is_the_unclipped_surrogate(seed: int) -> None:
    # δ_TV = 1 can never be passed (|Δ| < 1); with τ = 0 dppo_tv is −r·Â, ppo_clip without a
    # clip (ε = 1e9), value and gradient, and its gradient −Â·r is the importance-weighted
    # policy gradient.
    terms, lp = random_terms(seed, "bypass")
    j, grad, diag = run("dppo_tv", terms, lp, dppo_tv_low=1.0, dppo_tv_high=1.0)
    assert diag["ratio/rho/clipped_frac"].item() == 0.0
    lp2 = lp.detach().clone().requires_grad_(True)
    log_r = lp2 - terms.old_logprobs
    surrogate = ppo_clip_loss(log_r, terms.advantages, clip_low=1e9, clip_high=1e9)
    surrogate = torch.where(terms.mask, surrogate, 0.0)
    (g2,) = torch.autograd.grad(surrogate.sum(), lp2)
    torch.testing.assert_close(j, surrogate.detach())
    torch.testing.assert_close(grad, g2)
    r = log_r.detach().exp()
    torch.testing.assert_close(grad, torch.where(terms.mask, -terms.advantages * r, 0.0))


def test_dppo_loss_zero_advantage_pays_only_the_penalty() -> None:
    # Â = 0: no policy gradient, dropped or not; τ·(log r)² = 0.1·(log 2)² = 0.1·0.480453 = 0.048045
    log_r = torch.tensor([[math.log(2.0), math.log(2.0)]])
    j = dppo_loss(log_r, torch.zeros(1, 2), torch.tensor([[True, False]]), tau=0.1)
    torch.testing.assert_close(j, torch.full((1, 2), 0.048045), atol=1e-6, rtol=0)


# ---------------------------------------------------------------- dro


def test_dro_hand_case_f1() -> None:
    # β = 0.05, j = −Â·ln p_θ + 0.025·(log d)²:
    #   (1,1) −ln 0.62 = 0.478036 + 0.025·0.046273 = 0.001157 → 0.479193
    #   (1,2) −ln 0.45 = 0.798508 + 0.025·0.657608 = 0.016440 → 0.814948
    #   (1,3) −ln 0.90 = 0.105361 + 0                            → 0.105361
    #   (2,1) +ln 0.25 = −1.386294 + 0.025·0.480453 = 0.012011 → −1.374283
    #   (2,2) +ln 0.28 = −1.272966 + 0.025·0.004760 = 0.000119 → −1.272847
    # Σ = −1.247628 (Tinker's sum), /5 = −0.249526 (verl's token-mean)
    # ∂j/∂log π_θ = −Â + β·log d: −1 + 0.05·0.215111 = −0.989244, −1 + 0.040547 = −0.959453,
    #   −1, 1 − 0.034657 = 0.965343, 1 − 0.003450 = 0.996550
    terms, lp = f1()
    j, grad, _ = run("dro", terms, lp)
    torch.testing.assert_close(
        j,
        torch.tensor([[0.479193, 0.814948, 0.105361], [-1.374283, -1.272847, 0.0]]),
        atol=2e-6,
        rtol=0,
    )
    assert j.sum().item() == pytest.approx(-1.247628, abs=1e-5)
    torch.testing.assert_close(
        grad,
        torch.tensor([[-0.989244, -0.959453, -1.0], [0.965343, 0.996550, 0.0]]),
        atol=2e-6,
        rtol=0,
    )


@pytest.mark.parametrize("mode", ["decoupled", "bypass"])
def test_dro_reference_loop(mode: RatioMode) -> None:
    terms, lp = random_terms(12, mode)
    j, grad, _ = run("dro", terms, lp, dro_beta=0.3)
    for i in range(4):
        for t in range(6):
            if not terms.mask[i, t]:
                assert j[i, t].item() == 0.0 and grad[i, t].item() == 0.0
                continue
            a, logp = float(terms.advantages[i, t]), float(terms.logprobs.detach()[i, t])
            log_r = logp - float(terms.old_logprobs[i, t])
            assert j[i, t].item() == pytest.approx(-a * logp + 0.15 * log_r**2, rel=1e-5)
            assert grad[i, t].item() == pytest.approx(-a + 0.3 * log_r, rel=1e-5, abs=1e-6)


def test_dro_is_pg_at_r_one_and_pulls_back_beyond() -> None:
    # decoupled, first step: r ≡ 1, the penalty and its gradient vanish: dro = pg exactly
    terms, lp = f1("decoupled")
    j_dro, g_dro, _ = run("dro", terms, lp)
    j_pg, g_pg, _ = run("pg", terms, lp)
    torch.testing.assert_close(j_dro, j_pg)
    torch.testing.assert_close(g_dro, g_pg)
    # bypass: the gradient differs from pg's by β·log r, towards the reference on either side
    terms, lp = f1("bypass")
    _, g_dro, _ = run("dro", terms, lp, dro_beta=0.2)
    _, g_pg, _ = run("pg", terms, lp)
    log_d = torch.where(terms.mask, terms.logprobs.detach() - terms.behavior_logprobs, 0.0)
    torch.testing.assert_close(g_dro - g_pg, 0.2 * log_d)


# ---------------------------------------------------------------- gmpo


def test_gmpo_hand_case_f1() -> None:
    # ε = 0.4 in log space. Row 1 (Â = +1): ℓ = (0.215111, 0.810930, 0), min(ℓ, 0.4) =
    #   (0.215111, 0.4, 0), mean 0.615111/3 = 0.205037, s_1 = e^0.205037 = 1.227571
    # Row 2 (Â = −1): ℓ = (−0.693147, −0.068993), max(ℓ, −0.4) = (−0.4, −0.068993),
    #   mean −0.468993/2 = −0.234496, s_2 = e^−0.234496 = 0.790969
    # j_1 = −1.227571 on 3 tokens, j_2 = +0.790969 on 2; response_mean = (−1.227571 +
    #   0.790969)/2 = −0.218301 (note: −0.2183)
    # ∂loss/∂log π_θ = (1/B)·(−Â_i)·s_i/|o_i| where not clipped: row 1 −1.227571/6 = −0.204595
    #   at (1,1), (1,3), 0 at the clipped (1,2); row 2 0 at the clipped (2,1), 0.790969/4 =
    #   0.197742 at (2,2)
    terms, lp = f1()
    j, diag = registry.get("gmpo").fn(terms, BehaviourParams(objective="gmpo", mode="bypass"))
    loss = response_mean(j, terms.mask)
    (grad,) = torch.autograd.grad(loss, lp)
    s1, s2 = 1.227571, 0.790969
    torch.testing.assert_close(
        j.detach(), torch.tensor([[-s1] * 3, [s2, s2, 0.0]]), atol=2e-6, rtol=0
    )
    assert loss.item() == pytest.approx(-0.218301, abs=1e-6)
    want = torch.tensor([[-0.204595, 0.0, -0.204595], [0.0, 0.197742, 0.0]])
    torch.testing.assert_close(grad, want, atol=2e-6, rtol=0)
    # clipped: (1,2) high (Â > 0, ℓ > 0.4), (2,1) low (Â < 0, ℓ < −0.4): 1/5 each
    assert diag["ratio/rho/clipped_high_frac"].item() == pytest.approx(0.2)
    assert diag["ratio/rho/clipped_low_frac"].item() == pytest.approx(0.2)


def ref_gmpo(log_r: list[float], a: float, lo: float, hi: float) -> float:
    clipped = [min(x, hi) if a > 0 else max(x, -lo) for x in log_r]
    return -a * math.exp(sum(clipped) / len(clipped))


@pytest.mark.parametrize("mode", ["decoupled", "bypass"])
def test_gmpo_reference_loop(mode: RatioMode) -> None:
    terms, lp = random_terms(13, mode, b=5, t=7)
    p = BehaviourParams(objective="gmpo", mode=mode, gmpo_clip_low=0.2, gmpo_clip_high=0.3)
    j, _ = registry.get("gmpo").fn(terms, p)
    loss = response_mean(j, terms.mask)
    (grad,) = torch.autograd.grad(loss, lp)
    log_r = (terms.logprobs - terms.old_logprobs).detach()
    for i in range(5):
        toks = [t for t in range(7) if terms.mask[i, t]]
        a = float(terms.advantages[i, 0])
        want = ref_gmpo([float(log_r[i, t]) for t in toks], a, 0.2, 0.3)
        for t in range(7):
            if t not in toks:
                assert j[i, t].item() == 0.0 and grad[i, t].item() == 0.0
                continue
            assert j[i, t].item() == pytest.approx(want, rel=1e-5)
            x = float(log_r[i, t])
            held = (a > 0 and x > 0.3) or (a < 0 and x < -0.2)
            # ∂/∂log π_θ(t) of (1/B)·j_i = (1/B)·(−Â_i)·s_i/|o_i|, or 0 where the clip holds
            want_g = 0.0 if held else want / (5 * len(toks))
            assert grad[i, t].item() == pytest.approx(want_g, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("seed", [0, 1])
def test_gmpo_without_clip_is_gspo_without_clip_and_pg_at_r_one(seed: int) -> None:
    # Unclipped, both are −Â_i·exp(mean_t log r): the same sequence ratio.
    terms, _ = random_terms(seed, "bypass")
    log_r, adv, mask = terms.log_rho.detach(), terms.advantages, terms.mask
    torch.testing.assert_close(
        gmpo_loss(log_r, adv, mask, clip_low=1e9, clip_high=1e9),
        gspo_loss(log_r, adv, mask, clip_low=1e9, clip_high=1e9),
    )
    # At r = 1 (decoupled, first step) its response_mean gradient is pg's: −Â_i/(B·|o_i|)
    terms, lp = random_terms(seed, "decoupled")
    terms = PolicyTerms(lp, lp.detach().clone(), terms.behavior_logprobs, terms.advantages, mask)
    grads = []
    for name in ("gmpo", "pg"):
        j, _ = registry.get(name).fn(terms, BehaviourParams(objective=name))
        grads.append(torch.autograd.grad(response_mean(j, mask), lp)[0])
    torch.testing.assert_close(grads[0], grads[1])


def test_gmpo_clips_by_the_sequence_advantage() -> None:
    # One row, Â = (3, −1) → Â_i = 1 > 0, so both tokens take the min branch (ε = 0.4):
    # ℓ = (0.5, −0.5) → ℓ̃ = (0.4, −0.5), mean −0.05, s = e^−0.05 = 0.951229, j = −0.951229.
    # (verl clips by each token's sign: ℓ̃ = (0.4, −0.4), s = 1, j = −1.)
    j = gmpo_loss(
        torch.tensor([[0.5, -0.5]]),
        torch.tensor([[3.0, -1.0]]),
        torch.ones(1, 2, dtype=torch.bool),
        clip_low=0.4,
        clip_high=0.4,
    )
    torch.testing.assert_close(j, torch.full((1, 2), -0.951229), atol=1e-6, rtol=0)


def test_gmpo_empty_row_counts_in_b() -> None:
    # Rows 1-2 of F1 and a third row with |o| = 0: it adds 0 and B = 3, so the response mean is
    # (−1.227571 + 0.790969 + 0)/3 = −0.145534 (verl: torch.mean over the 3 rows; TRL: .mean())
    terms, _ = f1()
    pad = torch.full((1, 3), -1.0)
    three = PolicyTerms(
        torch.cat([terms.logprobs, pad]),
        torch.cat([terms.old_logprobs, pad - 5.0]),
        torch.cat([terms.behavior_logprobs, pad - 5.0]),
        torch.cat([terms.advantages, -pad]),
        torch.cat([terms.mask, torch.zeros(1, 3, dtype=torch.bool)]),
    )
    j, _ = registry.get("gmpo").fn(three, BehaviourParams(objective="gmpo", mode="bypass"))
    assert j[2].abs().sum().item() == 0.0
    assert response_mean(j, three.mask).item() == pytest.approx(-0.145534, abs=1e-6)


def test_gmpo_is_sequence_level_so_token_corrections_are_refused() -> None:
    p = BehaviourParams(objective="gmpo", corrections=("icepop",))
    with pytest.raises(ConfigError, match=r"^behaviour.corrections: 'icepop' .*'gmpo'"):
        check_behaviour(p, KLParams())
    check_behaviour(BehaviourParams(objective="gmpo", corrections=("masked_is",)), KLParams())
    check_behaviour(BehaviourParams(objective="dppo_tv", corrections=("icepop",)), KLParams())


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("dppo_tv_low", -0.1, "must be in [0, 1]"),
        ("dppo_tv_high", 1.5, "must be in [0, 1]"),
        ("dppo_kl_low", -0.01, "must be >= 0"),
        ("dppo_kl_high", float("nan"), "must be >= 0"),
        ("dppo_tau", -1e-3, "must be >= 0"),
        ("gmpo_clip_low", -0.4, "must be >= 0"),
        ("gmpo_clip_high", float("nan"), "must be >= 0"),
        ("dro_beta", 0.0, "must be > 0"),
    ],
)
def test_out_of_range_values_name_their_field(field: str, value: float, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_behaviour(BehaviourParams(**{field: value}), KLParams())
    message = str(info.value)
    assert message.startswith(f"behaviour.{field}: {words}") and "\n" not in message, message


def test_config_path_refuses_them_too() -> None:
    with pytest.raises(ConfigError, match=r"^behaviour.dro_beta: must be > 0"):
        build_config("grpo", None, ["behaviour.objective=dro", "behaviour.dro_beta=0"])
    cfg = build_config("grpo", None, ["behaviour.objective=dppo_kl", "behaviour.dppo_tau=1e-3"])
    assert (cfg.behaviour.objective, cfg.behaviour.dppo_tau) == ("dppo_kl", 1e-3)


# ---------------------------------------------------------------- against verl, where installed


def verl_core() -> Any:
    """verl.trainer.ppo.core_algos (verl 0.9.1 defines dppo_tv, dppo_kl, dro and geo_mean)."""
    core = anchor("verl.trainer.ppo.core_algos")
    if not hasattr(core, "compute_policy_loss_dro"):
        pytest.skip("this verl has no compute_policy_loss_dro (added in verl PR #7245)")
    return core


def verl_config(**fields: Any) -> Any:
    from verl.workers.config import ActorConfig, PolicyLossConfig  # type: ignore[import-not-found]

    beta = fields.pop("dro_beta", None)
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        policy_loss=PolicyLossConfig(dro_beta=beta),
        **fields,
    )


def verl_grad(fn: Any, terms: PolicyTerms, config: Any, agg: str) -> tuple[Tensor, Tensor]:
    """verl's loss on rlmap's tensors (its old_log_prob = rlmap's π_old) and its gradient."""
    lp = terms.logprobs.detach().clone().requires_grad_(True)
    loss, _ = fn(terms.old_logprobs, lp, terms.advantages, terms.mask.float(), agg, config)
    (grad,) = torch.autograd.grad(loss, lp)
    return loss.detach(), grad


@pytest.mark.parametrize(("name", "kind"), [("dppo_tv", "tv"), ("dppo_kl", "kl")])
def test_dppo_gradient_matches_verl(name: str, kind: str) -> None:
    # verl's j = −M·Â·sg(min(r, C))·log π_θ has rlmap's gradient wherever r < C (C = 1e4 here, as
    # in its DPPO example); the values differ by design (docs/formulas.md §3), so the per-token
    # gradients (token-sum) and the dropped fraction are compared.
    core = verl_core()
    terms, lp = random_terms(21, "bypass", b=6, t=8)
    _, grad, diag = run(name, terms, lp, **{f"{name}_low": 0.05, f"{name}_high": 0.08})
    config = verl_config(clip_ratio_low=0.05, clip_ratio_high=0.08, clip_ratio_c=1e4)
    fn = getattr(core, f"compute_policy_loss_dppo_{kind}")
    _, g_verl = verl_grad(fn, terms, config, "token-sum")
    torch.testing.assert_close(grad, torch.where(terms.mask, g_verl, 0.0), rtol=1e-5, atol=1e-6)
    lp2 = terms.logprobs.detach().clone().requires_grad_(True)
    _, metrics = fn(
        terms.old_logprobs, lp2, terms.advantages, terms.mask.float(), "token-sum", config
    )
    assert metrics["actor/pg_clipfrac"] == pytest.approx(diag["ratio/rho/clipped_frac"].item())
    assert 0 < diag["ratio/rho/clipped_frac"].item() < 1  # the case exercises the mask


def test_dro_loss_and_gradient_match_verl() -> None:
    core = verl_core()
    terms, lp = random_terms(22, "decoupled", b=5, t=7)
    j, grad, _ = run("dro", terms, lp, dro_beta=0.3)
    config = verl_config(dro_beta=0.3)
    fn = core.compute_policy_loss_dro
    loss, g_verl = verl_grad(fn, terms, config, "token-sum")
    torch.testing.assert_close(grad, torch.where(terms.mask, g_verl, 0.0), rtol=1e-5, atol=1e-6)
    assert loss.item() == pytest.approx(j.sum().item(), rel=1e-5)
    for i in range(5):  # per token: verl on a one-token mask
        for t in range(7):
            if terms.mask[i, t]:
                one = torch.zeros(5, 7)
                one[i, t] = 1.0
                lp_it = terms.logprobs.detach()
                value, _ = fn(terms.old_logprobs, lp_it, terms.advantages, one, "token-sum", config)
                assert j[i, t].item() == pytest.approx(value.item(), rel=1e-5, abs=1e-7)


def test_gmpo_sequence_loss_and_gradient_match_verl() -> None:
    # verl's geo_mean is (1/B) Σ_i j_i whatever loss_agg_mode: rlmap's gmpo under response_mean.
    # One Â per row (outcome advantages), where verl's per-token sign equals the row's; the
    # last row is empty and still counts in B.
    core = verl_core()
    terms, lp = random_terms(23, "bypass", b=5, t=7)
    mask = terms.mask.clone()
    mask[-1] = False
    terms = PolicyTerms(lp, terms.old_logprobs, terms.behavior_logprobs, terms.advantages, mask)
    p = BehaviourParams(objective="gmpo", mode="bypass", gmpo_clip_low=0.2, gmpo_clip_high=0.3)
    j, _ = registry.get("gmpo").fn(terms, p)
    loss = response_mean(j, mask)
    (grad,) = torch.autograd.grad(loss, lp)
    config = verl_config(clip_ratio_low=0.2, clip_ratio_high=0.3)
    fn = core.compute_policy_loss_geo_mean
    v_loss, g_verl = verl_grad(fn, terms, config, "token-mean")
    assert loss.item() == pytest.approx(v_loss.item(), rel=1e-5)
    torch.testing.assert_close(grad, g_verl, rtol=1e-5, atol=1e-7)
    for i in range(4):  # per sequence: verl on one row (B = 1)
        row = PolicyTerms(
            lp[i : i + 1].detach(),
            terms.old_logprobs[i : i + 1],
            terms.behavior_logprobs[i : i + 1],
            terms.advantages[i : i + 1],
            mask[i : i + 1],
        )
        v_row, _ = verl_grad(fn, row, config, "token-mean")
        assert j[i, 0].item() == pytest.approx(v_row.item(), rel=1e-5)
