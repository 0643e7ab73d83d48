"""Group estimators (RLOO, GRPO, Dr. GRPO) and group diagnostics."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmap.core.batch import make_batch
from rlmap.estimators import (
    CreditParams,
    dr_grpo_advantages,
    group_diagnostics,
    grpo_advantages,
    registry,
    rloo_advantages,
)

NAN = float("nan")
GROUP_ESTIMATORS = ("rloo", "grpo", "dr_grpo", "reinforce_pp_baseline")


def _t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs)


ALL_VALID = torch.ones(6, dtype=torch.bool)
IDS = torch.tensor([0, 0, 0, 0, 1, 1])
REWARDS = _t(1.0, 0.0, 0.0, 1.0, 1.0, 1.0)


def test_grpo_hand_case() -> None:
    # Group 0: R = (1, 0, 0, 1), mean 0.5, unbiased std = sqrt((4 · 0.25)/3) = sqrt(1/3) = 0.57735
    #   A = ±0.5 / (0.57735 + 1e-6) = ±0.866024
    # Group 1: R = (1, 1), std 0 → A = 0 / (0 + ε) = 0
    adv = grpo_advantages(REWARDS, IDS, ALL_VALID, eps=1e-6)
    a = 0.5 / (1 / 3) ** 0.5
    torch.testing.assert_close(adv, _t(a, -a, -a, a, 0.0, 0.0), rtol=1e-5, atol=1e-5)


def test_rloo_hand_case() -> None:
    # Group 0: A_0 = 1 − (0 + 0 + 1)/3 = 2/3; A_1 = 0 − (1 + 0 + 1)/3 = −2/3. Group 1: 1 − 1 = 0.
    adv = rloo_advantages(REWARDS, IDS, ALL_VALID)
    torch.testing.assert_close(adv, _t(2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0))


def test_dr_grpo_hand_case() -> None:
    # Group 0: R − 0.5 = (0.5, −0.5, −0.5, 0.5); group 1: 0.
    adv = dr_grpo_advantages(REWARDS, IDS, ALL_VALID)
    torch.testing.assert_close(adv, _t(0.5, -0.5, -0.5, 0.5, 0.0, 0.0))


def test_invalid_members_leave_the_statistics_and_get_zero() -> None:
    # Group 0: R = (1, 0, NaN (invalid), 1): valid mean = 2/3 → Dr. GRPO (1/3, −2/3, 0, 1/3).
    # Group 1: R = (1, invalid): one valid member, no baseline → 0 for both.
    rewards, ids = _t(1.0, 0.0, NAN, 1.0, 1.0, 5.0), IDS
    valid = torch.tensor([True, True, False, True, True, False])
    torch.testing.assert_close(
        dr_grpo_advantages(rewards, ids, valid), _t(1 / 3, -2 / 3, 0.0, 1 / 3, 0.0, 0.0)
    )
    # RLOO over the 3 valid members: 1 − (0 + 1)/2 = 0.5; 0 − (1 + 1)/2 = −1.
    torch.testing.assert_close(
        rloo_advantages(rewards, ids, valid), _t(0.5, -1.0, 0.0, 0.5, 0.0, 0.0)
    )
    # GRPO: deviations (1/3, −2/3, 1/3), unbiased var = (1/9 + 4/9 + 1/9)/2 = 1/3.
    s = (1 / 3) ** 0.5
    torch.testing.assert_close(
        grpo_advantages(rewards, ids, valid),
        _t(1 / 3 / s, -2 / 3 / s, 0.0, 1 / 3 / s, 0.0, 0.0),
        rtol=1e-5,
        atol=1e-5,
    )


def reference_group(
    rewards: list[float], ids: list[int], valid: list[bool], kind: str
) -> list[float]:
    """Per trajectory, Python floats, with the statistics module."""
    out = []
    for i, r in enumerate(rewards):
        members = [rewards[j] for j in range(len(rewards)) if ids[j] == ids[i] and valid[j]]
        if not valid[i] or len(members) < 2:
            out.append(0.0)
        elif kind == "rloo":
            others = list(members)
            others.remove(r)
            out.append(r - sum(others) / len(others))
        elif kind == "grpo":
            out.append((r - statistics.mean(members)) / (statistics.stdev(members) + 1e-6))
        else:
            out.append(r - statistics.mean(members))
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(
    ("kind", "fn"),
    [("rloo", rloo_advantages), ("grpo", grpo_advantages), ("dr_grpo", dr_grpo_advantages)],
)
def test_matches_reference_loop(seed: int, kind: str, fn: Callable[..., torch.Tensor]) -> None:
    gen = torch.Generator().manual_seed(seed)
    b = 12
    ids = torch.randint(0, 4, (b,), generator=gen) * 7  # arbitrary, non-contiguous ids
    rewards = torch.randint(0, 3, (b,), generator=gen).float() + torch.rand(b, generator=gen)
    valid = torch.rand(b, generator=gen) < 0.8
    want = reference_group(rewards.tolist(), ids.tolist(), valid.tolist(), kind)
    torch.testing.assert_close(fn(rewards, ids, valid), torch.tensor(want), rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(
    st.floats(-5, 5),
    st.integers(2, 5),
    st.lists(st.floats(-5, 5), min_size=2, max_size=5),
    st.integers(1, 4),
    st.sampled_from(("rloo", "grpo", "dr_grpo")),
)
def test_constant_reward_group_gets_exactly_zero_advantage(
    const: float, g: int, others: list[float], length: int, name: str
) -> None:
    """A group whose rewards are all equal gets exactly 0 on every token, next to another group."""
    rewards = torch.tensor([const] * g + others)
    ids = torch.tensor([0] * g + [1] * len(others))
    batch = make_batch(torch.ones(len(rewards), length), rewards, group_id=ids)
    credit = registry.get(name).fn(batch, CreditParams(estimator=name))
    assert torch.all(credit.advantages[:g] == 0)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(-4, 4),
    st.integers(2, 5),
    st.lists(st.integers(-4, 4), min_size=2, max_size=5),
    st.integers(1, 4),
)
def test_constant_reward_group_zero_under_reinforce_pp_baseline(
    const: int, g: int, others: list[int], length: int
) -> None:
    """Same for reinforce_pp_baseline, with equal response lengths.

    Its batch whitening subtracts the token mean of the centred rewards; that mean is 0
    (up to rounding) only when responses have equal lengths — with unequal lengths a
    constant group gets a uniform nonzero value (test_estimators_reinforce, hand case).
    """
    rewards = torch.tensor([const] * g + others, dtype=torch.float32)
    ids = torch.tensor([0] * g + [1] * len(others))
    batch = make_batch(torch.ones(len(rewards), length), rewards, group_id=ids)
    name = "reinforce_pp_baseline"
    credit = registry.get(name).fn(batch, CreditParams(estimator=name))
    torch.testing.assert_close(credit.advantages[:g], torch.zeros(g, length), atol=1e-5, rtol=0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-10, 10), min_size=2, max_size=8))
def test_rloo_is_scaled_mean_baseline(rewards: list[float]) -> None:
    """A_i^RLOO = G/(G−1) · (R_i − mean_g R)."""
    r = torch.tensor(rewards, dtype=torch.float64)
    ids, valid = torch.zeros(len(r), dtype=torch.long), torch.ones(len(r), dtype=torch.bool)
    g = len(rewards)
    torch.testing.assert_close(rloo_advantages(r, ids, valid), g / (g - 1) * (r - r.mean()))


def test_group_diagnostics_hand_case() -> None:
    # g0 (1, 1): all correct, equal; g1 (0, 0): all wrong, equal; g2 (1, 0): mixed;
    # g3 (0.5, invalid NaN): one valid member: all correct, equal; g4 (invalid only): not counted.
    # 4 counted groups: all_correct 2/4, all_wrong 1/4, zero_adv 3/4.
    rewards = _t(1, 1, 0, 0, 1, 0, 0.5, NAN, NAN)
    ids = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4])
    valid = torch.tensor([True] * 7 + [False, False])
    d = group_diagnostics(rewards, ids, valid)
    torch.testing.assert_close(d["group/all_correct_frac"], torch.tensor(0.5))
    torch.testing.assert_close(d["group/all_wrong_frac"], torch.tensor(0.25))
    torch.testing.assert_close(d["group/zero_adv_frac"], torch.tensor(0.75))


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_members_alone_in_their_group_get_no_advantage(name: str) -> None:
    # Every row its own group: what remains of groups whose other members failed and
    # were excluded. No baseline exists, so no advantage — not an error mid-run (G = 1
    # as a *setting* is refused by the config validation, tests/recipes).
    batch = make_batch(torch.ones(3, 2), _t(1.0, 0.0, 1.0))
    credit = registry.get(name).fn(batch, CreditParams(estimator=name))
    assert credit.advantages.abs().sum() == 0


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_group_estimators_report_group_diagnostics(name: str) -> None:
    batch = make_batch(
        torch.ones(4, 2), _t(1.0, 0.0, 1.0, 1.0), group_id=torch.tensor([0, 0, 1, 1])
    )
    credit = registry.get(name).fn(batch, CreditParams(estimator=name))
    # g0 mixed, g1 all correct and equal.
    assert float(credit.diagnostics["group/all_correct_frac"]) == 0.5
    assert float(credit.diagnostics["group/zero_adv_frac"]) == 0.5
    assert float(credit.diagnostics["group/all_wrong_frac"]) == 0.0
