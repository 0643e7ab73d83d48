"""The batch record's per-token columns of some rows (episodes or segments): kept sets,
routed experts and rewards, in :func:`rlmap.rollout.packing.to_batch`'s layout
(``[left-padded prompt | response]``, every prompt ending at column ``prompt_len``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlmap.models.routing import NO_ROUTE

RowRewards = tuple[float, tuple[float, ...] | None]
"""A row's rewards: R at its last action token, or per-turn rewards when not None."""


def row_rewards(
    reward: float, per_turn: Sequence[float] | None, turns: Sequence[int]
) -> list[RowRewards]:
    """The rewards of an episode's rows, ``turns`` turns each: one row gets ``reward`` (or
    ``per_turn``); segments each their own turns' share of ``per_turn``, or, for an outcome
    (``per_turn`` None), ``reward`` on the last segment only."""
    if len(turns) == 1:
        return [(reward, None if per_turn is None else tuple(per_turn))]
    if per_turn is None:
        return [*((0.0, (0.0,) * n) for n in turns[:-1]), (reward, None)]
    out: list[RowRewards] = []
    start = 0
    for n in turns:
        out.append((0.0, tuple(per_turn[start : start + n])))
        start += n
    return out


def kept_columns(
    kept: Sequence[torch.Tensor | None], prompt_len: int, t: int
) -> torch.Tensor | None:
    """(B, T, K) int32 kept sets (each row's (response, K_i), or None) in the batch's columns
    (-1 where none); None when no row carries them (replay off). K: the widest set."""
    known = [k for k in kept if k is not None]
    if not known:
        return None
    out = torch.full((len(kept), t, max(k.shape[1] for k in known)), -1, dtype=torch.int32)
    for i, k in enumerate(kept):
        if k is not None:
            out[i, prompt_len : prompt_len + len(k), : k.shape[1]] = k
    return out


def route_columns(
    routes: Sequence[torch.Tensor | None], prompts: Sequence[int], prompt_len: int, t: int
) -> torch.Tensor | None:
    """(B, T, L, K) routed experts (each row's (prompt + response, L, K) from its first
    position, its prompt ``prompts[i]`` tokens long) in the batch's columns (-1 where none);
    None when no row carries routes (a dense policy, or an engine that does not record them)."""
    known = [r for r in routes if r is not None]
    if not known:
        return None
    out = torch.full((len(routes), t, *known[0].shape[1:]), NO_ROUTE, dtype=torch.long)
    for i, (r, p) in enumerate(zip(routes, prompts, strict=True)):
        if r is None:
            continue
        start = prompt_len - p
        n = min(len(r), t - start)
        out[i, start : start + n] = r[:n]
    return out


def reward_columns(
    rows: Sequence[RowRewards], action: torch.Tensor, turn: torch.Tensor
) -> torch.Tensor:
    """(B, T): each row's rewards (:func:`row_rewards`): each turn's
    at its last action token, or R at the row's last action token."""
    out = torch.zeros(action.shape)
    for i, (reward, per_turn) in enumerate(rows):
        if per_turn is None:  # an outcome: the return at the last action token
            cols = action[i].nonzero()
            if len(cols):
                out[i, cols.max()] = reward
            continue
        for k, r in enumerate(per_turn):
            cols = ((turn[i] == k) & action[i]).nonzero()
            if len(cols):
                out[i, cols.max()] = r
    return out
