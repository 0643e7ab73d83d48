"""Group filters (none, mixed = DAPO dynamic sampling) and the refill bookkeeping."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmap.core.errors import UnknownComponentError
from rlmap.sampling import (
    SamplingParams,
    first_groups,
    keep_mixed,
    registry,
    sample_more,
    sampling_counters,
)

# Four groups of three; group ids need not be contiguous or sorted.
#   group 5: rewards 1, 0, 1 -> mixed, kept
#   group 2: rewards 1, 1, 1 -> all correct, dropped
#   group 9: rewards 0, 0, 1 but the 1 is invalid -> valid rewards 0, 0 -> dropped
#   group 4: rewards 0, 1, 0 with the first invalid -> valid rewards 1, 0 -> mixed, the
#            invalid row itself is never kept
REWARDS = torch.tensor([1.0, 0, 1, 1, 1, 1, 0, 0, 1, 0, 1, 0])
GROUPS = torch.tensor([5, 5, 5, 2, 2, 2, 9, 9, 9, 4, 4, 4])
VALID = torch.tensor([1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1], dtype=torch.bool)


def test_mixed_hand_case() -> None:
    keep = registry.get("mixed").fn(REWARDS, GROUPS, VALID)
    expected = [1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 1]
    assert keep.tolist() == [bool(x) for x in expected]


def test_none_keeps_every_valid_trajectory() -> None:
    keep = registry.get("none").fn(REWARDS, GROUPS, VALID)
    assert torch.equal(keep, VALID)


def test_sampling_counters_count_what_was_generated_not_only_what_was_kept() -> None:
    keep = keep_mixed(REWARDS, GROUPS, VALID)
    # The hand case over 2 rounds: 12 trajectories of 3, 1, 2, ... tokens; rows 8 and 9 have
    # an untrusted reward; 5 kept (rows 0, 1, 2, 10, 11).
    tokens = [3, 1, 2, 4, 4, 4, 1, 1, 1, 2, 2, 5]
    c = sampling_counters(tokens, VALID.tolist(), int(keep.sum()), rounds=2)
    assert c == {
        "sampling/rounds": 2.0,
        "sampling/generated": 12.0,
        "sampling/generated_tokens": 30.0,  # 3+1+2 + 12 + 3 + 2+2+5
        "sampling/kept": 5.0,
        "sampling/kept_frac": pytest.approx(5 / 12),
        "sampling/rejected": 2.0,  # rows 8 and 9
    }


def test_sampling_counters_of_nothing_are_zeros_not_a_division_by_zero() -> None:
    assert sampling_counters([], [], 0, rounds=1)["sampling/kept_frac"] == 0.0


def reference_mixed(rewards: list[float], groups: list[int], valid: list[bool]) -> list[bool]:
    """Per group, the set of valid rewards; a group is mixed when it has two distinct values."""
    values: dict[int, set[float]] = {}
    for r, g, v in zip(rewards, groups, valid, strict=True):
        if v:
            values.setdefault(g, set()).add(r)
    return [v and len(values.get(g, set())) > 1 for g, v in zip(groups, valid, strict=True)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([0.0, 0.5, 1.0]), st.integers(0, 5), st.booleans()),
        min_size=0,
        max_size=20,
    )
)
def test_mixed_matches_reference(rows: list[tuple[float, int, bool]]) -> None:
    rewards = [r for r, _, _ in rows]
    groups = [g for _, g, _ in rows]
    valid = [v for _, _, v in rows]
    keep = keep_mixed(
        torch.tensor(rewards, dtype=torch.float32),
        torch.tensor(groups, dtype=torch.long),
        torch.tensor(valid, dtype=torch.bool),
    )
    assert keep.tolist() == reference_mixed(rewards, groups, valid)


def test_mixed_properties() -> None:
    g = torch.Generator().manual_seed(0)
    groups = torch.arange(6).repeat_interleave(4)  # 6 groups of G = 4
    rewards = (torch.rand(24, generator=g) < 0.5).float()
    valid = torch.rand(24, generator=g) < 0.8
    keep = keep_mixed(rewards, groups, valid)
    # never keeps an invalid row; kept groups keep all their valid rows
    assert not torch.any(keep & ~valid)
    for gid in range(6):
        rows = groups == gid
        assert torch.all(keep[rows & valid]) or not torch.any(keep[rows])
    # relabelling and permuting rows changes nothing
    perm = torch.randperm(24, generator=g)
    relabelled = keep_mixed(rewards[perm], groups[perm] * 7 + 3, valid[perm])
    assert torch.equal(relabelled, keep[perm])
    # a constant-reward batch keeps nothing; a single valid member is not a mixed group
    assert not keep_mixed(torch.ones(24), groups, valid).any()
    one = keep_mixed(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.tensor([True, False]))
    assert not one.any()


def test_first_groups_drops_surplus_groups_whole() -> None:
    groups = torch.tensor([7, 7, 3, 3, 3, 8, 1, 1])
    keep = torch.tensor([1, 1, 0, 0, 0, 1, 1, 1], dtype=torch.bool)
    # kept groups in order of appearance: 7 (rows 0-1), 8 (row 5), 1 (rows 6-7); group 3 had
    # nothing kept. The first two are 7 and 8.
    assert first_groups(groups, keep, 2).tolist() == [1, 1, 0, 0, 0, 1, 0, 0]
    assert torch.equal(first_groups(groups, keep, 3), keep)
    assert torch.equal(first_groups(groups, keep, 10), keep)
    assert not first_groups(groups, keep, 0).any()


def test_sample_more() -> None:
    assert sample_more(0, 8, 0, 4)  # the first round always runs
    assert sample_more(7, 8, 3, 4)  # one group short, one round left
    assert not sample_more(8, 8, 1, 4)  # batch full
    assert not sample_more(12, 8, 1, 4)  # overfull: trimmed by first_groups
    assert not sample_more(2, 8, 4, 4)  # cap reached: train on what there is
    with pytest.raises(ValueError):
        sample_more(0, 8, 0, 0)


def test_registry_and_params() -> None:
    assert registry.names() == ("none", "mixed")
    assert registry.get("mixed").needs_group and not registry.get("none").needs_group
    with pytest.raises(UnknownComponentError, match="known: none, mixed"):
        registry.get("dynamic")
    assert SamplingParams().rollouts_per_round == 64  # G · prompts = 8 · 8
    assert SamplingParams(group_size=4, prompts_per_step=3).rollouts_per_round == 12


def reference_first_groups(groups: list[int], keep: list[bool], target: int) -> list[bool]:
    chosen: list[int] = []
    for g, k in zip(groups, keep, strict=True):
        if k and g not in chosen:
            chosen.append(g)
    chosen = chosen[:target]
    return [k and g in chosen for g, k in zip(groups, keep, strict=True)]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 6), st.booleans()), max_size=20),
    st.integers(0, 8),
)
def test_first_groups_matches_reference(rows: list[tuple[int, bool]], target: int) -> None:
    groups = [g for g, _ in rows]
    keep = [k for _, k in rows]
    got = first_groups(
        torch.tensor(groups, dtype=torch.long), torch.tensor(keep, dtype=torch.bool), target
    )
    assert got.tolist() == reference_first_groups(groups, keep, target)
