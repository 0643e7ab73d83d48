"""The pinned denominator: counts of the whole optimiser mini-batch, taken once.

A reduction's denominator is fixed before any backward pass, over the whole
optimiser mini-batch (every micro-batch, every data-parallel rank), so the
gradient does not depend on how the batch is split (docs/formulas.md §5). Masking a
token or a row afterwards (IcePop, staleness, ...) zeroes its contribution and
never changes these counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class Denominator:
    """The two counts every reduction's weights are built from."""

    sequences: int
    """B: trajectories (rows) in the whole optimiser mini-batch, over all micro-batches and all
    data-parallel ranks; rows with no action token count too."""
    tokens: int
    """Σ_{i,t} m_{i,t}: action tokens in the whole optimiser mini-batch."""

    def __post_init__(self) -> None:
        if self.sequences < 0 or self.tokens < 0:
            raise ValueError(f"Denominator counts must be >= 0, got {self}")

    def __add__(self, other: Denominator) -> Denominator:
        """Counts of two disjoint shards (micro-batches or ranks) together."""
        if not isinstance(other, Denominator):
            return NotImplemented
        return Denominator(self.sequences + other.sequences, self.tokens + other.tokens)

    def __radd__(self, other: object) -> Denominator:
        # lets the builtin ``sum(per_rank_denominators)`` start from 0
        if other == 0:
            return self
        return NotImplemented


def denominator(mask_BT: Tensor) -> Denominator:
    """Counts of one process's rows: B = rows of ``mask_BT``, N = Σ_{i,t} m_{i,t}.

    Shapes: ``mask_BT`` (B, T) bool or 0/1. Reads one number back from the device;
    call it once per optimiser mini-batch, not per micro-batch.

    Data-parallel ranks: each rank calls this on its own shard of rows, then the
    two counts are summed over ranks before any weights are computed, e.g.::

        local = denominator(mask_BT)
        counts = torch.tensor([local.sequences, local.tokens], device=mask_BT.device)
        torch.distributed.all_reduce(counts)          # SUM over ranks
        denom = Denominator(*(int(x) for x in counts.tolist()))

    (with gathered per-rank counts, ``sum(per_rank)`` gives the same: ``Denominator``
    supports ``+``). This module does not import ``torch.distributed``.
    """
    return Denominator(sequences=int(mask_BT.shape[0]), tokens=int(mask_BT.sum()))
