"""REINFORCE (batch baseline), REINFORCE++ and REINFORCE++-baseline."""

from __future__ import annotations

import math

import pytest
import torch

from rlmap.core.batch import make_batch
from rlmap.estimators import (
    CreditParams,
    discounted_returns,
    registry,
    reinforce_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
)

EPS = 1e-6


def test_reinforce_batch_baseline_hand_case() -> None:
    # Valid R = (1, 0, 0); baseline = 1/3 → (2/3, −1/3, −1/3); the invalid row (NaN) gets 0.
    rewards = torch.tensor([1.0, 0.0, 0.0, float("nan")])
    valid = torch.tensor([True, True, True, False])
    torch.testing.assert_close(
        reinforce_advantages(rewards, valid), torch.tensor([2 / 3, -1 / 3, -1 / 3, 0.0])
    )


def test_reinforce_registry_broadcasts_to_action_tokens() -> None:
    batch = make_batch(torch.tensor([[0, 1, 1], [1, 0, 0]]), torch.tensor([1.0, 0.0]))
    credit = registry.get("reinforce").fn(batch, CreditParams(estimator="reinforce"))
    # baseline 0.5 → (0.5, −0.5) on the action tokens only
    torch.testing.assert_close(credit.advantages, torch.tensor([[0.0, 0.5, 0.5], [-0.5, 0, 0]]))
    assert credit.returns is None


def test_discounted_returns_hand_case_skips_observations() -> None:
    # mask (0, 1, 1, 0, 1); r on actions: 0.5, 0, 1 (the 7 on the observation is ignored); γ = 0.5
    # G_4 = 1; G_2 = 0 + 0.5·1 = 0.5; G_1 = 0.5 + 0.5·0.5 = 0.75
    got = discounted_returns(
        torch.tensor([[9.0, 0.5, 0.0, 7.0, 1.0]]),
        torch.tensor([[0, 1, 1, 0, 1]], dtype=torch.bool),
        gamma=0.5,
    )
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.75, 0.5, 0.0, 1.0]]))


def test_reinforce_pp_whitening_hand_case() -> None:
    # Row 0: R = 1 at its last token, γ = 1 → G = (1, 1); row 1: R = 0 → G = (0, 0).
    # Tokens (1, 1, 0, 0): mean 0.5, biased std 0.5 → (1, 1, −1, −1) · 0.5/(0.5 + ε).
    batch = make_batch(torch.ones(2, 2), torch.tensor([1.0, 0.0]))
    credit = registry.get("reinforce_pp").fn(batch, CreditParams(estimator="reinforce_pp"))
    a = 0.5 / (0.5 + EPS)
    torch.testing.assert_close(credit.advantages, torch.tensor([[a, a], [-a, -a]]))


def _whiten_reference(values: list[float]) -> list[float]:
    n = len(values)
    mean = sum(values) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n)  # biased
    return [(v - mean) / (std + EPS) for v in values]


@pytest.mark.parametrize("seed", range(4))
def test_reinforce_pp_matches_reference_loop(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    b, t, gamma = 5, 7, 0.9
    mask = torch.rand(b, t, generator=gen) < 0.6
    rewards = torch.randn(b, t, generator=gen)
    got = reinforce_pp_advantages(rewards, mask, gamma=gamma, eps=EPS)
    # Reference: G_t = Σ_k γ^k r_{steps[j+k]} per row, then whiten over all action tokens.
    flat, where = [], []
    for i in range(b):
        steps = [s for s in range(t) if mask[i, s]]
        for j, s in enumerate(steps):
            g = sum(gamma**k * float(rewards[i, steps[j + k]]) for k in range(len(steps) - j))
            flat.append(g)
            where.append((i, s))
    want = torch.zeros(b, t)
    for (i, s), w in zip(where, _whiten_reference(flat), strict=True):
        want[i, s] = w
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_reinforce_pp_baseline_hand_case_unequal_lengths() -> None:
    # g0: R = (1, 0), lengths (1, 3); g1: R = (2, 2), lengths (2, 2). Centred: g0 (0.5, −0.5), g1 0.
    # Tokens: 0.5 ×1, −0.5 ×3, 0 ×4 → mean = (0.5 − 1.5)/8 = −0.125
    # deviations 0.625, −0.375, 0.125; var = (0.390625 + 3·0.140625 + 4·0.015625)/8 = 0.109375
    # std = 0.3307189; whitened: 1.8898224, −1.1338934, and 0.3779645 for the constant group —
    # the batch-level mean shift gives a constant group a (uniform) nonzero advantage when
    # response lengths differ (REINFORCE++ whitens with the batch token mean).
    mask = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    rewards, ids = torch.tensor([1.0, 0.0, 2.0, 2.0]), torch.tensor([0, 0, 1, 1])
    got = reinforce_pp_baseline_advantages(rewards, ids, torch.ones(4, dtype=torch.bool), mask)
    s = 0.109375**0.5 + EPS
    a, b, c = 0.625 / s, -0.375 / s, 0.125 / s
    want = torch.tensor([[a, 0, 0], [b, b, b], [c, c, 0], [c, c, 0]])
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("seed", range(4))
def test_reinforce_pp_baseline_matches_reference_loop(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    b, t = 10, 5
    mask = torch.rand(b, t, generator=gen) < 0.7
    ids = torch.randint(0, 5, (b,), generator=gen)  # some groups end with < 2 valid members
    rewards = torch.randint(0, 3, (b,), generator=gen).float()
    valid = torch.rand(b, generator=gen) < 0.85
    got = reinforce_pp_baseline_advantages(rewards, ids, valid, mask & valid[:, None], eps=EPS)
    flat, where = [], []
    for i in range(b):
        members = [float(rewards[j]) for j in range(b) if ids[j] == ids[i] and valid[j]]
        if not valid[i] or len(members) < 2:
            continue
        centred = float(rewards[i]) - sum(members) / len(members)
        for s in range(t):
            if mask[i, s]:
                flat.append(centred)
                where.append((i, s))
    want = torch.zeros(b, t)
    if flat:
        for (i, s), w in zip(where, _whiten_reference(flat), strict=True):
            want[i, s] = w
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_reinforce_pp_uses_step_rewards_with_kl_penalty() -> None:
    # token_rewards already hold R − β·k1: (−0.1, −0.1, 1 − 0.1), γ = 1 → G = (0.7, 0.8, 0.9).
    # Whitened: mean 0.8, biased std sqrt(0.02/3) = 0.0816497 → (−1.2247, 0, 1.2247).
    batch = make_batch(
        torch.ones(1, 3), torch.tensor([1.0]), token_rewards=torch.tensor([[-0.1, -0.1, 0.9]])
    )
    credit = registry.get("reinforce_pp").fn(batch, CreditParams(estimator="reinforce_pp"))
    z = 0.1 / ((0.02 / 3) ** 0.5 + EPS)
    torch.testing.assert_close(credit.advantages, torch.tensor([[-z, 0.0, z]]), atol=1e-4, rtol=0)


def test_reinforce_pp_baseline_row_without_baseline_is_zero_and_left_out() -> None:
    # g0: R = (1, 0) → centred (0.5, −0.5); g1: one valid member (R = 5) and an invalid row.
    # Only g0's two tokens are whitened: mean 0, biased std 0.5 → ±0.5/(0.5 + ε).
    # g1's lone member has no baseline: 0, and it does not enter the std (else std = sqrt(1/6)).
    rewards, ids = torch.tensor([1.0, 0.0, 5.0, float("nan")]), torch.tensor([0, 0, 1, 1])
    valid = torch.tensor([True, True, True, False])
    mask = torch.ones(4, 1, dtype=torch.bool) & valid[:, None]
    got = reinforce_pp_baseline_advantages(rewards, ids, valid, mask, eps=EPS)
    a = 0.5 / (0.5 + EPS)
    torch.testing.assert_close(got, torch.tensor([[a], [-a], [0.0], [0.0]]))
