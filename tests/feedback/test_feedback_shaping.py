"""DAPO soft overlong punishment."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlmap.feedback.shaping import overlong_penalty


def test_breakpoints_hand_case() -> None:
    # L_max = 20, L_c = 4: free up to 16, linear on (16, 20], −1 beyond
    #   |y| = 16 -> 0            (at the free limit)
    #   |y| = 17 -> (16−17)/4 = −0.25
    #   |y| = 18 -> (16−18)/4 = −0.5
    #   |y| = 20 -> (16−20)/4 = −1 (at L_max, the linear part reaches −1)
    #   |y| = 21 -> −1           (beyond L_max)
    lengths = torch.tensor([0, 16, 17, 18, 20, 21, 50])
    got = overlong_penalty(lengths, max_len=20, cache=4)
    expected = torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0])
    torch.testing.assert_close(got, expected)


def test_hard_punishment_with_no_cache() -> None:
    # L_c = 0: 0 up to L_max = 5, −1 beyond
    got = overlong_penalty(torch.tensor([4, 5, 6]), max_len=5, cache=0)
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -1.0]))


def reference(length: int, max_len: int, cache: int) -> float:
    if length <= max_len - cache:
        return 0.0
    if length <= max_len:
        return ((max_len - cache) - length) / cache
    return -1.0


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 64).flatmap(
        lambda max_len: st.tuples(
            st.just(max_len),
            st.integers(1, max_len),
            st.lists(st.integers(0, 2 * max_len), min_size=1, max_size=16),
        )
    )
)
def test_matches_reference_loop(case: tuple[int, int, list[int]]) -> None:
    max_len, cache, lengths = case
    got = overlong_penalty(torch.tensor(lengths), max_len, cache).tolist()
    want = [reference(n, max_len, cache) for n in lengths]
    assert got == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize(("max_len", "cache"), [(20, 4), (100, 37), (8, 8), (8, 0)])
def test_monotone_non_increasing_and_bounded(max_len: int, cache: int) -> None:
    lengths = torch.arange(0, 3 * max_len)
    r = overlong_penalty(lengths, max_len, cache)
    assert torch.all(r[1:] <= r[:-1])
    assert torch.all((r <= 0) & (r >= -1))


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), max_len=4, cache=5)
    with pytest.raises(ValueError):
        overlong_penalty(torch.tensor([1]), max_len=4, cache=-1)
