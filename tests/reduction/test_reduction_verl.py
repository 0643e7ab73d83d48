"""rlmap's reductions against verl's own ``agg_loss``, on the same tensors.

verl/trainer/ppo/core_algos.py::agg_loss (verl 0.9.1) is a pure torch function; where its
modes and rlmap's reductions define the same loss, the two must agree, on one process and
summed over data-parallel ranks and micro-batches. ``prompt_mean`` has no verl counterpart
(it is SkyRL's; its reference loop is in test_reduction_weights.py).

Skipped unless verl imports: ``make test`` installs it beside rlmap (tests/anchors.py;
importing core_algos pulls in verl.protocol → tensordict, and the config classes →
omegaconf; nothing else of verl's requirements is needed).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from anchors import anchor
from torch import Tensor

from rlmap.reduction import ReductionParams, reduce, split_indices, token_weights

core_algos = anchor("verl.trainer.ppo.core_algos")

L_MAX = 6
SAME: dict[str, str] = {
    "token_mean": "token-mean",
    "token_sum": "token-sum",
    "seq_mean_token_sum": "seq-mean-token-sum",
    "response_mean": "seq-mean-token-mean",
    "fixed_budget": "seq-mean-token-sum-norm",
}
"""rlmap reduction → the verl loss_agg_mode that computes the same loss, given the global
counts (verl's trainer passes global_batch_size = the mini-batch's rows, as rlmap's B)."""


def _case(seed: int, b: int = 9) -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, L_MAX, generator=g) < 0.6
    mask[2] = False  # an empty row: counts in rlmap's B
    return torch.randn(b, L_MAX, generator=g, dtype=torch.float64), mask


def _verl(j: Tensor, mask: Tensor, mode: str, *, b: int, n: int, dp: int = 1) -> Tensor:
    """verl's loss of these rows, given the global mini-batch's B and N."""
    kw: dict[str, Any] = {
        "dp_size": dp,
        "batch_num_tokens": n,
        "global_batch_size": b,
        "loss_scale_factor": L_MAX,
    }
    return core_algos.agg_loss(j, mask.to(j.dtype), mode, **kw)


def _rlmap(j: Tensor, mask: Tensor, name: str) -> Tensor:
    return reduce(j, token_weights(mask, ReductionParams(name, max_len=L_MAX)))


@pytest.mark.parametrize("name", SAME)
@pytest.mark.parametrize("seed", range(3))
def test_one_process_matches_verl(name: str, seed: int) -> None:
    j, mask = _case(seed)
    want = _verl(j, mask, SAME[name], b=mask.shape[0], n=int(mask.sum()))
    # seq-mean-token-mean divides by |o_i| + 1e-8: a relative gap of about 1e-8
    torch.testing.assert_close(_rlmap(j, mask, name), want, rtol=1e-7, atol=0)


@pytest.mark.parametrize("name", SAME)
def test_ranks_and_micro_batches_match_verl(name: str) -> None:
    # verl: each rank's micro-batch loss is scaled by dp_size, and DDP averages the ranks'
    # gradients, so the update follows (Σ_ranks Σ_micro loss) / dp. rlmap: the ranks' Σ w·j
    # are summed. Rows 0-3 on rank 0 (micro-batches of 3), 4-8 on rank 1 (of 2).
    j, mask = _case(7)
    b, n = mask.shape[0], int(mask.sum())
    ranks = [torch.arange(0, 4), torch.arange(4, 9)]
    w = token_weights(mask, ReductionParams(name, max_len=L_MAX))  # the global mini-batch's
    ours, theirs = torch.zeros((), dtype=j.dtype), torch.zeros((), dtype=j.dtype)
    for rows, micro in zip(ranks, (3, 2), strict=True):
        for ix in split_indices(len(rows), micro):
            r = rows[ix]
            ours = ours + reduce(j[r], w[r])
            theirs = theirs + _verl(j[r], mask[r], SAME[name], b=b, n=n, dp=2) / 2
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=0)
    torch.testing.assert_close(ours, _rlmap(j, mask, name), rtol=1e-12, atol=1e-12)


def test_verl_default_batch_leaves_out_empty_rows() -> None:
    # Without global_batch_size verl's seq-mean-token-sum divides by the rows that have an
    # action token (B' = 8 of 9 here); rlmap's B counts the empty row: a ratio of 8/9.
    j, mask = _case(0)
    verl_default = core_algos.agg_loss(j, mask.to(j.dtype), "seq-mean-token-sum")
    ours = _rlmap(j, mask, "seq_mean_token_sum")
    torch.testing.assert_close(ours, verl_default * 8 / 9)
