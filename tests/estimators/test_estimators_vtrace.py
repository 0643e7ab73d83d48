"""V-trace: hand cases, the paper's explicit-sum form as reference, and the on-policy limit."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from rlmap.core.batch import End, make_batch
from rlmap.estimators import CreditParams, gae, registry, turn_vtrace, vtrace


def _one(
    log_ratio: list[float],
    rewards: list[float],
    values: list[float],
    *,
    truncated: bool = False,
    bootstrap: float = 0.0,
    gamma: float = 0.9,
) -> tuple[torch.Tensor, torch.Tensor]:
    lp = torch.tensor([log_ratio])
    return vtrace(
        torch.tensor([rewards]),
        torch.tensor([values]),
        torch.ones(1, len(rewards), dtype=torch.bool),
        lp,
        torch.zeros_like(lp),
        bootstrap_B=torch.tensor([bootstrap]),
        truncated_B=torch.tensor([truncated]),
        gamma=gamma,
    )


def test_hand_case_terminal() -> None:
    # π/μ = (2, 0.5), ρ̄ = c̄ = ρ̄_pg = 1 → ρ = c = ρ_pg = (1, 0.5); r = (0, 1); V = (0.4, 0.6);
    # γ = 0.9; terminal, so V_2 = v_2 = 0.
    # s = 1: δ_1 = 0.5·(1 + 0 − 0.6) = 0.2;  v_1 = 0.6 + 0.2 + 0 = 0.8
    #        adv_1 = 0.5·(1 + 0 − 0.6) = 0.2
    # s = 0: δ_0 = 1·(0 + 0.9·0.6 − 0.4) = 0.14;  v_0 = 0.4 + 0.14 + 0.9·1·(0.8 − 0.6) = 0.72
    #        adv_0 = 1·(0 + 0.9·0.8 − 0.4) = 0.32
    adv, vs = _one([math.log(2.0), math.log(0.5)], [0.0, 1.0], [0.4, 0.6])
    torch.testing.assert_close(vs, torch.tensor([[0.72, 0.8]]))
    torch.testing.assert_close(adv, torch.tensor([[0.32, 0.2]]))


def test_hand_case_truncated_bootstraps() -> None:
    # As above but truncated with V(s_final) = 1: V_2 = v_2 = 1.
    # s = 1: δ_1 = 0.5·(1 + 0.9·1 − 0.6) = 0.65; v_1 = 0.6 + 0.65 + 0.9·0.5·(1 − 1) = 1.25
    #        adv_1 = 0.5·(1 + 0.9·1 − 0.6) = 0.65
    # s = 0: δ_0 = 0.14; v_0 = 0.4 + 0.14 + 0.9·(1.25 − 0.6) = 1.125
    #        adv_0 = 0.9·1.25 − 0.4 = 0.725
    adv, vs = _one(
        [math.log(2.0), math.log(0.5)], [0.0, 1.0], [0.4, 0.6], truncated=True, bootstrap=1.0
    )
    torch.testing.assert_close(vs, torch.tensor([[1.125, 1.25]]))
    torch.testing.assert_close(adv, torch.tensor([[0.725, 0.65]]))


def test_log_ratio_is_clamped_to_20() -> None:
    # log π − log μ = 1000 would overflow; clamped to 20, and min(ρ̄ = 1e12, e^20) = e^20.
    lp = torch.tensor([[1000.0]])
    adv, _ = vtrace(
        torch.tensor([[1.0]]),
        torch.tensor([[0.0]]),
        torch.ones(1, 1, dtype=torch.bool),
        lp,
        torch.zeros_like(lp),
        bootstrap_B=torch.zeros(1),
        truncated_B=torch.zeros(1, dtype=torch.bool),
        gamma=1.0,
        rho_bar=1e12,
        c_bar=1.0,
        rho_bar_pg=1e12,
    )
    torch.testing.assert_close(adv, torch.tensor([[math.exp(20.0)]]))


def reference_vtrace(
    rewards: list[list[float]],
    values: list[list[float]],
    mask: list[list[bool]],
    log_ratio: list[list[float]],
    truncated: list[bool],
    bootstrap: list[float],
    gamma: float,
    rb: float,
    cb: float,
    rpg: float,
) -> tuple[list[list[float]], list[list[float]]]:
    """Espeholt et al. eq. (1): v_s = V_s + Σ_{t≥s} γ^{t−s} (Π_{i=s}^{t−1} c_i) δ_t."""
    adv_out, vs_out = [], []
    for i in range(len(rewards)):
        steps = [t for t in range(len(rewards[i])) if mask[i][t]]
        n = len(steps)
        ratio = [math.exp(max(-20.0, min(20.0, log_ratio[i][t]))) for t in steps]
        r = [rewards[i][t] for t in steps]
        v = [values[i][t] for t in steps]
        end_v = bootstrap[i] if truncated[i] else 0.0
        v_next = [*v[1:], end_v]
        delta = [min(rb, ratio[k]) * (r[k] + gamma * v_next[k] - v[k]) for k in range(n)]
        vs = []
        for s in range(n):
            total, trace = 0.0, 1.0
            for t in range(s, n):
                total += gamma ** (t - s) * trace * delta[t]
                trace *= min(cb, ratio[t])
            vs.append(v[s] + total)
        vs_next = [*vs[1:], end_v]
        adv = [min(rpg, ratio[k]) * (r[k] + gamma * vs_next[k] - v[k]) for k in range(n)]
        row_adv, row_vs = [0.0] * len(rewards[i]), [0.0] * len(rewards[i])
        for k, t in enumerate(steps):
            row_adv[t], row_vs[t] = adv[k], vs[k]
        adv_out.append(row_adv)
        vs_out.append(row_vs)
    return adv_out, vs_out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("rb", "cb", "rpg"), [(1.0, 1.0, 1.0), (2.0, 0.9, 1.5)])
def test_matches_reference_loop(seed: int, rb: float, cb: float, rpg: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    b, t, gamma = 4, 8, 0.95
    mask = torch.rand(b, t, generator=gen) < 0.6
    rewards, values = torch.randn(b, t, generator=gen), torch.randn(b, t, generator=gen)
    pi, mu = 0.5 * torch.randn(b, t, generator=gen), 0.5 * torch.randn(b, t, generator=gen)
    truncated, boot = torch.rand(b, generator=gen) < 0.5, torch.randn(b, generator=gen)
    adv, vs = vtrace(
        rewards,
        values,
        mask,
        pi,
        mu,
        bootstrap_B=boot,
        truncated_B=truncated,
        gamma=gamma,
        rho_bar=rb,
        c_bar=cb,
        rho_bar_pg=rpg,
    )
    want_adv, want_vs = reference_vtrace(
        rewards.tolist(),
        values.tolist(),
        mask.tolist(),
        (pi - mu).tolist(),
        truncated.tolist(),
        boot.tolist(),
        gamma,
        rb,
        cb,
        rpg,
    )
    torch.testing.assert_close(adv, torch.tensor(want_adv), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vs, torch.tensor(want_vs), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_on_policy_equals_gae_lambda_one(seed: int) -> None:
    """π = μ, ρ̄ = c̄ = 1: v_s is the λ = 1 return and adv_s = r_s + γ v_{s+1} − V_s."""
    gen = torch.Generator().manual_seed(seed)
    b, t, gamma = 4, 8, 0.9
    mask = torch.rand(b, t, generator=gen) < 0.7
    rewards, values = torch.randn(b, t, generator=gen), torch.randn(b, t, generator=gen)
    logp = torch.randn(b, t, generator=gen)
    truncated, boot = torch.rand(b, generator=gen) < 0.5, torch.randn(b, generator=gen)
    kw: dict[str, Any] = dict(bootstrap_B=boot, truncated_B=truncated, gamma=gamma)
    adv, vs = vtrace(rewards, values, mask, logp, logp, **kw)
    _, gae_returns = gae(rewards, values, mask, lam_policy=1.0, lam_critic=1.0, **kw)
    torch.testing.assert_close(vs, gae_returns)
    for i in range(b):
        steps = mask[i].nonzero().flatten().tolist()
        end_v = float(boot[i]) if bool(truncated[i]) else 0.0
        for k, s in enumerate(steps):
            v_next = float(vs[i, steps[k + 1]]) if k + 1 < len(steps) else end_v
            want = float(rewards[i, s]) + gamma * v_next - float(values[i, s])
            assert float(adv[i, s]) == pytest.approx(want, abs=1e-5)


def test_registry_entry_uses_old_logprobs_as_pi_and_bypass_falls_back_to_mu() -> None:
    # One token, r = 1, V = 0, π/μ = e^{−1} < 1: adv = e^{−1}·(1 − 0); v = 0 + e^{−1}·1.
    base = dict(values=torch.tensor([[0.0]]), behavior_logprobs=torch.tensor([[0.0]]))
    batch = make_batch(torch.tensor([[1]]), torch.tensor([1.0]), **base)
    params = CreditParams(estimator="vtrace", gamma=1.0)
    decoupled = registry.get("vtrace").fn(
        batch.replace(old_logprobs=torch.tensor([[-1.0]])), params
    )
    torch.testing.assert_close(decoupled.advantages, torch.tensor([[math.exp(-1.0)]]))
    assert decoupled.returns is not None
    torch.testing.assert_close(decoupled.returns, torch.tensor([[math.exp(-1.0)]]))
    bypass = registry.get("vtrace").fn(batch, params)  # π_old := μ, ratio 1
    torch.testing.assert_close(bypass.advantages, torch.tensor([[1.0]]))


def test_turn_vtrace_hand_case() -> None:
    # [a, a, O, a]: turn 0 = tokens 0, 1; turn 1 = token 3. γ = 1, terminal.
    # Turn log-ratios: (0.1 + (−0.1)) = 0 → ratio 1; turn 1: log 0.5 → ratio 0.5.
    # Turn rewards: 0 + 0 = 0, 1. Turn values (first token): 0.2, 0.5.
    # Turn 1: δ = 0.5·(1 − 0.5) = 0.25; v_1 = 0.5 + 0.25 = 0.75; adv_1 = 0.5·(1 − 0.5) = 0.25
    # Turn 0: δ = 1·(0 + 0.5 − 0.2) = 0.3; v_0 = 0.2 + 0.3 + 1·(0.75 − 0.5) = 0.75
    #         adv_0 = 0 + 0.75 − 0.2 = 0.55
    mask = torch.tensor([[1, 1, 0, 1]], dtype=torch.bool)
    adv, vs = turn_vtrace(
        torch.tensor([[0.0, 0.0, 7.0, 1.0]]),
        torch.tensor([[0.2, 9.0, 9.0, 0.5]]),
        mask,
        torch.tensor([[0, 0, -1, 1]]),
        torch.tensor([[0.1, -0.1, 3.0, math.log(0.5)]]),
        torch.zeros(1, 4),
        bootstrap_B=torch.zeros(1),
        truncated_B=torch.zeros(1, dtype=torch.bool),
        gamma=1.0,
    )
    torch.testing.assert_close(adv, torch.tensor([[0.55, 0.55, 0.0, 0.25]]))
    torch.testing.assert_close(vs, torch.tensor([[0.75, 0.75, 0.0, 0.75]]))


def test_observation_tokens_are_skipped() -> None:
    gen = torch.Generator().manual_seed(1)
    r, v, lp = (torch.randn(1, 3, generator=gen) for _ in range(3))
    kw: dict[str, Any] = dict(
        bootstrap_B=torch.tensor([0.3]), truncated_B=torch.tensor([True]), gamma=0.9
    )
    plain = vtrace(r, v, torch.ones(1, 3, dtype=torch.bool), lp, torch.zeros(1, 3), **kw)
    pos = [0, 3, 4]  # actions at 0, 3, 4; observations (garbage) at 1, 2
    mask = torch.zeros(1, 6, dtype=torch.bool)
    mask[0, pos] = True
    long = [torch.full((1, 6), float("nan")) for _ in range(3)]
    for src, dst in zip((r, v, lp), long, strict=True):
        dst[0, pos] = src[0]
    spread = vtrace(long[0], long[1], mask, long[2], torch.zeros(1, 6), **kw)
    for a, b in zip(plain, spread, strict=True):
        torch.testing.assert_close(b[0, pos], a[0])


def test_terminal_ignores_bootstrap_value() -> None:
    batch = make_batch(
        torch.tensor([[1, 1], [1, 1]]),
        torch.tensor([1.0, 1.0]),
        end=torch.tensor([int(End.TERMINAL), int(End.TRUNCATED)]),
        values=torch.zeros(2, 2),
        bootstrap_values=torch.tensor([100.0, 100.0]),
    )
    credit = registry.get("vtrace").fn(batch, CreditParams(estimator="vtrace", gamma=1.0))
    # Terminal: v = Monte-Carlo = 1 on both tokens. Truncated: v = 1 + 100 = 101.
    assert credit.returns is not None
    torch.testing.assert_close(credit.returns, torch.tensor([[1.0, 1.0], [101.0, 101.0]]))
