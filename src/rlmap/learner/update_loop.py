"""The one update loop: epochs × optimiser mini-batches × micro-batches, for policy and critic.

Per epoch the rows are permuted (the caller's generator) and cut into ``minibatches``
optimiser mini-batches. Each mini-batch pins its reduction weights once, before any
micro-batch runs (``weights_of``), so the summed micro-batch losses are the mini-batch's
loss whatever ``micro_batch_size`` is; then one guarded optimiser step
(:func:`rlmap.learner.optim_step.guarded_step`).

Diagnostics are not averaged over micro-batches (a mean of micro-batch maxima, p99s or
per-micro-batch token means changes with the split). Instead each micro-batch hands back
detached per-row tensors (``kept``: e.g. the log-probs it computed), which the loop
concatenates with the rows they belong to over every update of the batch; the caller
computes its diagnostics once on them, as if the whole batch had been one micro-batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from rlmap.core.batch import Batch, cross
from rlmap.core.device import model_device
from rlmap.learner.distributed import SINGLE, World, accumulating, all_sum, gather, micro_steps
from rlmap.learner.optim_step import guarded_step
from rlmap.reduction.microbatch import split_indices

Weights = tuple[Tensor, ...]
"""A mini-batch's pinned (B, T) weights: one tensor per reduced term (e.g. the objective's
and the positive-NLL term's)."""

Kept = dict[str, Tensor]
"""Detached (b, T) tensors a micro-batch hands back for the caller's diagnostics."""

MicroLoss = Callable[[Batch, Tensor, Weights], tuple[Tensor, dict[str, Tensor], Kept]]
"""(micro-batch, its row indices in the whole batch, its rows of the weights) -> (loss to
backpropagate, named parts of it that add up over micro-batches, (b, T) tensors to keep)."""


@dataclass(frozen=True)
class Schedule:
    """How one rollout batch is cut into optimiser steps: the one declaration of these
    fields, held by the policy's and the critic's settings alike (copied from ``optim.*``
    by :func:`rlmap.assembly.settings.schedule`)."""

    epochs: int
    """Passes over the batch (``optim.epochs_per_batch``)."""
    minibatches: int
    """Optimiser steps per pass (``optim.minibatches_per_epoch``)."""
    micro_batch_size: int
    """Rows per forward/backward; never changes the gradient or a diagnostic."""
    max_grad_norm: float
    """Global gradient-norm clip."""

    @property
    def optimizer_steps(self) -> int:
        """Optimiser steps taken on one rollout batch."""
        return self.epochs * self.minibatches


@dataclass
class Updates:
    """What the optimiser steps of one batch leave for the caller's diagnostics."""

    rows: list[Tensor] = field(default_factory=list)
    """Row indices (into the batch) of each micro-batch, in the order they ran."""
    kept: defaultdict[str, list[Tensor]] = field(default_factory=lambda: defaultdict(list))
    """Each kept tensor's micro-batch parts, aligned with ``rows``."""
    steps: defaultdict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    """Per optimiser step: ``loss`` (the mini-batch's, summed over its micro-batches), each
    named part of it, ``grad_norm`` (before clipping) and ``lr``."""

    def cat(self, name: str) -> Tensor:
        """A kept tensor over every micro-batch of every update, rows stacked: (ΣB, T), on
        the host (one transfer from the learner's device, after the updates)."""
        return torch.cat(self.kept[name]).cpu()

    @property
    def all_rows(self) -> Tensor:
        """The batch rows behind :meth:`cat`'s rows (a row repeats once per epoch)."""
        return torch.cat(self.rows)

    def step_means(self) -> dict[str, float]:
        """The mean over optimiser steps of each per-step figure."""
        return {k: sum(v) / len(v) for k, v in self.steps.items()}


def optimise(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: Batch,
    schedule: Schedule,
    *,
    weights_of: Callable[[Batch], Weights],
    micro_loss: MicroLoss,
    generator: torch.Generator,
    what: str,
    world: World = SINGLE,
    owner: Tensor | None = None,
) -> Updates:
    """Every optimiser step on ``batch``; see the module docstring.

    Data-parallel (:mod:`rlmap.learner.distributed`): ``batch`` is the global batch, the
    same on every rank, and ``owner`` (B,) the rank that trains each row. Every rank draws
    the same permutation and mini-batches and pins the *global* mini-batch's weights; it
    then runs micro-batches over its own rows only, as many on every rank (zero-weight ones
    pad a rank with fewer rows), and its gradients are summed with the other ranks'. The
    losses and kept tensors of :class:`Updates` are all ranks' together.
    """
    out = Updates()
    owner = torch.zeros(batch.size, dtype=torch.long) if owner is None else owner
    for _ in range(schedule.epochs):
        order = torch.randperm(batch.size, generator=generator)
        for rows in order.tensor_split(schedule.minibatches):
            if rows.numel() == 0:
                continue
            mb = batch.select(rows)
            weights = weights_of(mb)  # pinned once for the whole (global) mini-batch
            parts = _accumulate(
                model, mb, rows, weights, owner[rows], schedule, micro_loss, world, out
            )
            out.steps["lr"].append(float(optimizer.param_groups[0]["lr"]))
            out.steps["grad_norm"].append(
                guarded_step(
                    model,
                    optimizer,
                    scheduler,
                    loss=parts["loss"],
                    max_grad_norm=schedule.max_grad_norm,
                    what=what,
                    world=world,
                )
            )
            for key, total in parts.items():
                out.steps[key].append(total)
    if world.parallel:
        _gather_kept(out, world)
    return out


def _accumulate(
    model: nn.Module,
    mb: Batch,
    rows: Tensor,
    weights: Weights,
    owner_rows: Tensor,
    schedule: Schedule,
    micro_loss: MicroLoss,
    world: World,
    out: Updates,
) -> dict[str, float]:
    """The backward passes of one mini-batch on this rank; its loss parts, summed over ranks.

    The mini-batch stays on the host; each micro-batch (and its weights) crosses to the
    model's device, and nothing is read back inside the loop: the loss parts add up on the
    device, in float64 as Python floats would, and are read once after it. (The copies are
    from pageable host memory, so on a GPU each still waits for the stream: pinning is not
    built yet.)"""
    mine = (owner_rows == world.rank).nonzero().flatten()
    pieces = [mine[i] for i in split_indices(mine.numel(), schedule.micro_batch_size)]
    steps = micro_steps(owner_rows, world, schedule.micro_batch_size) if world.parallel else 0
    padding = max(steps - len(pieces), 0)
    device = model_device(model)
    totals: dict[str, Tensor] = {}
    for k, index in enumerate(pieces + [torch.zeros(1, dtype=torch.long)] * padding):
        real = k < len(pieces)
        micro = tuple(
            cross(w[index] if real else torch.zeros_like(w[index]), device) for w in weights
        )
        with accumulating(model, world, last=k == len(pieces) + padding - 1):
            loss, sums, kept = micro_loss(mb.select(index).to(device), rows[index], micro)
            loss.backward()
        if not real:  # zero weights: a pass for the collectives, nothing to count or keep
            continue
        for key, part in {"loss": loss, **sums}.items():  # parts of one sum: they add up
            exact = part.detach().double()
            totals[key] = totals[key] + exact if key in totals else exact
        out.rows.append(rows[index])
        for key, tensor in kept.items():
            out.kept[key].append(tensor.detach())
    read = torch.stack(list(totals.values())).tolist() if totals else []  # one sync
    parts = dict(zip(totals, read, strict=True))
    if not world.parallel:
        return parts
    keys = sorted(set().union(*gather(world, sorted(parts))))  # a rank may have no rows
    return dict(zip(keys, all_sum(world, [parts.get(k, 0.0) for k in keys]), strict=True))


def _gather_kept(out: Updates, world: World) -> None:
    """Every rank's rows and kept tensors, in rank order (diagnostics over the global batch)."""
    tensors = [t for parts in out.kept.values() for t in parts]
    device = tensors[0].device if tensors else torch.device("cpu")  # the learner's (rows: CPU)
    mine = ([r.cpu() for r in out.rows], {k: [t.cpu() for t in v] for k, v in out.kept.items()})
    everyone = gather(world, mine)
    out.rows = [r for rows, _ in everyone for r in rows]
    out.kept = defaultdict(list)
    for _, kept in everyone:
        for key, parts in kept.items():
            out.kept[key] += [t.to(device) for t in parts]
