"""Unbiased pass@k against brute-force enumeration of k-subsets."""

from __future__ import annotations

import itertools

import pytest
import torch

from rlmap.diagnostics.passk import pass_at_k, pass_at_k_tensor


def brute_force(correct: list[int], k: int) -> float:
    """Fraction of all k-subsets of the samples that contain at least one correct one."""
    subsets = list(itertools.combinations(correct, k))
    return sum(1 for s in subsets if any(s)) / len(subsets)


CASES = [(n, c, k) for n in range(1, 9) for c in range(n + 1) for k in range(1, n + 1)]


@pytest.mark.parametrize(("n", "c", "k"), CASES)
def test_matches_enumeration(n: int, c: int, k: int) -> None:
    correct = [1] * c + [0] * (n - c)
    assert pass_at_k(n, c, k) == pytest.approx(brute_force(correct, k), abs=1e-12)


def test_hand_case() -> None:
    # n = 4, c = 1, k = 2: C(3, 2)/C(4, 2) = 3/6, so pass@2 = 1 − 1/2 = 0.5
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    # n = 5, c = 2, k = 3: C(3, 3)/C(5, 3) = 1/10, so pass@3 = 0.9
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_vectorised_over_prompts_with_different_n(k: int) -> None:
    rows = [(n, c) for n, c, kk in CASES if kk == k]  # every (n, c) with n >= k
    n_p = torch.tensor([n for n, _ in rows])
    c_p = torch.tensor([c for _, c in rows])
    got = pass_at_k_tensor(n_p, c_p, k)
    want = torch.tensor([brute_force([1] * c + [0] * (n - c), k) for n, c in rows])
    torch.testing.assert_close(got, want.double())


@pytest.mark.parametrize(("n", "c"), [(10, 3), (200, 7), (1000, 1), (16, 0), (16, 16)])
def test_pass_at_1_is_c_over_n(n: int, c: int) -> None:
    assert pass_at_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)


@pytest.mark.parametrize(("n", "c"), [(10, 3), (64, 5), (1000, 2)])
def test_monotone_in_k(n: int, c: int) -> None:
    curve = [pass_at_k(n, c, k) for k in range(1, n + 1, max(1, n // 50))]
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(curve))


def test_large_n_is_stable() -> None:
    # binomials of 10^4 overflow floats; the product does not. c = 0 -> 0; n − c < k -> 1
    assert pass_at_k(10_000, 0, 100) == 0.0
    assert pass_at_k(10_000, 9_950, 100) == 1.0
    assert 0.0 < pass_at_k(10_000, 10, 100) < 1.0


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 0)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)
    with pytest.raises(ValueError, match="exceeds"):
        pass_at_k_tensor(torch.tensor([5, 2]), torch.tensor([1, 1]), 3)
