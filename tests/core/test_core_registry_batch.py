"""The shared core: registry behaviour and the batch record's derived fields."""

from __future__ import annotations

import pytest
import torch

from rlmap.core import Batch, End, Registry, RewardStatus, UnknownComponentError
from rlmap.core.batch import last_action_onehot, make_batch


def test_registry_rejects_duplicates_and_lists_known_names() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("a", 1)
    reg.register("b")(2)
    assert reg.names() == ("a", "b") and reg.get("b") == 2 and "a" in reg
    with pytest.raises(ValueError, match="already registered"):
        reg.add("a", 3)
    with pytest.raises(UnknownComponentError, match=r"unknown widget 'c'; known: a, b"):
        reg.get("c")


def test_registries_are_independent() -> None:
    first: Registry[int] = Registry("x")
    second: Registry[int] = Registry("x")
    first.add("a", 1)
    assert "a" not in second


def test_step_rewards_put_the_outcome_on_the_last_action_token() -> None:
    mask = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]])
    batch = make_batch(mask, torch.tensor([1.0, 2.0, 3.0]))
    # Row 0's last action token is position 2; row 1's is 3; row 2 has none.
    expected = torch.tensor([[0, 0, 1.0, 0], [0, 0, 0, 2.0], [0, 0, 0, 0]])
    assert torch.equal(batch.step_rewards, expected)
    assert torch.equal(last_action_onehot(mask.bool()).sum(-1), torch.tensor([1.0, 1.0, 0.0]))


def test_valid_excludes_aborted_and_failed_rewards() -> None:
    mask = torch.ones(4, 2)
    batch = make_batch(
        mask,
        torch.zeros(4),
        end=torch.tensor([End.TERMINAL, End.TRUNCATED, End.ABORTED, End.TERMINAL]),
        reward_status=torch.tensor([0, 0, 0, RewardStatus.INFRA_ERROR]),
    )
    assert batch.valid.tolist() == [True, True, False, False]


def test_shapes_are_checked_and_select_slices_every_field() -> None:
    mask = torch.ones(3, 5)
    with pytest.raises(ValueError, match=r"Batch.rewards: shape \(2,\), expected \(3,\)"):
        make_batch(mask, torch.zeros(2))
    batch = make_batch(mask, torch.arange(3.0), values=torch.randn(3, 5))
    sub = batch.select(torch.tensor([2, 0]))
    assert isinstance(sub, Batch) and sub.rewards.tolist() == [2.0, 0.0]
    assert sub.values is not None and torch.equal(sub.values[0], batch.values[2])  # type: ignore[index]
    assert sub.turn_id is None
