"""Splitting an optimiser mini-batch into micro-batches without changing its gradient.

The learner computes the weights once for the whole mini-batch and then runs::

    weights_BT = token_weights(batch.action_mask, params)        # once, before any backward
    for mb, w_mb in microbatches(batch, weights_BT, micro_batch_size):
        reduce(loss(mb), w_mb).backward()                        # gradients accumulate
    optimizer.step()

Because a micro-batch's loss is Σ over its own rows of w_{i,t} j_{i,t} with the
mini-batch's weights, the accumulated gradient equals the full-batch gradient
for every reduction; no rescaling by the number of micro-batches is needed (or
allowed: that would recompute a denominator per micro-batch).

Data-parallel ranks shard the same way, one level up (:mod:`rlmap.learner.distributed`):
every rank holds the global batch, computes the weights of the *global* mini-batch,
and runs the loop above on the rows it owns. The full gradient is then the *sum* of
the ranks' gradients, so the ranks sum them (DDP: a summing communication hook; FSDP2:
a divide factor of 1) instead of averaging, which would divide by the world size.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from rlmap.core.batch import Batch


def split_indices(
    batch_size: int,
    micro_batch_size: int,
    *,
    generator: torch.Generator | None = None,
    shuffle: bool = False,
) -> list[Tensor]:
    """Row indices of each micro-batch: consecutive chunks of ``micro_batch_size``.

    The last chunk is smaller when ``micro_batch_size`` does not divide
    ``batch_size``. With ``shuffle`` the rows are permuted first (by ``generator``).
    Every row appears in exactly one chunk. Returns long tensors of shape (≤ mbs,).
    """
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    if batch_size < 0:
        raise ValueError(f"batch_size must be >= 0, got {batch_size}")
    rows = torch.randperm(batch_size, generator=generator) if shuffle else torch.arange(batch_size)
    return list(rows.split(micro_batch_size)) if batch_size else []


def microbatches(
    batch: Batch,
    weights_BT: Tensor,
    micro_batch_size: int,
    *,
    generator: torch.Generator | None = None,
    shuffle: bool = False,
) -> Iterator[tuple[Batch, Tensor]]:
    """Yield (sub-batch, its rows of ``weights_BT``) for each micro-batch.

    ``weights_BT`` (B, T) are the whole mini-batch's weights from
    :func:`~rlmap.reduction.apply.token_weights`; each yielded weight slice is
    (b, T) with b ≤ ``micro_batch_size``, aligned with the sub-batch's rows.
    """
    if tuple(weights_BT.shape) != tuple(batch.action_mask.shape):
        raise ValueError(
            f"microbatches: weights shape {tuple(weights_BT.shape)} "
            f"!= batch shape {tuple(batch.action_mask.shape)}"
        )
    for index in split_indices(batch.size, micro_batch_size, generator=generator, shuffle=shuffle):
        index = index.to(weights_BT.device)
        yield batch.select(index), weights_BT[index]
