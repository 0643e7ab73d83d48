"""The optimisers of a run: AdamW and its learning-rate schedule."""

from __future__ import annotations

import math
from typing import Any

import torch

from rlmap.assembly.settings import schedule
from rlmap.recipes.config import RecipeConfig


def make_optimizer(
    model: torch.nn.Module,
    cfg: RecipeConfig,
    *,
    lr: float | None = None,
    steps_per_batch: int | None = None,
) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW (``optim.adam_betas``) and a warm-up + constant/cosine/linear schedule over all
    optimiser steps of the run (:func:`lr_factor`).

    ``lr`` defaults to the policy's ``optim.lr`` and ``steps_per_batch`` (optimiser steps
    per rollout batch) to the policy's epochs × mini-batches; the critic passes its own.
    """
    o = cfg.optim
    lr = o.lr if lr is None else lr
    per_batch = schedule(cfg).optimizer_steps if steps_per_batch is None else steps_per_batch
    trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
    beta1, beta2 = o.adam_betas
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=o.weight_decay, betas=(beta1, beta2))
    total = max(1, o.steps * per_batch)

    def factor(step: int) -> float:
        return lr_factor(step, schedule=o.schedule, warmup_steps=o.warmup_steps, total=total)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total: int) -> float:
    """The learning rate's multiplier before optimiser step ``step`` (0-based) of ``total``.

    Warm-up W: (s + 1)/W for s < W. After it, with d = (s − W)/max(1, total − W) clipped to
    [0, 1]: constant 1; cosine ½(1 + cos πd); linear 1 − d, transformers'
    ``get_linear_schedule_with_warmup`` (TRL's default), which reaches 0 at s = total.
    Differs from transformers during warm-up only: it starts at s/W (0 at the first step).
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    done = min(max((step - warmup_steps) / max(1, total - warmup_steps), 0.0), 1.0)
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * done))
    if schedule == "linear":
        return 1.0 - done
    return 1.0
