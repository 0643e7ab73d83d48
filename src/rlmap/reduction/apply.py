"""Applying a reduction: weights once per mini-batch, then a weighted sum per micro-batch."""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.core.errors import ConfigError
from rlmap.reduction.denominator import Denominator, denominator
from rlmap.reduction.params import ReductionParams
from rlmap.reduction.reductions import registry


def check_params(p: ReductionParams) -> None:
    """Fail early, naming the field, if ``p`` names an unknown reduction or lacks L_max."""
    entry = registry.get(p.name)
    if entry.needs_max_len and p.max_len is None:
        raise ConfigError(f"reduction.max_len: '{p.name}' needs L_max (max_len), got None")
    if p.max_len is not None and p.max_len < 1:
        raise ConfigError(f"reduction.max_len: must be >= 1, got {p.max_len}")


def token_weights(
    mask_BT: Tensor,
    p: ReductionParams,
    denom: Denominator | None = None,
    group_id: Tensor | None = None,
) -> Tensor:
    """Per-token weights w_{i,t} of reduction ``p.name`` (docs/formulas.md §5).

    ``denom`` is the whole optimiser mini-batch's counts; when None it is taken
    from ``mask_BT`` (and ``group_id``), i.e. ``mask_BT`` must then be the whole mini-batch
    on one process. Call once per mini-batch, before the micro-batch loop. Data-parallel
    ranks pass the rank-summed ``Denominator`` (see :func:`denominator`). ``group_id`` is
    each row's prompt group (``Batch.group_id``); reductions that do not weigh by group
    ignore it, ``prompt_mean`` needs it.
    Shapes: ``mask_BT`` (B, T), ``group_id`` (B,) long → (B, T) float32.
    """
    check_params(p)
    entry = registry.get(p.name)
    d = denominator(mask_BT, group_id if entry.needs_groups else None) if denom is None else denom
    if entry.needs_groups:
        _check_groups(p.name, d, group_id)
    return entry.fn(mask_BT, d, p, group_id)


def _check_groups(name: str, d: Denominator, group_id: Tensor | None) -> None:
    """Every row's group must be one the denominator counted (a programming error if not)."""
    if group_id is None:
        raise ValueError(f"token_weights: '{name}' needs each row's group_id, got None")
    if d.group_tokens is None:
        raise ValueError(f"token_weights: '{name}' needs a Denominator with group_tokens")
    missing = set(group_id.tolist()) - {g for g, _ in d.group_tokens}
    if missing:
        raise ValueError(f"token_weights: group ids {sorted(missing)} not in the denominator")


def reduce(loss_BT: Tensor, weights_BT: Tensor) -> Tensor:
    """loss = Σ_{i,t} w_{i,t} · j_{i,t}, a scalar.

    Shapes: ``loss_BT`` (B, T) per-token loss j; ``weights_BT`` (B, T) from
    :func:`token_weights` (a micro-batch passes its rows' slice). Off the mask the
    loss is ignored even if it is not finite (padding), so it cannot turn the sum NaN.
    """
    if loss_BT.shape != weights_BT.shape:
        raise ValueError(
            f"reduce: loss shape {tuple(loss_BT.shape)} != weights {tuple(weights_BT.shape)}"
        )
    on = weights_BT != 0  # (B, T)
    return (torch.where(on, loss_BT, torch.zeros_like(loss_BT)) * weights_BT).sum()
