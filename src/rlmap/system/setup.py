"""Building a run's live objects from its config: model, engine, optimiser, data.

Everything here is start-up; the loops (:mod:`rlmap.system.sync`) only use what
:func:`build` returns.
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from rlmap import feedback
from rlmap.core.errors import ConfigError
from rlmap.feedback.isolation import IsolatedVerifier, Verify
from rlmap.feedback.reward import Reward
from rlmap.feedback.reward_model import load_reward_model
from rlmap.recipes.config import RecipeConfig
from rlmap.system.critic import CRITIC_DIR, CriticSettings, load_critic
from rlmap.system.engine import RolloutEngine
from rlmap.system.hf_engine import HFEngine
from rlmap.system.learner import UpdateSettings
from rlmap.system.scoring import EpisodeReturn, base_reward, shaping_reward
from rlmap.system.sim_inputs import parse_duration
from rlmap.tasks.arithmetic import Example, make_splits
from rlmap.tasks.calculator import CalculatorEnv, marker_ids
from rlmap.tasks.env import AnswerEnv, EnvFactory
from rlmap.tasks.jsonl import load_examples
from rlmap.tasks.preferences import PreferenceSpec, embedded_reward_model
from rlmap.tasks.warmstart import TOOL_DEMOS, WarmStartSpec, warm_start

EMBEDDED = "embedded:tiny"
BUILT_IN_TASKS = ("arithmetic", "calculator")
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
    environment: EnvFactory
    """Makes the environment of one episode (:mod:`rlmap.tasks.env`) for a prompt."""
    settings: UpdateSettings
    critic: torch.nn.Module | None = None
    """The value model (its own Hugging Face model), None when ``critic.enabled`` is false."""
    critic_optimizer: torch.optim.Optimizer | None = None
    """The critic's own AdamW (``optim.critic_lr``); None without a critic."""
    critic_scheduler: Any = None
    """The critic's learning-rate schedule; None without a critic."""
    eval_environment: EnvFactory | None = None
    """Environments of the held-out evaluation (``feedback.eval_verifier``); None: as training."""
    eval_rescore: Verify | None = None
    """The training verifier, to rescore held-out samples when evaluation uses another one."""
    reward_model: torch.nn.Module | None = None
    """The learned reward model scoring rollouts (``feedback.source=reward_model``)."""
    base_reward: Reward = field(default_factory=EpisodeReturn)
    """The base term of the reward (:func:`rlmap.system.scoring.base_reward`)."""
    shaping: Reward | None = None
    """The shaping terms added to it, or None (:func:`rlmap.system.scoring.shaping_reward`)."""


def warm_start_spec(cfg: RecipeConfig) -> WarmStartSpec:
    """The warm start of the embedded default, on the run's own train split."""
    d = cfg.data
    return WarmStartSpec(task=d.task, split_seed=d.split_seed, eval_size=d.eval_size,
                         train_size=d.train_size, max_digits=d.max_digits, ops=d.resolved_ops,
                         tool_demos=TOOL_DEMOS if d.task == "calculator" else 0.0)  # fmt: skip


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


def reward_model_path(
    cfg: RecipeConfig, progress: Callable[[int, int, float], None] | None = None
) -> Path | None:
    """The reward model of a ``feedback.source=reward_model`` run (None for other sources).

    ``model.reward_path`` when given; on the embedded default without one, the cached
    model trained on the task's preference pairs (:mod:`rlmap.tasks.preferences`).
    """
    if cfg.feedback.source != "reward_model":
        return None
    if cfg.model.reward_path is not None:
        path = Path(cfg.model.reward_path)
        if not (path / "config.json").exists():
            raise ConfigError(
                f"model.reward_path: {path} is not a local Hugging Face model directory"
            )
        return path
    if cfg.model.path != EMBEDDED or cfg.data.task not in BUILT_IN_TASKS:
        raise ConfigError(
            "model.reward_path: feedback.source=reward_model needs a trained reward model "
            "(rlmap reward-model train --pairs FILE.jsonl); only the embedded default has one"
        )
    return embedded_reward_model(warm_start_spec(cfg), PreferenceSpec(), progress=progress)


def check_inputs(cfg: RecipeConfig) -> None:
    """Fail on what rlmap cannot run yet, bad data files or a missing model, before any work."""
    refuse_unavailable(cfg)
    load_data(cfg)
    if cfg.model.path != EMBEDDED:
        path = model_path(cfg)
        if cfg.data.task == "calculator":
            marker_ids(AutoTokenizer.from_pretrained(path))
    if cfg.feedback.source == "reward_model" and (
        cfg.model.reward_path is not None or cfg.model.path != EMBEDDED
    ):
        reward_model_path(cfg)  # a given path must exist; a real model must have one
    critic = cfg.model.critic_path
    if cfg.critic.enabled and critic is not None and not (Path(critic) / "config.json").exists():
        raise ConfigError(
            f"model.critic_path: {critic} is not a local Hugging Face model directory"
        )


def refuse_unavailable(cfg: RecipeConfig) -> None:
    """One-line ConfigError, naming the field, for parts of a recipe rlmap does not have yet."""
    for source in ("comparison",):
        if cfg.feedback.source == source:
            raise ConfigError(f"feedback.source: '{source}' is not available in rlmap yet")
    unavailable = {
        "system.engine": (cfg.system.engine, "hf"),
    }
    for name, (value, available) in unavailable.items():
        if value != available:
            raise ConfigError(f"{name}: {value!r} is not available in rlmap yet; use {available!r}")


def load_data(cfg: RecipeConfig) -> tuple[list[Example], list[Example]]:
    """(train, held-out) examples: the built-in task's split, or JSONL files."""
    d = cfg.data
    if d.task in BUILT_IN_TASKS:
        return make_splits(d.split_seed, d.train_size, d.eval_size, max_digits=d.max_digits,
                           ops=d.resolved_ops)  # fmt: skip
    train = load_examples(Path(d.task))
    if d.eval_path is not None:
        return train, load_examples(Path(d.eval_path))
    if len(train) <= d.eval_size:
        raise ConfigError(f"data.eval_size: {d.eval_size} held out leaves no training prompts")
    return train[d.eval_size :], train[: d.eval_size]


def make_verifier(cfg: RecipeConfig, name: str) -> Verify:
    """The named verifier, in its own process when ``feedback.timeout_s`` is set."""
    verify = feedback.registry.get(name).fn
    timeout = cfg.feedback.timeout_s
    return verify if timeout is None else IsolatedVerifier(verify, timeout)


def environment_factory(
    cfg: RecipeConfig,
    tokenizer: PreTrainedTokenizerBase,
    *,
    verifier: str | None = None,
    latency: bool = False,
) -> EnvFactory:
    """The task's environment maker: the calculator tool task, or one answer per prompt.

    ``verifier`` names the verifier (default ``feedback.verifier``; evaluation passes
    ``feedback.eval_verifier``). Raises ConfigError when the tokenizer cannot serve the
    task (checked once, here).
    """
    verify = make_verifier(cfg, verifier or cfg.feedback.verifier)
    if cfg.data.task == "calculator":
        marker_ids(tokenizer)
        turns, wait = cfg.data.max_turns, latency_source(cfg) if latency else None
        return lambda e: CalculatorEnv(tokenizer, e, verify, max_turns=turns, latency=wait)
    return lambda e: AnswerEnv(tokenizer, e, verify)


def evaluation_scoring(
    cfg: RecipeConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[EnvFactory, Verify | None]:
    """(held-out environments, the training verifier to rescore them with — only when
    ``feedback.eval_verifier`` names another one). Evaluation never waits on latency."""
    f = cfg.feedback
    other = f.eval_verifier is not None and f.eval_verifier != f.verifier
    environment = environment_factory(cfg, tokenizer, verifier=f.eval_verifier)
    return environment, make_verifier(cfg, f.verifier) if other else None


def latency_source(cfg: RecipeConfig) -> Callable[[], float] | None:
    """Draws of ``data.env_latency`` (seeded by the run's seed, shared by all environments
    of the run under a lock), or None."""
    spec = cfg.data.env_latency
    if spec is None:
        return None
    stream = parse_duration(spec, flag="data.env_latency").stream(random.Random(cfg.seed))
    lock = threading.Lock()

    def draw() -> float:
        with lock:
            return next(stream)

    return draw


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


def critic_settings(cfg: RecipeConfig) -> CriticSettings:
    """The critic's update schedule: the policy's mini-batching, ``critic.*`` on top."""
    return CriticSettings(
        value_clip=cfg.critic.value_clip,
        updates=cfg.critic.updates_per_step,
        epochs=cfg.optim.epochs_per_batch,
        minibatches=cfg.optim.minibatches_per_epoch,
        micro_batch_size=cfg.optim.micro_batch_size,
        max_grad_norm=cfg.optim.max_grad_norm,
    )


def build_critic(
    cfg: RecipeConfig, start: Path, resume_from: Path | None
) -> tuple[torch.nn.Module | None, torch.optim.Optimizer | None, Any]:
    """(critic, its optimiser, its scheduler), or Nones when ``critic.enabled`` is false.

    The critic starts from ``model.critic_path`` or the policy's start checkpoint, and
    loads ``<resume_from>/critic`` on resume.
    """
    if not cfg.critic.enabled:
        return None, None, None
    path = start if cfg.model.critic_path is None else Path(cfg.model.critic_path)
    if resume_from is not None:
        path = resume_from / CRITIC_DIR
    critic = load_critic(path, dtype=DTYPES[cfg.system.train_dtype], seed=cfg.seed)
    per_batch = critic_settings(cfg).optimizer_steps
    optimizer, scheduler = make_optimizer(critic, cfg, lr=cfg.optim.critic_lr,
                                          steps_per_batch=per_batch)  # fmt: skip
    return critic, optimizer, scheduler


def build(
    cfg: RecipeConfig,
    start: Path,
    resume_from: Path | None = None,
    reward_path: Path | None = None,
) -> Parts:
    """All live objects of a run that started from checkpoint ``start``.

    The policy (and critic) load ``resume_from`` when given (a checkpoint of this run);
    the reference policy is always ``start``, the weights the run began with.
    """
    refuse_unavailable(cfg)
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
    eval_environment, eval_rescore = evaluation_scoring(cfg, tokenizer)
    return Parts(cfg, tokenizer, policy, reference, engine, optimizer, scheduler, train, heldout,
                 environment_factory(cfg, tokenizer, latency=True), update_settings(cfg),
                 *build_critic(cfg, start, resume_from),
                 eval_environment=eval_environment, eval_rescore=eval_rescore,
                 reward_model=_reward_model(cfg, tokenizer, reward_path),
                 base_reward=base_reward(cfg), shaping=shaping_reward(cfg))  # fmt: skip


def _reward_model(
    cfg: RecipeConfig, tokenizer: PreTrainedTokenizerBase, path: Path | None
) -> torch.nn.Module | None:
    """The frozen reward model at ``path``; its tokenizer must be the policy's."""
    if path is None:
        if cfg.feedback.source == "reward_model":
            raise ConfigError("model.reward_path: no reward model for feedback.source=reward_model")
        return None
    if AutoTokenizer.from_pretrained(path).get_vocab() != tokenizer.get_vocab():
        raise ConfigError(
            f"model.reward_path: {path} has a different tokenizer from the policy's; the reward "
            "model must read the policy's tokens"
        )
    return load_reward_model(path, dtype=DTYPES[cfg.system.train_dtype])


def make_optimizer(
    model: torch.nn.Module,
    cfg: RecipeConfig,
    *,
    lr: float | None = None,
    steps_per_batch: int | None = None,
) -> tuple[torch.optim.Optimizer, Any]:
    """AdamW and a warm-up + constant/cosine schedule over all optimiser steps of the run.

    ``lr`` defaults to the policy's ``optim.lr`` and ``steps_per_batch`` (optimiser steps
    per rollout batch) to the policy's epochs × mini-batches; the critic passes its own.
    """
    o = cfg.optim
    lr = o.lr if lr is None else lr
    per_batch = o.epochs_per_batch * o.minibatches_per_epoch
    per_batch = per_batch if steps_per_batch is None else steps_per_batch
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=o.weight_decay)
    total = max(1, o.steps * per_batch)

    def factor(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "cosine":
            done = (step - o.warmup_steps) / max(1, total - o.warmup_steps)
            return 0.5 * (1.0 + math.cos(math.pi * min(done, 1.0)))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
