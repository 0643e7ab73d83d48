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

NAMES = [
    "response_mean",
    "token_mean",
    "fixed_budget",
    "prompt_mean",
    "token_sum",
    "seq_mean_token_sum",
]

# Three rows: |o| = 2, 1, 0 (an empty row still counts in B = 3), N = 3 tokens.
MASK = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 0]], dtype=torch.bool)
J = torch.tensor([[2.0, 4.0, 100.0], [100.0, 6.0, 100.0], [100.0, 100.0, 100.0]])
GROUPS = torch.tensor([7, 7, 3])  # rows 0-1 answer prompt 7, the empty row 2 prompt 3


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


def test_prompt_mean_hand_case() -> None:
    # group 7: rows 0-1, N_7 = 2 + 1 = 3 tokens, token mean (2 + 4 + 6) / 3 = 4
    # group 3: the empty row 2, N_3 = 0: weighs 0 but still counts in P = 2 (as in SkyRL)
    # loss = (4 + 0) / P = 4 / 2 = 2; each token of group 7 weighs 1 / (N_7 · P) = 1/6
    w = token_weights(MASK, ReductionParams("prompt_mean"), group_id=GROUPS)
    expected_w = torch.tensor([[1 / 6, 1 / 6, 0.0], [0.0, 1 / 6, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(w, expected_w)
    torch.testing.assert_close(reduce(J, w), torch.tensor(2.0))


def test_prompt_mean_hand_case_two_prompts() -> None:
    # prompt 0: responses (1, 2, 3) and (4, 5, pad), N_0 = 5, token mean 15 / 5 = 3
    # prompt 1: response (6, 6, 6), N_1 = 3, token mean 18 / 3 = 6
    # prompt_mean = (3 + 6) / 2 = 4.5; token_mean = 33 / 8 = 4.125;
    # response_mean = (6/3 + 9/2 + 18/3) / 3 = (2 + 4.5 + 6) / 3 = 4.1667
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    j = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0], [6.0, 6.0, 6.0]])
    groups = torch.tensor([0, 0, 1])
    got = {
        n: float(reduce(j, token_weights(mask, ReductionParams(n), group_id=groups)))
        for n in ("prompt_mean", "token_mean", "response_mean")
    }
    assert got == pytest.approx(
        {"prompt_mean": 4.5, "token_mean": 4.125, "response_mean": 12.5 / 3}
    )


def test_token_sum_hand_case() -> None:
    # no denominator: 2 + 4 + 6 = 12; every action token weighs 1
    w = token_weights(MASK, ReductionParams("token_sum"))
    torch.testing.assert_close(w, MASK.float())
    torch.testing.assert_close(reduce(J, w), torch.tensor(12.0))


def test_seq_mean_token_sum_hand_case() -> None:
    # responses (1, 2, 3) and (4, 5, pad): token sums 6 and 9, mean over B = 2: 15 / 2 = 7.5
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    j = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0]])
    p = ReductionParams("seq_mean_token_sum")
    torch.testing.assert_close(reduce(j, token_weights(mask, p)), torch.tensor(7.5))
    # an empty third row counts in B = 3: 15 / 3 = 5 (verl's B' would leave it out: 7.5)
    empty = torch.cat([mask, torch.zeros(1, 3, dtype=torch.bool)])
    j3 = torch.cat([j, torch.full((1, 3), 99.0)])
    torch.testing.assert_close(reduce(j3, token_weights(empty, p)), torch.tensor(5.0))


def test_denominator_counts_and_sum() -> None:
    # B = 3 rows (the empty one included), N = 2 + 1 + 0 = 3 tokens
    assert denominator(MASK) == Denominator(sequences=3, tokens=3)
    # two ranks' shards: rows {0} and {1, 2} -> (1, 2) + (2, 1) = (3, 3)
    shards = [denominator(MASK[:1]), denominator(MASK[1:])]
    assert shards[0] + shards[1] == Denominator(3, 3)
    assert sum(shards) == Denominator(3, 3)
    with pytest.raises(ValueError):
        Denominator(-1, 0)


def test_denominator_group_counts_and_sum() -> None:
    # group 7: rows 0-1, 2 + 1 = 3 tokens; group 3: the empty row, 0 tokens (still listed)
    d = denominator(MASK, GROUPS)
    assert d == Denominator(3, 3, ((3, 0), (7, 3)))
    assert d.groups == 2
    # shards {row 0} and {rows 1, 2} split group 7: its counts add up, it counts once in P
    shards = [denominator(MASK[:1], GROUPS[:1]), denominator(MASK[1:], GROUPS[1:])]
    assert shards[0] == Denominator(1, 2, ((7, 2),))
    assert sum(shards) == d
    assert denominator(MASK).group_tokens is None and denominator(MASK).groups == 0
    with pytest.raises(ValueError, match="with group ids to counts without"):
        _ = shards[0] + denominator(MASK[1:])
    with pytest.raises(ValueError):
        Denominator(1, 1, ((0, -1),))


def reference_loss(
    mask: list[list[int]], j: list[list[float]], name: str, max_len: int, groups: list[int]
) -> float:
    """The formulas of docs/formulas.md §5, written the obvious way with Python floats.

    prompt_mean follows SkyRL's apply_loss_reduction_to_advantages_minibatch
    (skyrl/backends/skyrl_train/utils/ppo_utils.py): per prompt, Σ m·j / max(1, Σ m), then
    the mean over the prompts of the mini-batch. token_sum and seq_mean_token_sum follow verl's
    agg_loss (verl/trainer/ppo/core_algos.py, 0.9.1) with dp_size = 1 and global_batch_size = B.
    """
    b = len(mask)
    n_tokens = sum(sum(row) for row in mask)
    row_sums = [0.0] * b  # Σ_t m_{i,t} j_{i,t}
    for i in range(b):
        for t in range(len(mask[i])):
            if mask[i][t]:
                row_sums[i] += j[i][t]
    if name == "response_mean":
        return sum(row_sums[i] / sum(mask[i]) for i in range(b) if sum(mask[i]) > 0) / b
    if name == "prompt_mean":
        prompts = sorted(set(groups))
        per_prompt = []
        for g in prompts:
            rows = [i for i in range(b) if groups[i] == g]
            tokens = sum(sum(mask[i]) for i in rows)
            per_prompt.append(sum(row_sums[i] for i in rows) / max(1, tokens))  # SkyRL: clamp 1
        return sum(per_prompt) / len(prompts)
    masked_sum = sum(row_sums)
    if name == "token_mean":
        return masked_sum / n_tokens if n_tokens else 0.0
    if name == "token_sum":
        return masked_sum
    if name == "seq_mean_token_sum":
        return masked_sum / b
    return masked_sum / (b * max_len)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", range(5))
def test_matches_reference_loop(name: str, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    b, t = 6, 9
    mask = torch.rand(b, t, generator=g) < 0.6
    mask[0] = False  # always one empty row
    j = torch.randn(b, t, generator=g, dtype=torch.float64)
    groups = torch.randint(0, 3, (b,), generator=g) * 5  # ids 0, 5, 10, rows not contiguous
    w = token_weights(mask, ReductionParams(name, max_len=t), group_id=groups)
    want = reference_loss(mask.int().tolist(), j.tolist(), name, t, groups.tolist())
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


@pytest.mark.parametrize("name", NAMES)
def test_masking_never_changes_a_denominator(name: str) -> None:
    # Zeroing a token's loss (IcePop-style masking) leaves the other weights alone.
    p = ReductionParams(name, max_len=3)
    w = token_weights(MASK, p, group_id=GROUPS)
    j_masked = J.clone()
    j_masked[0, 1] = 0.0
    # only the masked token's term disappears: loss drops by w[0,1] · J[0,1]
    torch.testing.assert_close(reduce(j_masked, w), reduce(J, w) - w[0, 1] * J[0, 1])


def test_weights_zero_off_mask_and_sum_to_one_where_expected() -> None:
    g = torch.Generator().manual_seed(0)
    mask = torch.rand(5, 7, generator=g) < 0.5
    mask[:, 0] = True  # no empty rows
    groups = torch.tensor([0, 2, 2, 1, 2])
    for name in ("response_mean", "token_mean", "prompt_mean"):
        w = token_weights(mask, ReductionParams(name), group_id=groups)
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
    assert registry.names() == tuple(NAMES)
    assert registry.get("fixed_budget").needs_max_len
    assert not registry.get("token_mean").needs_max_len
    with pytest.raises(UnknownComponentError, match="known: response_mean"):
        token_weights(MASK, ReductionParams("seq_mean"))
    with pytest.raises(ConfigError, match=r"^reduction\.max_len"):
        check_params(ReductionParams("fixed_budget"))
    with pytest.raises(ConfigError, match=r"^reduction\.max_len"):
        token_weights(MASK, ReductionParams("fixed_budget", max_len=0))


def test_prompt_mean_needs_group_ids() -> None:
    p = ReductionParams("prompt_mean")
    with pytest.raises(ValueError, match="'prompt_mean' needs each row's group_id"):
        token_weights(MASK, p)
    with pytest.raises(ValueError, match="needs a Denominator with group_tokens"):
        token_weights(MASK, p, denom=denominator(MASK), group_id=GROUPS)
    with pytest.raises(ValueError, match=r"group ids \[3\] not in the denominator"):
        token_weights(MASK, p, denom=denominator(MASK[:2], GROUPS[:2]), group_id=GROUPS)
    # the other reductions ignore group ids
    torch.testing.assert_close(
        token_weights(MASK, ReductionParams("token_mean"), group_id=GROUPS),
        token_weights(MASK, ReductionParams("token_mean")),
    )


def _random_case(seed: int, b: int = 8, t: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, t, generator=g) < 0.6
    mask[:, 0] = True  # no empty row
    return mask, torch.randn(b, t, generator=g, dtype=torch.float64)


def _loss(mask: torch.Tensor, j: torch.Tensor, name: str, groups: torch.Tensor) -> float:
    return float(reduce(j, token_weights(mask, ReductionParams(name, max_len=6), group_id=groups)))


@pytest.mark.parametrize("seed", range(3))
def test_prompt_mean_with_groups_of_one_is_response_mean(seed: int) -> None:
    # G = 1: each prompt's token mean is its one response's token mean and P = B
    mask, j = _random_case(seed)
    mask[3] = False  # an empty row: weighs 0 in both, counts in B and in P alike
    own = torch.arange(8)
    assert _loss(mask, j, "prompt_mean", own) == pytest.approx(_loss(mask, j, "response_mean", own))


@pytest.mark.parametrize("seed", range(3))
def test_prompt_mean_with_equal_lengths_and_group_sizes_is_token_mean(seed: int) -> None:
    # every response L tokens, every group G rows: N_g = G·L and P·G·L = N, so each token
    # weighs 1/(G·L·P) = 1/N; with G = 1 this is also response_mean
    _, j = _random_case(seed)
    mask = torch.zeros(8, 6, dtype=torch.bool)
    mask[:, :4] = True  # L = 4
    groups = torch.tensor([2, 0, 1, 3, 0, 2, 3, 1])  # P = 4 groups of G = 2, interleaved
    tm = _loss(mask, j, "token_mean", groups)
    assert _loss(mask, j, "prompt_mean", groups) == pytest.approx(tm)
    assert _loss(mask, j, "response_mean", groups) == pytest.approx(tm)
    # unequal group sizes break it: a group of 1 row now weighs as much as a group of 3
    uneven = torch.tensor([0, 0, 0, 1, 2, 2, 3, 3])
    assert _loss(mask, j, "prompt_mean", uneven) != pytest.approx(tm)


@pytest.mark.parametrize("seed", range(3))
def test_prompt_mean_each_group_weighs_one_over_p(seed: int) -> None:
    mask, j = _random_case(seed)
    groups = torch.tensor([0, 0, 0, 0, 0, 1, 2, 2])  # a group of 5 long rows, one of 1 row
    w = token_weights(mask, ReductionParams("prompt_mean"), group_id=groups)
    for g in range(3):
        torch.testing.assert_close(w[groups == g].sum(), torch.tensor(1 / 3))  # P = 3
    # relabelling the groups and permuting the rows changes nothing
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(seed))
    relabelled = (groups * 7 + 100)[perm]
    assert _loss(mask[perm], j[perm], "prompt_mean", relabelled) == pytest.approx(
        _loss(mask, j, "prompt_mean", groups)
    )


@pytest.mark.parametrize("seed", range(3))
def test_sums_are_scaled_means(seed: int) -> None:
    mask, j = _random_case(seed)
    mask[5] = False  # an empty row still counts in B
    groups = torch.arange(8)
    n_tokens, b, max_len = int(mask.sum()), 8, 6
    token_sum = _loss(mask, j, "token_sum", groups)
    assert token_sum == pytest.approx(n_tokens * _loss(mask, j, "token_mean", groups))
    seq = _loss(mask, j, "seq_mean_token_sum", groups)
    assert seq == pytest.approx(token_sum / b)
    assert seq == pytest.approx(max_len * _loss(mask, j, "fixed_budget", groups))


def test_token_sum_weights_ignore_the_rest_of_the_batch() -> None:
    # no denominator: a row's weights are its mask, whatever else is in the mini-batch
    short = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    long = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    p = ReductionParams("token_sum")
    torch.testing.assert_close(token_weights(short, p)[0], token_weights(long, p)[0])
