"""One optimiser step with the non-finite guard, shared by the policy and the critic.

A non-finite loss or gradient norm stops the run *before* the optimiser applies it, and
a non-finite weight after the step stops it before anything can sample from it or save
it: AdamW turns one NaN gradient into NaN weights everywhere, and a run that goes on from
there reports a collapse that never happened and writes checkpoints that load but answer
nothing. The guard raises :class:`~rlmap.core.errors.TrainingError`; the training loop
adds the step number, and checkpoints refuse non-finite weights on their own
(:func:`rlmap.experiments.checkpoint.save_checkpoint`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

from rlmap.core.errors import TrainingError
from rlmap.learner.distributed import SINGLE, World, any_rank, local


def all_finite(tensors: Iterable[Tensor], world: World = SINGLE) -> bool:
    """True when no element of any tensor is NaN or ±inf (one reduction per tensor); with
    several ranks, on every rank's part (FSDP2 shards), so that all ranks agree."""
    sums = [local(t).detach().float().sum() for t in tensors]
    finite = not sums or bool(torch.isfinite(torch.stack(sums)).all())
    return not any_rank(world, not finite)


def guarded_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    *,
    loss: float,
    max_grad_norm: float,
    what: str,
    world: World = SINGLE,
) -> float:
    """Clip, check, step, schedule and zero the gradients; returns the pre-clip grad norm.

    ``loss`` is the mini-batch's loss (already summed over its micro-batches) and ``what``
    names the model in the error ("policy", "critic"). With several ranks the loss is the
    global mini-batch's and the gradient norm the global gradient's, so every rank decides
    alike.
    """
    norm = nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    full_tensor = getattr(norm, "full_tensor", None)  # FSDP2: a replicated DTensor
    grad_norm = float(norm if full_tensor is None else full_tensor())
    if not (torch.isfinite(torch.tensor(loss)) and torch.isfinite(torch.tensor(grad_norm))):
        raise TrainingError(
            f"{what} update: non-finite loss {loss} or gradient norm {grad_norm}; stopped "
            "before the optimiser step (no weight changed, nothing saved)"
        )
    try:
        optimizer.step()
    except RuntimeError as exc:  # e.g. an update too large for the dtype ("overflow")
        raise TrainingError(
            f"{what} update: the optimiser step failed ({exc}); stopped, nothing saved"
        ) from None
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if not all_finite(model.parameters(), world):
        raise TrainingError(
            f"{what} update: the optimiser step made weights non-finite (learning rate "
            f"{optimizer.param_groups[0]['lr']}); stopped, nothing saved"
        )
    return grad_norm
