"""The pinned denominator: counts of the whole optimiser mini-batch, taken once.

A reduction's denominator is fixed before any backward pass, over the whole
optimiser mini-batch (every micro-batch, every data-parallel rank), so the
gradient does not depend on how the batch is split (docs/formulas.md §5). Masking a
token or a row afterwards (IcePop, staleness, ...) zeroes its contribution and
never changes these counts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from torch import Tensor

GroupTokens = tuple[tuple[int, int], ...]
"""(group id g, N_g) pairs sorted by g: one per prompt group present in the mini-batch."""


@dataclass(frozen=True)
class Denominator:
    """The counts every reduction's weights are built from."""

    sequences: int
    """B: trajectories (rows) in the whole optimiser mini-batch, over all micro-batches and all
    data-parallel ranks; rows with no action token count too."""
    tokens: int
    """Σ_{i,t} m_{i,t}: action tokens in the whole optimiser mini-batch."""
    group_tokens: GroupTokens | None = None
    """N_g = Σ_{i∈g} Σ_t m_{i,t} for every prompt group g with a row in the mini-batch,
    as sorted (g, N_g) pairs; a group whose rows have no action token is listed with 0 and
    still counts in P. None when the group ids were not given (only ``prompt_mean`` reads it)."""

    def __post_init__(self) -> None:
        counts = [n for _, n in self.group_tokens or ()]
        if self.sequences < 0 or self.tokens < 0 or any(n < 0 for n in counts):
            raise ValueError(f"Denominator counts must be >= 0, got {self}")

    @property
    def groups(self) -> int:
        """P: prompt groups with at least one row in the mini-batch (0 without group ids)."""
        return len(self.group_tokens or ())

    def __add__(self, other: Denominator) -> Denominator:
        """Counts of two disjoint shards (micro-batches or ranks) together.

        A group split between the shards is one group: its N_g are added, it counts once in P.
        """
        if not isinstance(other, Denominator):
            return NotImplemented
        return Denominator(
            self.sequences + other.sequences,
            self.tokens + other.tokens,
            _merged(self.group_tokens, other.group_tokens),
        )

    def __radd__(self, other: object) -> Denominator:
        # lets the builtin ``sum(per_rank_denominators)`` start from 0
        if other == 0:
            return self
        return NotImplemented


def _merged(a: GroupTokens | None, b: GroupTokens | None) -> GroupTokens | None:
    """Per-group token counts of two shards, summed group by group."""
    if a is None and b is None:
        return None
    if a is None or b is None:
        raise ValueError("Denominator: cannot add counts with group ids to counts without them")
    total = Counter(dict(a))
    total.update(dict(b))
    return tuple(sorted(total.items()))


def denominator(mask_BT: Tensor, group_B: Tensor | None = None) -> Denominator:
    """Counts of one process's rows: B = rows of ``mask_BT``, N = Σ_{i,t} m_{i,t}, and N_g.

    Shapes: ``mask_BT`` (B, T) bool or 0/1; ``group_B`` (B,) long group ids (``Batch.group_id``),
    needed by ``prompt_mean`` only. Reads the counts back from the device; call it once per
    optimiser mini-batch, not per micro-batch.

    Data-parallel ranks: each rank calls this on its own shard of rows, then the
    counts are summed over ranks before any weights are computed, e.g.::

        local = denominator(mask_BT)
        counts = torch.tensor([local.sequences, local.tokens], device=mask_BT.device)
        torch.distributed.all_reduce(counts)          # SUM over ranks
        denom = Denominator(*(int(x) for x in counts.tolist()))

    (with gathered per-rank counts, ``sum(per_rank)`` gives the same, the per-group counts
    included: ``Denominator`` supports ``+``). rlmap's learner needs neither: every rank holds
    the global mini-batch and counts it whole. This module does not import ``torch.distributed``.
    """
    group_tokens = None
    if group_B is not None:
        lengths = mask_BT.sum(-1).tolist()  # (B,) |o_i|
        per_group: Counter[int] = Counter()
        for g, n in zip(group_B.tolist(), lengths, strict=True):
            per_group[int(g)] += int(n)  # a group of empty rows stays in, with N_g = 0
        group_tokens = tuple(sorted(per_group.items()))
    return Denominator(int(mask_BT.shape[0]), int(mask_BT.sum()), group_tokens)
