"""Bookkeeping of the dynamic-sampling refill loop; the loop itself is the trainer's.

DAPO (Yu et al. 2025) keeps sampling prompt batches until enough groups survive
the filter, or a cap on generation rounds is reached::

    keep_fn = registry.get(params.filter).fn
    parts, n_groups, rounds = [], 0, 0
    while sample_more(n_groups, params.prompts_per_step, rounds, params.max_rounds):
        rb = generate(next_prompts())                   # group ids unique across rounds
        keep = keep_fn(rb.rewards, rb.group_id, rb.valid)
        parts.append(rb.select(keep))                   # filtered ones still cost budget
        n_groups += int(torch.unique(rb.group_id[keep]).numel())
        rounds += 1
    batch = concatenate(parts)                          # the trainer's own helper
    all_rows = torch.ones(batch.size, dtype=torch.bool)
    batch = batch.select(first_groups(batch.group_id, all_rows, params.prompts_per_step))

When the cap is reached first, the step trains on the groups it has (possibly
fewer than the target); every generated trajectory counts in the budget.
"""

from __future__ import annotations

import torch
from torch import Tensor


def sample_more(kept_groups: int, target_groups: int, rounds_done: int, max_rounds: int) -> bool:
    """Whether to generate another round: kept_groups < target_groups and rounds_done < max_rounds.

    ``rounds_done`` counts the generation rounds already run this step (0 before
    the first), so the first round always runs and at most ``max_rounds`` run.
    """
    if min(kept_groups, rounds_done) < 0 or target_groups < 1 or max_rounds < 1:
        raise ValueError(
            f"sample_more: kept_groups={kept_groups}, target_groups={target_groups}, "
            f"rounds_done={rounds_done}, max_rounds={max_rounds}"
        )
    return kept_groups < target_groups and rounds_done < max_rounds


def first_groups(group_id_B: Tensor, keep_B: Tensor, target_groups: int) -> Tensor:
    """keep_B restricted to the first ``target_groups`` kept groups, in order of appearance.

    When the last round overfills the batch, the surplus groups are dropped whole
    (a group is never split). Shapes: (B,) → (B,) bool.
    """
    keep = keep_B.bool()
    _, group = torch.unique(group_id_B, return_inverse=True)  # (B,) in [0, B)
    b = group.numel()
    pos = torch.arange(b, device=group.device)  # (B,)
    # first kept row of each group slot (≤ B slots); b marks "no kept row"
    first = torch.full_like(pos, b).scatter_reduce(0, group, torch.where(keep, pos, b), "amin")
    order = first.argsort(stable=True)  # kept groups first, in order of appearance
    rank = torch.empty_like(order)
    rank[order] = pos
    return keep & (rank[group] < target_groups)
