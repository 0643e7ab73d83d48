"""The one supervised loop: the embedded model's warm start, the reward model and the judge
model all train through :func:`fit`.

Each step is loss → backward → clip the gradient norm → optimiser step → learning-rate
schedule step → zero the gradients. What differs between them — how a step's batch is drawn
and what its loss is — is the caller's ``loss_of(step)``, called once per step in order (so
a caller drawing batches from its own ``random.Random`` keeps its draws in sequence).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def fit(
    net: nn.Module,
    optimizer: torch.optim.Optimizer,
    steps: int,
    loss_of: Callable[[int], torch.Tensor],
    *,
    max_grad_norm: float = 1.0,
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None,
    progress: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train ``net`` for ``steps`` steps of ``loss_of(step)``; each step's loss, in order.

    ``progress(step + 1, loss)`` after every step. The caller sets ``net.train()`` and any
    random state (the loop draws nothing itself).
    """
    parameters = [p for p in net.parameters() if p.requires_grad]
    losses = []
    for step in range(steps):
        loss = loss_of(step)
        loss.backward()
        nn.utils.clip_grad_norm_(parameters, max_grad_norm)
        optimizer.step()
        if schedule is not None:
            schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if progress is not None:
            progress(step + 1, losses[-1])
    return losses
