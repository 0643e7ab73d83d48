"""GAE: hand cases, an independent reference (the Σ (γλ)^l δ form), and invariances."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmap.core.batch import Batch, End, make_batch
from rlmap.estimators import CreditParams, adaptive_lambda, gae, gae_advantages, registry, turn_gae

NAN = float("nan")


def _run(
    rewards: list[float],
    values: list[float],
    mask: list[int],
    *,
    truncated: bool = False,
    bootstrap: float = 0.0,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> torch.Tensor:
    return gae_advantages(
        torch.tensor([rewards]),
        torch.tensor([values]),
        torch.tensor([mask], dtype=torch.bool),
        bootstrap_B=torch.tensor([bootstrap]),
        truncated_B=torch.tensor([truncated]),
        gamma=gamma,
        lam=lam,
    )[0]


def test_hand_case_terminal() -> None:
    # [prompt, a, a, a, pad]; r = (0, 0, 1), V = (0.5, 0.6, 0.8), γ = 0.9, λ = 0.5, terminal.
    # δ_2 = 1 − 0.8 = 0.2                     (terminal: no bootstrap)
    # δ_1 = 0 + 0.9·0.8 − 0.6 = 0.12
    # δ_0 = 0 + 0.9·0.6 − 0.5 = 0.04
    # Â_2 = 0.2; Â_1 = 0.12 + 0.45·0.2 = 0.21; Â_0 = 0.04 + 0.45·0.21 = 0.1345
    adv = _run(
        [9.0, 0.0, 0.0, 1.0, 9.0], [9.0, 0.5, 0.6, 0.8, 9.0], [0, 1, 1, 1, 0], gamma=0.9, lam=0.5
    )
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.1345, 0.21, 0.2, 0.0]))


def test_truncated_bootstraps_from_final_value_terminal_does_not() -> None:
    # Same trajectory truncated with V(s_final) = 0.5:
    # δ_2 = 1 + 0.9·0.5 − 0.8 = 0.65, Â_2 = 0.65          (c = 0: nothing after it)
    # Â_1 = 0.12 + 0.45·0.65 = 0.4125; Â_0 = 0.04 + 0.45·0.4125 = 0.225625
    args = ([0.0, 0.0, 1.0], [0.5, 0.6, 0.8], [1, 1, 1])
    truncated = _run(*args, truncated=True, bootstrap=0.5, gamma=0.9, lam=0.5)
    torch.testing.assert_close(truncated, torch.tensor([0.225625, 0.4125, 0.65]))
    # Terminal: the same bootstrap value is present but must be ignored.
    terminal = _run(*args, truncated=False, bootstrap=0.5, gamma=0.9, lam=0.5)
    torch.testing.assert_close(terminal, torch.tensor([0.1345, 0.21, 0.2]))


def test_gamma_lambda_one_terminal_is_monte_carlo_minus_value() -> None:
    gen = torch.Generator().manual_seed(0)
    rewards, values = torch.randn(3, 7, generator=gen), torch.randn(3, 7, generator=gen)
    mask = torch.ones(3, 7, dtype=torch.bool)
    adv = gae_advantages(
        rewards,
        values,
        mask,
        bootstrap_B=torch.randn(3, generator=gen),
        truncated_B=torch.zeros(3, dtype=torch.bool),
        gamma=1.0,
        lam=1.0,
    )
    mc_return = rewards.flip(-1).cumsum(-1).flip(-1)  # Σ_{s≥t} r_s
    torch.testing.assert_close(adv, mc_return - values)


def reference_gae(
    rewards: list[list[float]],
    values: list[list[float]],
    mask: list[list[bool]],
    truncated: list[bool],
    bootstrap: list[float],
    gamma: float,
    lam: float | list[float],
) -> list[list[float]]:
    """Per trajectory, Python floats: Â_t = Σ_l (γλ)^l δ_{t+l} over the action steps."""
    out = []
    for i in range(len(rewards)):
        steps = [t for t in range(len(rewards[i])) if mask[i][t]]
        row = [0.0] * len(rewards[i])
        lam_i = lam[i] if isinstance(lam, list) else lam
        deltas = []
        for k, t in enumerate(steps):
            if k + 1 < len(steps):
                v_next = values[i][steps[k + 1]]
            else:
                v_next = bootstrap[i] if truncated[i] else 0.0
            deltas.append(rewards[i][t] + gamma * v_next - values[i][t])
        for k, t in enumerate(steps):
            row[t] = sum((gamma * lam_i) ** j * deltas[k + j] for j in range(len(steps) - k))
        out.append(row)
    return out


def _random_case(seed: int, b: int = 5, t: int = 9) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=gen) < 0.6
    return dict(
        rewards=torch.randn(b, t, generator=gen),
        values=torch.randn(b, t, generator=gen),
        mask=mask,
        truncated=torch.rand(b, generator=gen) < 0.5,
        bootstrap=torch.randn(b, generator=gen),
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.7), (0.99, 0.0)])
def test_matches_reference_loop(seed: int, gamma: float, lam: float) -> None:
    c = _random_case(seed)
    got = gae_advantages(
        c["rewards"],
        c["values"],
        c["mask"],
        bootstrap_B=c["bootstrap"],
        truncated_B=c["truncated"],
        gamma=gamma,
        lam=lam,
    )
    want = reference_gae(
        c["rewards"].tolist(),
        c["values"].tolist(),
        c["mask"].tolist(),
        c["truncated"].tolist(),
        c["bootstrap"].tolist(),
        gamma,
        lam,
    )
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=1e-5)


def test_per_row_lambda_tensor_matches_reference() -> None:
    c = _random_case(7)
    lam = torch.tensor([0.0, 0.3, 0.5, 0.9, 1.0])
    got = gae_advantages(
        c["rewards"],
        c["values"],
        c["mask"],
        bootstrap_B=c["bootstrap"],
        truncated_B=c["truncated"],
        gamma=0.95,
        lam=lam,
    )
    want = reference_gae(
        c["rewards"].tolist(),
        c["values"].tolist(),
        c["mask"].tolist(),
        c["truncated"].tolist(),
        c["bootstrap"].tolist(),
        0.95,
        lam.tolist(),
    )
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=2, max_size=6),
    st.integers(0, 10_000),
    st.floats(0.5, 1.0),
    st.floats(0.0, 1.0),
)
def test_observation_tokens_do_not_change_action_advantages(
    gaps: list[int], seed: int, gamma: float, lam: float
) -> None:
    """Inserting observation tokens (mask 0, garbage r and V) leaves action advantages as is."""
    gen = torch.Generator().manual_seed(seed)
    n = len(gaps)
    r, v = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    boot, trunc = torch.randn(1, generator=gen), torch.rand(1, generator=gen) < 0.5
    plain = gae_advantages(
        r[None],
        v[None],
        torch.ones(1, n, dtype=torch.bool),
        bootstrap_B=boot,
        truncated_B=trunc,
        gamma=gamma,
        lam=lam,
    )
    # Interleave: action k is followed by gaps[k] observation tokens holding garbage.
    pos, cursor = [], 0
    for g in gaps:
        pos.append(cursor)
        cursor += 1 + g
    long_r = torch.full((1, cursor), 1e3)
    long_v = torch.full((1, cursor), NAN)
    mask = torch.zeros(1, cursor, dtype=torch.bool)
    long_r[0, pos], long_v[0, pos], mask[0, pos] = r, v, True
    spread = gae_advantages(
        long_r, long_v, mask, bootstrap_B=boot, truncated_B=trunc, gamma=gamma, lam=lam
    )
    torch.testing.assert_close(spread[0, pos], plain[0])
    assert torch.all(spread[0, ~mask[0]] == 0)


def test_decoupled_lambda_returns_use_critic_lambda_advantages_policy_lambda() -> None:
    # r = (0, 0, 1), V = (0.5, 0.6, 0.8), γ = 1, terminal.
    # δ = (0.6 − 0.5, 0.8 − 0.6, 1 − 0.8) = (0.1, 0.2, 0.2)
    # λ_policy = 0.5: Â_2 = 0.2; Â_1 = 0.2 + 0.5·0.2 = 0.3; Â_0 = 0.1 + 0.5·0.3 = 0.25
    # λ_critic = 1: return_t = Σ_{s≥t} r_s = (1, 1, 1)
    batch = make_batch(
        torch.tensor([[0, 1, 1, 1]]),
        torch.tensor([1.0]),
        values=torch.tensor([[0.0, 0.5, 0.6, 0.8]]),
    )
    params = CreditParams(estimator="gae", gamma=1.0, lam=0.3, lam_policy=0.5, lam_critic=1.0)
    credit = registry.get("gae").fn(batch, params)
    torch.testing.assert_close(credit.advantages, torch.tensor([[0.0, 0.25, 0.3, 0.2]]))
    assert credit.returns is not None
    torch.testing.assert_close(credit.returns, torch.tensor([[0.0, 1.0, 1.0, 1.0]]))


def test_adaptive_lambda_formula() -> None:
    # α = 0.5: l = 1 → 1 − 1/0.5 = −1 → clamp 0; l = 2 → 1 − 1/1 = 0;
    # l = 10 → 1 − 1/5 = 0.8; l = 0 → 1 − 1/0 = −inf → clamp 0.
    lam = adaptive_lambda(torch.tensor([1, 2, 10, 0]), alpha=0.5)
    torch.testing.assert_close(lam, torch.tensor([0.0, 0.0, 0.8, 0.0]))
    # VAPO's α = 0.05 at l = 200 tokens: 1 − 1/10 = 0.9
    torch.testing.assert_close(
        adaptive_lambda(torch.tensor([200]), alpha=0.05), torch.tensor([0.9])
    )


def test_adaptive_lambda_in_the_estimator_per_trajectory() -> None:
    """Row 0 has 4 action tokens, row 1 has 2; α = 0.5 gives λ = 1 − 1/2 = 0.5 and 0."""
    gen = torch.Generator().manual_seed(3)
    mask = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 0, 1, 0]], dtype=torch.bool)
    values, token_rewards = torch.randn(2, 5, generator=gen), torch.randn(2, 5, generator=gen)
    batch = make_batch(mask, torch.zeros(2), values=values, token_rewards=token_rewards)
    params = CreditParams(estimator="gae", gamma=0.9, lam=0.95, lam_critic=1.0, adaptive_alpha=0.5)
    credit = registry.get("gae").fn(batch, params)
    kw: dict[str, Any] = dict(
        bootstrap_B=torch.zeros(2), truncated_B=torch.zeros(2, dtype=torch.bool), gamma=0.9
    )
    want = reference_gae(
        token_rewards.tolist(),
        values.tolist(),
        mask.tolist(),
        [False] * 2,
        [0.0] * 2,
        0.9,
        [0.5, 0.0],
    )
    torch.testing.assert_close(credit.advantages, torch.tensor(want))
    critic = gae_advantages(token_rewards, values, mask, lam=1.0, **kw)
    assert credit.returns is not None
    torch.testing.assert_close(credit.returns, torch.where(mask, critic + values, 0.0))


def _two_turn_batch(end: End = End.TERMINAL, bootstrap: float = 0.0) -> Batch:
    # [P, a, a, O, O, a, a, a]; turn ids (−1, 0, 0, −1, −1, 1, 1, 1)
    mask = torch.tensor([[0, 1, 1, 0, 0, 1, 1, 1]], dtype=torch.bool)
    turn_id = torch.tensor([[-1, 0, 0, -1, -1, 1, 1, 1]])
    token_rewards = torch.tensor([[0.0, 0.1, 0.2, 5.0, 5.0, 0.0, 0.0, 1.0]])
    values = torch.tensor([[9.0, 0.4, 9.0, 9.0, 9.0, 0.7, 9.0, 9.0]])  # 9 = never read
    return make_batch(
        mask,
        torch.tensor([1.0]),
        end=torch.tensor([int(end)]),
        turn_id=turn_id,
        token_rewards=token_rewards,
        values=values,
        bootstrap_values=torch.tensor([bootstrap]),
    )


def test_turn_unit_two_turns_hand_case() -> None:
    # Turn 0: V = 0.4 (first token), reward 0.1 + 0.2 = 0.3. Turn 1: V = 0.7, reward 1.
    # γ = 0.9, λ = 0.8, terminal.
    # δ_1 = 1 − 0.7 = 0.3, Â_1 = 0.3
    # δ_0 = 0.3 + 0.9·0.7 − 0.4 = 0.53, Â_0 = 0.53 + 0.72·0.3 = 0.746
    # returns: turn 0: 0.746 + 0.4 = 1.146; turn 1: 0.3 + 0.7 = 1.0
    params = CreditParams(estimator="gae", gamma=0.9, lam=0.8, time_unit="turn")
    credit = registry.get("gae").fn(_two_turn_batch(), params)
    a0, a1 = 0.746, 0.3
    torch.testing.assert_close(
        credit.advantages, torch.tensor([[0.0, a0, a0, 0.0, 0.0, a1, a1, a1]])
    )
    r0, r1 = 1.146, 1.0
    assert credit.returns is not None
    torch.testing.assert_close(credit.returns, torch.tensor([[0.0, r0, r0, 0.0, 0.0, r1, r1, r1]]))


def test_turn_unit_truncated_and_adaptive_lambda_in_turns() -> None:
    # Truncated, V(s_final) = 0.5, γ = 0.9, adaptive α = 1 with l = 2 turns: λ = 1 − 1/2 = 0.5.
    # δ_1 = 1 + 0.9·0.5 − 0.7 = 0.75, Â_1 = 0.75
    # δ_0 = 0.53 (as above), Â_0 = 0.53 + 0.9·0.5·0.75 = 0.8675
    params = CreditParams(estimator="gae", gamma=0.9, lam=0.8, time_unit="turn", adaptive_alpha=1.0)
    credit = registry.get("gae").fn(_two_turn_batch(End.TRUNCATED, 0.5), params)
    a0, a1 = 0.8675, 0.75
    torch.testing.assert_close(
        credit.advantages, torch.tensor([[0.0, a0, a0, 0.0, 0.0, a1, a1, a1]])
    )


def test_turn_gae_with_single_token_turns_equals_token_gae() -> None:
    c = _random_case(11)
    turns = torch.where(c["mask"], c["mask"].long().cumsum(-1) - 1, -1)
    kw: dict[str, Any] = dict(
        bootstrap_B=c["bootstrap"],
        truncated_B=c["truncated"],
        gamma=0.9,
        lam_policy=0.7,
        lam_critic=1.0,
    )
    by_turn = turn_gae(c["rewards"], c["values"], c["mask"], turns, **kw)
    by_token = gae(c["rewards"], c["values"], c["mask"], **kw)
    torch.testing.assert_close(by_turn, by_token)


def test_gae_returns_are_advantage_plus_value_with_same_lambda() -> None:
    c = _random_case(5)
    adv, ret = gae(
        c["rewards"],
        c["values"],
        c["mask"],
        bootstrap_B=c["bootstrap"],
        truncated_B=c["truncated"],
        gamma=0.9,
        lam_policy=0.8,
        lam_critic=0.8,
    )
    torch.testing.assert_close(ret, torch.where(c["mask"], adv + c["values"], 0.0))
    assert not math.isnan(float(ret.sum()))
