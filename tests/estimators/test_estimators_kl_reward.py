"""The KL penalty in the reward reaches every outcome estimator (issue 27, item 1).

``kl.placement=reward`` writes r_t − β·k1_t into ``Batch.token_rewards``; an outcome
estimator's R_i is the return Σ_t r_t = R_i − β·Σ_t k1_t (verl's semantics: the penalty
joins the sequence reward before the group baseline). Before the fix the outcome
estimators read ``Batch.rewards`` and the penalty changed nothing.
"""

from __future__ import annotations

import pytest
import torch

from rlmap.core.batch import make_batch
from rlmap.correction import kl_in_reward
from rlmap.estimators import CreditParams, registry

OUTCOME = ("reinforce", "rloo", "grpo", "dr_grpo", "reinforce_pp_baseline")


def _penalised(rewards: torch.Tensor, k1_sums: list[float], beta: float, **kw: torch.Tensor):  # type: ignore[no-untyped-def]
    """A batch of 2-token rows whose k1 is split evenly over the two action tokens."""
    b = rewards.shape[0]
    mask = torch.ones(b, 2, dtype=torch.bool)
    ref = torch.zeros(b, 2)
    logprobs = torch.tensor(k1_sums).unsqueeze(-1).expand(b, 2) / 2  # k1_t = log π − log π_ref
    plain = make_batch(mask, rewards, **kw)
    tokens = kl_in_reward(plain.step_rewards, logprobs, ref, mask, beta)
    return plain, plain.replace(token_rewards=tokens)


def _adv(name: str, batch) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return registry.get(name).fn(batch, CreditParams(estimator=name)).advantages[:, -1]


def test_grpo_hand_case() -> None:
    # One group of 3, R = [1, 1, 0], Σ_t k1 = [2, 0, 0], β = 0.25:
    # returns = [1 − 0.5, 1, 0] = [0.5, 1, 0]; mean 0.5; centred [0, 0.5, −0.5];
    # unbiased std = sqrt((0 + 0.25 + 0.25) / 2) = 0.5  →  A = [0, 1, −1].
    # Without the penalty: mean 2/3, std sqrt((1/9 + 1/9 + 4/9) / 2) = 1/sqrt(3),
    # A = [1/sqrt(3), 1/sqrt(3), −2/sqrt(3)] — what the run trained on before the fix.
    group = torch.zeros(3, dtype=torch.long)
    plain, kl = _penalised(torch.tensor([1.0, 1.0, 0.0]), [2.0, 0.0, 0.0], 0.25, group_id=group)
    assert torch.allclose(kl.total_rewards, torch.tensor([0.5, 1.0, 0.0]))
    assert torch.allclose(_adv("grpo", kl), torch.tensor([0.0, 1.0, -1.0]), atol=1e-5)
    s = 3**-0.5
    assert torch.allclose(_adv("grpo", plain), torch.tensor([s, s, -2 * s]), atol=1e-5)


def test_dr_grpo_hand_case() -> None:
    # Group of 2, R = [1, 0], Σ_t k1 = [1, 0], β = 0.5: returns [0.5, 0]; A = ±0.25.
    group = torch.zeros(2, dtype=torch.long)
    _, kl = _penalised(torch.tensor([1.0, 0.0]), [1.0, 0.0], 0.5, group_id=group)
    assert torch.allclose(_adv("dr_grpo", kl), torch.tensor([0.25, -0.25]))


@pytest.mark.parametrize("name", OUTCOME)
def test_every_outcome_estimator_sees_the_penalised_return(name: str) -> None:
    # Reference: the same estimator on a batch whose outcome R_i already holds the
    # penalty (no per-token rewards at all) must give the same advantages.
    gen = torch.Generator().manual_seed(3)
    rewards = torch.randint(0, 2, (8,), generator=gen).float()
    k1_sums = torch.rand(8, generator=gen).tolist()
    group = torch.arange(8) // 4
    plain, kl = _penalised(rewards, k1_sums, 0.7, group_id=group)
    expected = make_batch(plain.action_mask, rewards - 0.7 * torch.tensor(k1_sums), group_id=group)
    assert torch.allclose(_adv(name, kl), _adv(name, expected), atol=1e-5)
    assert not torch.allclose(_adv(name, kl), _adv(name, plain), atol=1e-3)


@pytest.mark.parametrize("name", OUTCOME)
def test_a_penalty_shared_by_the_whole_group_changes_no_centred_advantage(name: str) -> None:
    # Invariance: the same Σ k1 on every member shifts every R_i of the group alike; a
    # group baseline removes it (reinforce's batch baseline too: one group fills the batch).
    group = torch.zeros(4, dtype=torch.long)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    plain, kl = _penalised(rewards, [0.8] * 4, 0.5, group_id=group)
    assert torch.allclose(_adv(name, kl), _adv(name, plain), atol=1e-5)


def test_per_turn_rewards_that_sum_to_the_outcome_change_nothing() -> None:
    # A process reward's per-turn scores sum to R (rlmap.rollout.packing.to_batch):
    # the outcome estimators' R_i is the same either way.
    mask = torch.ones(2, 3, dtype=torch.bool)
    tokens = torch.tensor([[0.1, 0.0, 0.9], [0.0, 0.0, 0.0]])
    batch = make_batch(mask, torch.tensor([1.0, 0.0]), token_rewards=tokens)
    assert torch.allclose(batch.total_rewards, batch.rewards)


def test_a_group_of_equal_outcomes_with_unequal_penalties_has_an_advantage() -> None:
    # All 4 correct (R = 1), Σ k1 = [0.004, 0.003, 0.002, 0.001], β = 1: the returns
    # differ, GRPO divides their tiny spread by its std and gives unit-size advantages —
    # so the group is not a zero-advantage one (before: zero_adv_frac 1.0 read the outcome,
    # and `diagnose` would call a group GRPO pushes hard on "no learning signal").
    group = torch.zeros(4, dtype=torch.long)
    _, kl = _penalised(torch.ones(4), [0.004, 0.003, 0.002, 0.001], 1.0, group_id=group)
    credit = registry.get("grpo").fn(kl, CreditParams(estimator="grpo"))
    assert float(credit.advantages.abs().max()) > 1.0
    assert float(credit.diagnostics["group/zero_adv_frac"]) == 0.0
    assert float(credit.diagnostics["group/all_correct_frac"]) == 1.0  # the outcome's
