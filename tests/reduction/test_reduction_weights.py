"""Reductions as per-token weights: hand cases, a reference loop, properties."""

from __future__ import annotations

import pytest
import torch

from rlmap.core.errors import ConfigError, UnknownComponentError
from rlmap.reduction import (
    Denominator,
    ReductionParams,
    check_params,
    denominator,
    reduce,
    registry,
    token_weights,
)

# Three rows: |o| = 2, 1, 0 (an empty row still counts in B = 3), N = 3 tokens.
MASK = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.bool)
J = torch.tensor([[2.0, 4.0, 100.0], [100.0, 6.0, 100.0], [100.0, 100.0, 100.0]])


def test_response_mean_hand_case() -> None:
    # row 0: (2 + 4) / 2 = 3; row 1: 6 / 1 = 6; row 2: empty, contributes 0
    # loss = (3 + 6 + 0) / B = 9 / 3 = 3
    w = token_weights(MASK, ReductionParams("response_mean"))
    # weights: row 0 1/(2·3) = 1/6 per token, row 1 1/(1·3) = 1/3, row 2 zero
    expected_w = torch.tensor([[1 / 6, 1 / 6, 0.0], [0.0, 1 / 3, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(reduce(J, w), torch.tensor(3.0))


def test_token_mean_hand_case() -> None:
    # (2 + 4 + 6) / N = 12 / 3 = 4
    w = token_weights(MASK, ReductionParams("token_mean"))
    torch.testing.assert_close(reduce(J, w), torch.tensor(4.0))


def test_fixed_budget_hand_case() -> None:
    # (2 + 4 + 6) / (B · L_max) = 12 / (3 · 4) = 1
    w = token_weights(MASK, ReductionParams("fixed_budget", max_len=4))
    torch.testing.assert_close(reduce(J, w), torch.tensor(1.0))


def test_denominator_counts_and_sum() -> None:
    # B = 3 rows (the empty one included), N = 2 + 1 + 0 = 3 tokens
    assert denominator(MASK) == Denominator(sequences=3, tokens=3)
    # two ranks' shards: rows {0} and {1, 2} -> (1, 2) + (2, 1) = (3, 3)
    shards = [denominator(MASK[:1]), denominator(MASK[1:])]
    assert shards[0] + shards[1] == Denominator(3, 3)
    assert sum(shards) == Denominator(3, 3)
    with pytest.raises(ValueError):
        Denominator(-1, 0)


def reference_loss(mask: list[list[int]], j: list[list[float]], name: str, max_len: int) -> float:
    """The three formulas of FORMULAS.md §5, written the obvious way with Python floats."""
    b = len(mask)
    n_tokens = sum(sum(row) for row in mask)
    if name == "response_mean":
        total = 0.0
        for m_row, j_row in zip(mask, j, strict=True):
            length = sum(m_row)
            if length > 0:
                total += sum(mi * ji for mi, ji in zip(m_row, j_row, strict=True)) / length
        return total / b
    masked_sum = 0.0
    for m_row, j_row in zip(mask, j, strict=True):
        for mi, ji in zip(m_row, j_row, strict=True):
            if mi:
                masked_sum += ji
    if name == "token_mean":
        return masked_sum / n_tokens if n_tokens else 0.0
    return masked_sum / (b * max_len)


@pytest.mark.parametrize("name", ["response_mean", "token_mean", "fixed_budget"])
@pytest.mark.parametrize("seed", range(5))
def test_matches_reference_loop(name: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 9
    mask = torch.rand(b, t, generator=g) < 0.6
    mask[0] = False  # always one empty row
    j = torch.randn(b, t, generator=g, dtype=torch.float64)
    w = token_weights(mask, ReductionParams(name, max_len=t))
    want = reference_loss(mask.int().tolist(), j.tolist(), name, t)
    assert reduce(j, w).item() == pytest.approx(want, rel=1e-6, abs=1e-9)


def test_fixed_budget_independent_of_other_lengths() -> None:
    # Row 0 is the same in both batches; the other rows' lengths (and N) differ.
    short = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)  # N = 3
    long = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)  # N = 6
    p = ReductionParams("fixed_budget", max_len=4)
    w_short, w_long = token_weights(short, p), token_weights(long, p)
    torch.testing.assert_close(w_short[0], w_long[0])
    # every action token weighs 1 / (B · L_max) = 1 / (2 · 4) = 0.125
    assert torch.all(w_long[long] == 0.125)
    # token_mean, by contrast, depends on N: 1/3 vs 1/6
    tm = ReductionParams("token_mean")
    assert token_weights(short, tm)[0, 0] != token_weights(long, tm)[0, 0]


@pytest.mark.parametrize("name", ["response_mean", "token_mean", "fixed_budget"])
def test_masking_never_changes_a_denominator(name: str) -> None:
    # Zeroing a token's loss (IcePop-style masking) leaves the other weights alone.
    p = ReductionParams(name, max_len=3)
    w = token_weights(MASK, p)
    j_masked = J.clone()
    j_masked[0, 1] = 0.0
    # only the masked token's term disappears: loss drops by w[0,1] · J[0,1]
    torch.testing.assert_close(reduce(j_masked, w), reduce(J, w) - w[0, 1] * J[0, 1])


def test_weights_zero_off_mask_and_sum_to_one_where_expected() -> None:
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(5, 7, generator=g) < 0.5
    mask[:, 0] = True  # no empty rows
    for name in ("response_mean", "token_mean"):
        w = token_weights(mask, ReductionParams(name))
        assert torch.all(w[~mask] == 0)
        # both are means: constant j = 1 reduces to 1
        torch.testing.assert_close(w.sum(), torch.tensor(1.0))


def test_reduce_ignores_non_finite_padding() -> None:
    w = token_weights(MASK, ReductionParams("token_mean"))
    j = J.clone()
    j[2, 2] = float("nan")
    j[1, 0] = float("inf")
    torch.testing.assert_close(reduce(j, w), torch.tensor(4.0))
    with pytest.raises(ValueError):
        reduce(J[:2], w)


def test_registry_and_params_errors() -> None:
    assert registry.names() == ("response_mean", "token_mean", "fixed_budget")
    assert registry.get("fixed_budget").needs_max_len
    assert not registry.get("token_mean").needs_max_len
    with pytest.raises(UnknownComponentError, match="known: response_mean"):
        token_weights(MASK, ReductionParams("seq_mean"))
    with pytest.raises(ConfigError, match=r"^reduction\.max_len"):
        check_params(ReductionParams("fixed_budget"))
    with pytest.raises(ConfigError, match=r"^reduction\.max_len"):
        token_weights(MASK, ReductionParams("fixed_budget", max_len=0))
