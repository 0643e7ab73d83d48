"""Micro-batch (and data-parallel) invariance of every reduction's gradient."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

from rlmap.core.batch import Batch, make_batch
from rlmap.reduction import (
    ReductionParams,
    denominator,
    microbatches,
    reduce,
    split_indices,
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
V, D, B, T = 11, 5, 7, 8


class TinyPolicy(nn.Module):
    """log π(target | token) from an embedding and a linear head, in float64."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed = nn.Embedding(V, D).double()
        self.head = nn.Linear(D, V).double()

    def per_token_loss(self, batch: Batch) -> Tensor:
        """j_{i,t} = −A_i · log π(y_{i,t}), with A_i = R_i (a pg-style loss). (B, T)"""
        logits = self.head(self.embed(batch.tokens))  # (B, T, V)
        targets = (batch.tokens * 3 + 1) % V  # (B, T)
        logp = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        return -batch.rewards.double().unsqueeze(-1) * logp


def random_batch(seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)  # uneven, may be 0 or T
    lengths[0], lengths[1] = 1, T  # make sure the lengths really differ
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(-1)  # (B, T)
    rewards = torch.randn(B, generator=g)
    tokens = torch.randint(0, V, (B, T), generator=g)
    groups = torch.tensor([4, 1, 4, 9, 1, 4, 9])  # 3 prompts of 3, 2, 2 rows, not contiguous
    return make_batch(mask, rewards, group_id=groups).replace(tokens=tokens)


def grads(model: TinyPolicy, loss: Tensor) -> list[Tensor]:
    return list(torch.autograd.grad(loss, list(model.parameters())))


def full_grad(model: TinyPolicy, batch: Batch, p: ReductionParams) -> list[Tensor]:
    w = token_weights(batch.action_mask, p, group_id=batch.group_id)
    return grads(model, reduce(model.per_token_loss(batch), w))


def summed_grad(model: TinyPolicy, pairs: list[tuple[Batch, Tensor]]) -> list[Tensor]:
    total = [torch.zeros_like(x) for x in model.parameters()]
    for mb, w in pairs:
        for acc, gr in zip(total, grads(model, reduce(model.per_token_loss(mb), w)), strict=True):
            acc += gr
    return total


def random_partition(g: torch.Generator) -> list[Tensor]:
    """Rows shuffled and cut at random points: uneven parts, possibly of size 1."""
    order = torch.randperm(B, generator=g)
    n_cuts = int(torch.randint(1, B, (1,), generator=g))
    cuts = torch.randperm(B - 1, generator=g)[:n_cuts].add(1).sort().values.tolist()
    return list(torch.tensor_split(order, cuts))


def assert_grads_close(a: list[Tensor], b: list[Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("micro_batch_size", [1, 2, 3, B])
@pytest.mark.parametrize("shuffle", [False, True])
def test_microbatches_sum_to_full_gradient(name: str, micro_batch_size: int, shuffle: bool) -> None:
    batch, model = random_batch(0), TinyPolicy(0)
    p = ReductionParams(name, max_len=T)
    w = token_weights(batch.action_mask, p, group_id=batch.group_id)
    g = torch.Generator().manual_seed(1)
    pairs = list(microbatches(batch, w, micro_batch_size, generator=g, shuffle=shuffle))
    assert_grads_close(summed_grad(model, pairs), full_grad(model, batch, p))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("seed", range(4))
def test_random_partitions_sum_to_full_gradient(name: str, seed: int) -> None:
    batch, model = random_batch(seed), TinyPolicy(seed)
    p = ReductionParams(name, max_len=T)
    w = token_weights(batch.action_mask, p, group_id=batch.group_id)
    parts = random_partition(torch.Generator().manual_seed(100 + seed))
    pairs = [(batch.select(ix), w[ix]) for ix in parts]
    assert_grads_close(summed_grad(model, pairs), full_grad(model, batch, p))


@pytest.mark.parametrize("name", NAMES)
def test_data_parallel_ranks_with_summed_denominator(name: str) -> None:
    # Two "ranks" hold disjoint rows; each computes weights from the rank-summed counts
    # and its own mask only, then the ranks' gradients are summed (not averaged).
    batch, model = random_batch(3), TinyPolicy(3)
    p = ReductionParams(name, max_len=T)
    # rows 0-3 and 4-6: prompts 1 and 4 are split between the ranks
    shards = [batch.select(ix) for ix in split_indices(B, 4)]
    global_denom = sum(denominator(s.action_mask, s.group_id) for s in shards)
    assert global_denom == denominator(batch.action_mask, batch.group_id)
    pairs = [
        (s, token_weights(s.action_mask, p, denom=global_denom, group_id=s.group_id))
        for s in shards
    ]
    assert_grads_close(summed_grad(model, pairs), full_grad(model, batch, p))


@pytest.mark.parametrize("name", [n for n in NAMES if n != "fixed_budget"])
def test_naive_per_microbatch_denominator_differs(name: str) -> None:
    # The usual gradient accumulation — each micro-batch reduced with its own
    # denominator, losses averaged over micro-batches — is not the full-batch
    # gradient when lengths (token_mean), micro-batch sizes (response_mean,
    # seq_mean_token_sum) or the groups a micro-batch holds (prompt_mean) are uneven:
    # B = 7 split into 3 + 3 + 1. token_sum has no denominator, but the average over
    # micro-batches divides it by 3. The invariance tests above can fail.
    batch, model = random_batch(0), TinyPolicy(0)
    p = ReductionParams(name)
    parts = split_indices(B, 3)
    naive = []
    for ix in parts:
        mb = batch.select(ix)
        w_own = token_weights(mb.action_mask, p, group_id=mb.group_id)  # recomputed: the bug
        naive.append((mb, w_own / len(parts)))
    wrong, right = summed_grad(model, naive), full_grad(model, batch, p)
    gap = max(float((x - y).abs().max()) for x, y in zip(wrong, right, strict=True))
    assert gap > 1e-4


def test_split_indices_cover_every_row_once() -> None:
    parts = split_indices(7, 3)
    # 7 = 3 + 3 + 1, in order
    assert [ix.tolist() for ix in parts] == [[0, 1, 2], [3, 4, 5], [6]]
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    shuffled = split_indices(10, 4, generator=g1, shuffle=True)
    assert [len(ix) for ix in shuffled] == [4, 4, 2]
    assert sorted(torch.cat(shuffled).tolist()) == list(range(10))
    again = split_indices(10, 4, generator=g2, shuffle=True)
    assert all(torch.equal(a, b) for a, b in zip(shuffled, again, strict=True))
    assert split_indices(0, 2) == []
    with pytest.raises(ValueError):
        split_indices(4, 0)


def test_microbatches_align_rows_and_weights() -> None:
    batch = random_batch(1)
    w = token_weights(batch.action_mask, ReductionParams("token_mean"))
    seen = []
    for mb, w_mb in microbatches(
        batch, w, 3, generator=torch.Generator().manual_seed(0), shuffle=True
    ):
        assert mb.size == w_mb.shape[0] <= 3
        # the weights travel with their rows: zero exactly off the sub-batch's mask
        assert torch.equal(w_mb != 0, mb.action_mask)
        seen.append(mb.tokens)
    assert sorted(map(tuple, torch.cat(seen).tolist())) == sorted(map(tuple, batch.tokens.tolist()))
    with pytest.raises(ValueError):
        next(microbatches(batch, w[:, :-1], 2))
