"""Config sections that are not an axis: model, data, generation, optimiser."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ModelConfig:
    """The policy (and, when a critic is on, the value model's backbone)."""

    path: str = "embedded:tiny"
    """A local directory of any Hugging Face causal LM, or ``embedded:tiny`` for the built-in
    character-level model (built and warm-started on first use, cached by content hash)."""
    critic_path: str | None = None
    """Backbone of the value critic; None reuses ``path``."""


@dataclass(frozen=True)
class DataConfig:
    """Prompts and their reference answers."""

    task: str = "arithmetic"
    """Built-in task name, or a path to a JSONL file with ``prompt`` and ``answer`` per line."""
    train_size: int = 4096
    """Number of training prompts generated for a built-in task."""
    eval_size: int = 256
    """Number of held-out prompts (disjoint from training) for a built-in task."""


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling settings of the rollout engine (they define μ, the behaviour policy)."""

    max_new_tokens: int = 16
    """Response length limit; a response that hits it ends TRUNCATED."""
    temperature: float = 1.0
    """Sampling temperature; the reported behaviour log-probs include it."""
    top_p: float = 1.0
    """Nucleus sampling mass; the reported behaviour log-probs include it."""
    eval_samples: int = 8
    """Samples per held-out prompt for pass@k (k up to this)."""


@dataclass(frozen=True)
class OptimConfig:
    """Optimiser and update schedule of the learner."""

    steps: int = 60
    """Rollout-and-update steps of the run."""
    lr: float = 1e-5
    """AdamW learning rate of the policy."""
    critic_lr: float = 1e-5
    """AdamW learning rate of the value critic."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule after warm-up."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up, in optimiser steps."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip."""
    epochs_per_batch: int = 1
    """Passes over each rollout batch (PPO epochs)."""
    minibatches_per_epoch: int = 1
    """Optimiser steps per pass; each mini-batch pins its own reduction denominator."""
    micro_batch_size: int = 16
    """Rows per forward/backward; never changes the loss (denominators are pinned)."""
