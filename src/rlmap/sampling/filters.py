"""Group filters: which sampled trajectories enter the training batch.

Every filter has the same signature ``fn(rewards_B, group_id_B, valid_B) -> keep_B``
(all (B,); ``keep_B`` bool). An invalid trajectory (reward not OK, or aborted) is
never kept and never enters a group's statistics. Filtered trajectories were still
generated: they count in the budget (:func:`sampling_counters`, the step's ``sampling/*``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from rlmap.core.registry import Registry

FilterFn = Callable[[Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class GroupFilter:
    """A registry entry: the filter function and what a run needs to know about it."""

    fn: FilterFn
    """``fn(rewards_B, group_id_B, valid_B) -> keep_B`` (bool)."""
    needs_group: bool
    """Whether the filter is meaningless with G = 1 (a configuration error then)."""
    summary: str
    """One line: which trajectories are kept."""
    paper: str
    """Where the filter comes from."""


def keep_valid(rewards_B: Tensor, group_id_B: Tensor, valid_B: Tensor) -> Tensor:
    """keep_i = valid_i: every trajectory whose reward can be trusted. Shapes (B,) → (B,)."""
    return valid_B.bool().clone()


def keep_mixed(rewards_B: Tensor, group_id_B: Tensor, valid_B: Tensor) -> Tensor:
    """DAPO dynamic sampling: keep_i = valid_i ∧ (max_{j∈g, valid} R_j > min_{j∈g, valid} R_j).

    A group whose valid rewards are all equal (all correct, all wrong, or only one
    valid member) gives every member a zero group-relative advantage, so it carries
    no gradient and is dropped (Yu et al. 2025, DAPO, eq. 11: 0 < |{o_i correct}| < G).
    Shapes: all (B,); ``group_id_B`` any integer labels.

    Differs from the paper: the test runs over the group's *valid* trajectories only
    (an infrastructure failure is not a reward), and rewards are compared exactly,
    so it also applies to non-binary rewards. Differs from verl: a group with a
    single (valid) trajectory is not mixed and is dropped.
    """
    valid = valid_B.bool()
    _, group = torch.unique(group_id_B, return_inverse=True)  # (B,) in [0, B)
    r = rewards_B.to(torch.float64)
    # one slot per possible group (≤ B, so no count is read back); unused slots stay ±inf
    inf = torch.full_like(r, float("inf"))  # (B,)
    low = inf.scatter_reduce(0, group, torch.where(valid, r, inf), "amin")  # (B,)
    high = (-inf).scatter_reduce(0, group, torch.where(valid, r, -inf), "amax")  # (B,)
    mixed = high > low  # False for groups with < 2 valid members or all-equal rewards
    return valid & mixed[group]


def sampling_counters(
    tokens: Sequence[int], trusted: Sequence[bool], kept: int, rounds: int
) -> dict[str, float]:
    """The step's ``sampling/*`` counters, the same in both loops (docs/metrics.md).

    ``tokens``: the action tokens of each trajectory the step generated (synchronous) or
    took from the queue (asynchronous), kept or not; ``trusted``: whether each one's reward
    status is OK; ``kept``: how many it trains on; ``rounds``: how many times it went back
    for trajectories (rollout rounds, or takes from the queue). Filtered, stale and rejected
    trajectories count here: they were generated, and they cost budget.
    """
    n = len(tokens)
    return {
        "sampling/rounds": float(rounds),
        "sampling/generated": float(n),
        "sampling/generated_tokens": float(sum(tokens)),
        "sampling/kept": float(kept),
        "sampling/kept_frac": kept / n if n else 0.0,
        "sampling/rejected": float(sum(not t for t in trusted)),
    }


registry: Registry[GroupFilter] = Registry("group filter")
registry.add(
    "none",
    GroupFilter(
        fn=keep_valid,
        needs_group=False,
        summary="keep every valid trajectory",
        paper="-",
    ),
)
registry.add(
    "mixed",
    GroupFilter(
        fn=keep_mixed,
        needs_group=True,
        summary="keep only groups whose valid rewards are not all equal (dynamic sampling)",
        paper="Yu et al. 2025, DAPO (dynamic sampling)",
    ),
)
