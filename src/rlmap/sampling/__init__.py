"""Sampling axis: how many trajectories per prompt, and which groups are kept? (docs/formulas.md §7)

``SamplingParams`` sets G and the prompts per step; ``registry`` holds the group
filters (``none``, ``mixed`` = DAPO dynamic sampling), each
``fn(rewards_B, group_id_B, valid_B) -> keep_B``; ``sample_more`` and
``first_groups`` are the bookkeeping of the trainer's refill loop, ``sampling_counters``
its ``sampling/*`` metrics.
"""

from rlmap.sampling.filters import (
    GroupFilter,
    keep_mixed,
    keep_valid,
    registry,
    sampling_counters,
)
from rlmap.sampling.params import SamplingParams
from rlmap.sampling.refill import first_groups, sample_more

__all__ = [
    "GroupFilter",
    "SamplingParams",
    "first_groups",
    "keep_mixed",
    "keep_valid",
    "registry",
    "sample_more",
    "sampling_counters",
]
