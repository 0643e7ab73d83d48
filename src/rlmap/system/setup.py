"""Building a run's live objects from its config: model, engine, optimiser, data.

Everything here is start-up; the loops (:mod:`rlmap.system.sync`) only use what
:func:`build` returns.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from rlmap import feedback
from rlmap.core.errors import ConfigError
from rlmap.recipes.config import RecipeConfig
from rlmap.system.engine import RolloutEngine
from rlmap.system.hf_engine import HFEngine
from rlmap.system.learner import UpdateSettings
from rlmap.tasks.arithmetic import Example, make_splits
from rlmap.tasks.jsonl import load_examples
from rlmap.tasks.warmstart import WarmStartSpec, warm_start

EMBEDDED = "embedded:tiny"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Parts:
    """The live objects of a run (built once; their *state* is what checkpoints hold)."""

    cfg: RecipeConfig
    tokenizer: PreTrainedTokenizerBase
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    engine: RolloutEngine
    optimizer: torch.optim.Optimizer
    scheduler: Any
    train: list[Example]
    heldout: list[Example]
    verify: Callable[[str, str], float]
    settings: UpdateSettings


def warm_start_spec(cfg: RecipeConfig) -> WarmStartSpec:
    """The warm start of the embedded default, on the run's own train split."""
    d = cfg.data
    return WarmStartSpec(split_seed=d.split_seed, eval_size=d.eval_size, train_size=d.train_size,
                         max_digits=d.max_digits, ops=d.ops)  # fmt: skip


def model_path(
    cfg: RecipeConfig, progress: Callable[[int, int, float], None] | None = None
) -> Path:
    """The checkpoint the policy starts from (the cached warm start for the embedded default)."""
    if cfg.model.path == EMBEDDED:
        return warm_start(warm_start_spec(cfg), progress=progress)
    path = Path(cfg.model.path)
    if not (path / "config.json").exists():
        raise ConfigError(f"model.path: {path} is not a local Hugging Face model directory")
    return path


def check_inputs(cfg: RecipeConfig) -> None:
    """Fail on bad data files or a missing model before anything is written."""
    load_data(cfg)
    if cfg.model.path != EMBEDDED:
        model_path(cfg)


def load_data(cfg: RecipeConfig) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples: the built-in task's split, or JSONL files."""
    d = cfg.data
    if d.task == "arithmetic":
        return make_splits(d.split_seed, d.train_size, d.eval_size, max_digits=d.max_digits,
                           ops=d.ops)  # fmt: skip
    train = load_examples(Path(d.task))
    if d.eval_path is not None:
        return train, load_examples(Path(d.eval_path))
    if len(train) <= d.eval_size:
        raise ConfigError(f"data.eval_size: {d.eval_size} held out leaves no training prompts")
    return train[d.eval_size :], train[: d.eval_size]


def update_settings(cfg: RecipeConfig) -> UpdateSettings:
    return UpdateSettings(
        behaviour=cfg.behaviour,
        kl=cfg.kl,
        reduction=cfg.reduction,
        epochs=cfg.optim.epochs_per_batch,
        minibatches=cfg.optim.minibatches_per_epoch,
        micro_batch_size=cfg.optim.micro_batch_size,
        max_grad_norm=cfg.optim.max_grad_norm,
        temperature=cfg.generation.temperature,
    )


def build(cfg: RecipeConfig, start: Path, resume_from: Path | None = None) -> Parts:
    """All live objects of a run that started from checkpoint ``start``.

    The policy loads ``resume_from`` when given (a checkpoint of this run); the
    reference policy is always ``start``, the weights the run began with.
    """
    for source in ("reward_model", "process_reward", "environment", "comparison"):
        if cfg.feedback.source == source:
            raise ConfigError(f"feedback.source: '{source}' is not available in rlmap yet")
    if cfg.critic.enabled:
        raise ConfigError("critic.enabled: critic recipes (ppo, vapo, sao) are not available yet")
    tokenizer = AutoTokenizer.from_pretrained(start)
    dtype = DTYPES[cfg.system.train_dtype]
    policy = AutoModelForCausalLM.from_pretrained(resume_from or start, dtype=dtype)
    policy.train()
    reference = None
    if cfg.kl.placement != "none":
        reference = AutoModelForCausalLM.from_pretrained(start, dtype=dtype)
        reference.eval().requires_grad_(False)
    engine = HFEngine(policy, pad_token_id=int(tokenizer.pad_token_id),
                      eos_token_id=int(tokenizer.eos_token_id),
                      dtype=DTYPES[cfg.system.rollout_dtype])  # fmt: skip
    optimizer, scheduler = make_optimizer(policy, cfg)
    train, heldout = load_data(cfg)
    return Parts(cfg, tokenizer, policy, reference, engine, optimizer, scheduler, train, heldout,
                 feedback.registry.get(cfg.feedback.verifier).fn, update_settings(cfg))  # fmt: skip


def make_optimizer(policy: torch.nn.Module, cfg: RecipeConfig) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW and a warm-up + constant/cosine schedule over all optimiser steps of the run."""
    o = cfg.optim
    optimizer = torch.optim.AdamW(policy.parameters(), lr=o.lr, weight_decay=o.weight_decay)
    total = max(1, o.steps * o.epochs_per_batch * o.minibatches_per_epoch)

    def factor(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "cosine":
            done = (step - o.warmup_steps) / max(1, total - o.warmup_steps)
            return 0.5 * (1.0 + math.cos(math.pi * min(done, 1.0)))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
