"""The state-sufficiency gap at segment boundaries (docs/formulas.md §2.5): a hand case, a
reference loop, invariances, and where the critic estimators log it."""

from __future__ import annotations

import pytest
import torch

from rlmap.core.batch import Batch, End, RewardStatus, make_batch
from rlmap.estimators import CreditParams, registry
from rlmap.estimators.segments import boundary_value_gaps, segment_value_gap

X = 7.0  # a value off the action mask: read by nothing

TRUNC, TERM = int(End.TRUNCATED), int(End.TERMINAL)
GAP, SIGNED = "critic/segment_value_gap", "critic/segment_value_gap_signed"


def _hand_batch() -> Batch:
    """Three episodes, rows out of order: A in three segments (rows 2, 0, 4), B in two (rows
    3, 5), C whole (row 1). ``values`` are V at the action tokens; ``bootstrap_values`` the
    critic's value at each row's last real token, V̂(s_final)."""
    mask = torch.tensor(
        [[0, 0, 1, 1], [0, 1, 1, 0], [0, 1, 1, 0], [0, 1, 0, 0], [0, 0, 1, 1], [0, 0, 0, 1]]
    )
    values = torch.tensor(
        [
            [X, X, 0.375, 0.5],  # A, segment 1
            [X, 0.5, 0.5, X],  # C, whole
            [X, 0.25, 0.25, X],  # A, segment 0
            [X, 0.125, X, X],  # B, segment 0
            [X, X, 1.0, 0.5],  # A, segment 2
            [X, X, X, 0.75],  # B, segment 1
        ]
    )
    return make_batch(
        mask,
        torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 0.0]),
        end=torch.tensor([TRUNC, TERM, TRUNC, TRUNC, TERM, TERM]),
        values=values,
        bootstrap_values=torch.tensor([0.75, 0.0, 0.5, 0.25, 0.0, 0.0]),
        episode_id=torch.tensor([0, 2, 0, 1, 0, 1]),
        segment=torch.tensor([1, 0, 0, 0, 2, 1]),
    )


def _gaps(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    assert batch.values is not None and batch.bootstrap_values is not None
    assert batch.episode_id is not None and batch.segment is not None
    return boundary_value_gaps(
        batch.values, batch.action_mask, batch.episode_id, batch.segment, batch.bootstrap_values
    )


def test_the_gap_by_hand() -> None:
    # gap^k = V(s_0^{k+1}) − V̂(s_final^k), the next row's first action value minus the
    # closing row's last-token value:
    #   A0 (row 2) → A1 (row 0): 0.375 − 0.5  = −0.125
    #   A1 (row 0) → A2 (row 4): 1.0   − 0.75 = +0.25
    #   B0 (row 3) → B1 (row 5): 0.75  − 0.25 = +0.5
    # rows 1 (C whole), 4 and 5 (last segments) close no boundary: 0.
    # mean |gap| = (0.125 + 0.25 + 0.5)/3 = 0.875/3; signed (−0.125 + 0.25 + 0.5)/3 = 0.625/3
    gap, boundary = _gaps(_hand_batch())
    assert gap.tolist() == [0.25, 0.0, -0.125, 0.5, 0.0, 0.0]
    assert boundary.tolist() == [True, False, True, True, False, False]
    metrics = segment_value_gap(gap, boundary)
    torch.testing.assert_close(metrics[GAP], torch.tensor(0.875 / 3))
    torch.testing.assert_close(metrics[SIGNED], torch.tensor(0.625 / 3))


def _random_batch(seed: int) -> Batch:
    """Episodes of 1–4 segments, rows shuffled, 1–3 action tokens each at random columns."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 5, (5,), generator=g).tolist()
    episode = torch.tensor([e for e, n in enumerate(lengths) for _ in range(n)])
    segment = torch.tensor([k for n in lengths for k in range(n)])
    b, t = len(episode), 6
    mask = torch.zeros(b, t, dtype=torch.bool)
    for i in range(b):
        start = int(torch.randint(0, 4, (1,), generator=g))
        mask[i, start : start + int(torch.randint(1, 4, (1,), generator=g))] = True
    order = torch.randperm(b, generator=g)
    return make_batch(
        mask[order],
        torch.zeros(b),
        values=torch.where(mask, torch.rand(b, t, generator=g), X)[order],
        bootstrap_values=torch.rand(b, generator=g),
        episode_id=episode[order],
        segment=segment[order],
    )


def reference_gaps(batch: Batch) -> list[float]:
    """The gaps with plain loops: for each row, find the row holding its episode's next
    segment, take that row's value at its first action token, subtract the row's own
    last-token value."""
    assert batch.values is not None and batch.bootstrap_values is not None
    assert batch.episode_id is not None and batch.segment is not None
    gaps = []
    for i in range(batch.size):
        gap = 0.0
        for j in range(batch.size):
            same = batch.episode_id[j] == batch.episode_id[i]
            if same and batch.segment[j] == batch.segment[i] + 1:
                first = batch.action_mask[j].tolist().index(True)
                gap = float(batch.values[j, first] - batch.bootstrap_values[i])
        gaps.append(gap)
    return gaps


@pytest.mark.parametrize("seed", range(5))
def test_the_gap_matches_a_reference_loop(seed: int) -> None:
    batch = _random_batch(seed)
    gap, boundary = _gaps(batch)
    expected = reference_gaps(batch)
    torch.testing.assert_close(gap, torch.tensor(expected))
    assert batch.segment is not None and batch.episode_id is not None
    last = [
        int(batch.segment[i]) == int(batch.segment[batch.episode_id == batch.episode_id[i]].max())
        for i in range(batch.size)
    ]
    assert boundary.tolist() == [not x for x in last]
    counted = [abs(x) for x, b in zip(expected, boundary.tolist(), strict=True) if b]
    want = sum(counted) / len(counted) if counted else 0.0
    torch.testing.assert_close(
        segment_value_gap(gap, boundary)[GAP], torch.tensor(want), rtol=1e-6, atol=1e-6
    )


@pytest.mark.parametrize("seed", range(3))
def test_rows_permuted_or_episodes_selected_keep_every_gap(seed: int) -> None:
    batch = _random_batch(seed)
    gap, boundary = _gaps(batch)
    order = torch.randperm(batch.size, generator=torch.Generator().manual_seed(seed + 10))
    again, again_boundary = _gaps(batch.select(order))
    torch.testing.assert_close(again, gap[order])
    assert torch.equal(again_boundary, boundary[order])
    torch.testing.assert_close(
        segment_value_gap(again, again_boundary)[GAP], segment_value_gap(gap, boundary)[GAP]
    )
    assert batch.episode_id is not None
    kept = batch.episode_id % 2 == 0  # whole episodes: their links stay in the batch
    part, _ = _gaps(batch.select(kept))
    torch.testing.assert_close(part, gap[kept])


def test_a_common_shift_of_every_value_changes_no_gap() -> None:
    # the gap compares two readings of one state: a constant added to the critic cancels
    batch = _random_batch(0)
    assert batch.values is not None and batch.bootstrap_values is not None
    gap, _ = _gaps(batch)
    assert gap.abs().max() > 0.01  # (random values: the check below is not about zeros)
    shifted = batch.replace(
        values=batch.values + 3.0, bootstrap_values=batch.bootstrap_values + 3.0
    )
    torch.testing.assert_close(_gaps(shifted)[0], gap)


# --- where it is logged -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("gae", CreditParams(estimator="gae", gamma=1.0, lam=0.5)),
        ("gae", CreditParams(estimator="gae", gamma=1.0, lam=0.5, time_unit="turn")),
        ("vtrace", CreditParams(estimator="vtrace", gamma=1.0)),
    ],
)
def test_the_critic_estimators_log_the_gap_beside_the_value_errors(
    name: str, params: CreditParams
) -> None:
    credit = registry.get(name).fn(_hand_batch(), params)
    assert "critic/value_error_first" in credit.diagnostics
    torch.testing.assert_close(credit.diagnostics[GAP], torch.tensor(0.875 / 3))
    torch.testing.assert_close(credit.diagnostics[SIGNED], torch.tensor(0.625 / 3))


def test_the_gap_is_not_logged_without_a_boundary() -> None:
    params = CreditParams(estimator="gae")
    batch = _hand_batch()
    whole = batch.replace(episode_id=None, segment=None, end=torch.full((6,), TERM))
    assert GAP not in registry.get("gae").fn(whole, params).diagnostics
    # the rows of A's and B's last segments alone link to nothing
    last_rows = batch.select(torch.tensor([1, 4, 5]))
    assert GAP not in registry.get("gae").fn(last_rows, params).diagnostics


def test_a_boundary_closing_an_excluded_row_is_not_counted() -> None:
    # row 3 (B0 → B1, gap 0.5) has a failed reward: it trains on nothing, and is not counted;
    # left: A's two boundaries, mean |gap| (0.125 + 0.25)/2 = 0.1875, signed 0.125/2 = 0.0625
    batch = _hand_batch()
    status = torch.tensor([0, 0, 0, int(RewardStatus.INFRA_ERROR), 0, 0])
    credit = registry.get("gae").fn(batch.replace(reward_status=status), CreditParams())
    torch.testing.assert_close(credit.diagnostics[GAP], torch.tensor(0.1875))
    torch.testing.assert_close(credit.diagnostics[SIGNED], torch.tensor(0.0625))
