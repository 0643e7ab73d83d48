"""The learner's update schedules, copied from the config: the policy's and the critic's."""

from __future__ import annotations

import torch

from rlmap.learner.critic import CriticSettings
from rlmap.learner.policy import UpdateSettings
from rlmap.learner.update_loop import Schedule
from rlmap.recipes.config import RecipeConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""``system.train_dtype`` / ``rollout_dtype`` by name. The learner's weights are float32
whatever ``train_dtype`` says: it is the autocast dtype of its forward passes
(:mod:`rlmap.learner.memory`)."""


def schedule(cfg: RecipeConfig) -> Schedule:
    """``optim``'s mini-batching and clip: one pass of the policy's update, and of the
    critic's."""
    return Schedule(
        epochs=cfg.optim.epochs_per_batch,
        minibatches=cfg.optim.minibatches_per_epoch,
        micro_batch_size=cfg.optim.micro_batch_size,
        max_grad_norm=cfg.optim.max_grad_norm,
    )


def update_settings(cfg: RecipeConfig) -> UpdateSettings:
    """The policy's update schedule and objective (``behaviour``, ``kl``, ``reduction``,
    :func:`schedule`, the sampling temperature, the autocast dtype)."""
    return UpdateSettings(
        behaviour=cfg.behaviour,
        kl=cfg.kl,
        reduction=cfg.reduction,
        schedule=schedule(cfg),
        temperature=cfg.generation.temperature,
        train_dtype=DTYPES[cfg.system.train_dtype],
    )


def critic_settings(cfg: RecipeConfig) -> CriticSettings:
    """The critic's update schedule: the policy's :func:`schedule`, ``critic.*`` on top."""
    return CriticSettings(
        value_clip=cfg.critic.value_clip,
        updates=cfg.critic.updates_per_step,
        schedule=schedule(cfg),
        train_dtype=DTYPES[cfg.system.train_dtype],
    )
