"""A run's live objects, built once from its config: policy, reference, critic, reward
model, engine, optimisers, data and environments (:func:`build`).

Everything here is start-up; the loops (:mod:`rlmap.system.sync`) only use what
:func:`build` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from rlmap.assembly.available import refuse_unavailable
from rlmap.assembly.data import curriculum_levels, load_data
from rlmap.assembly.engine import make_engine
from rlmap.assembly.environments import environment_factory, evaluation_scoring
from rlmap.assembly.models import learner_device, load_causal_lm, load_tokenizer
from rlmap.assembly.optim import make_optimizer
from rlmap.assembly.settings import critic_settings, update_settings
from rlmap.core.errors import ConfigError
from rlmap.engines.engine import RolloutEngine
from rlmap.feedback.isolation import Verify
from rlmap.feedback.reward import Reward
from rlmap.learned.reward_model import load_reward_model
from rlmap.learner.critic import CRITIC_DIR, load_critic
from rlmap.learner.distributed import SINGLE, World, parallel, wrap
from rlmap.learner.memory import MASTER_DTYPE, checkpoint_activations
from rlmap.learner.policy import UpdateSettings
from rlmap.models import lora
from rlmap.models.routing import check_replayable
from rlmap.recipes.config import RecipeConfig
from rlmap.rollout.scoring import EpisodeReturn, base_reward, shaping_reward
from rlmap.tasks.arithmetic import Example
from rlmap.tasks.env import EnvFactory


@dataclass(frozen=True)
class Parts:
    """The live objects of a run (built once; their *state* is what checkpoints hold)."""

    cfg: RecipeConfig
    tokenizer: PreTrainedTokenizerBase
    policy: torch.nn.Module
    reference: torch.nn.Module | None
    """π_ref: a frozen copy of the start model; with LoRA the policy itself, which the
    learner scores with its adapters off (:func:`rlmap.learner.policy.prepare_batch`)."""
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
    eval_rescore_items: bool = False
    """``eval_rescore`` reads the examples' item keys (a reasoning-gym verifier)."""
    reward_model: torch.nn.Module | None = None
    """The learned reward model scoring rollouts (``feedback.source=reward_model``)."""
    base_reward: Reward = field(default_factory=EpisodeReturn)
    """The base term of the reward (:func:`rlmap.rollout.scoring.base_reward`)."""
    shaping: Reward | None = None
    """The shaping terms added to it, or None (:func:`rlmap.rollout.scoring.shaping_reward`)."""
    world: World = SINGLE
    """This process's learner rank (:mod:`rlmap.learner.distributed`)."""
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    """Where the learner's models live (:func:`rlmap.core.device.resolve`); the batch
    record stays on the host and each micro-batch crosses to it."""
    learner: torch.nn.Module | None = None
    """The policy as the data-parallel learner trains it (DDP / FSDP2 around a
    :class:`~rlmap.learner.logprobs.Scorer`); None in one process: ``policy`` itself."""

    critic_learner: torch.nn.Module | None = None
    """The critic as the data-parallel learner trains it (DDP / FSDP2); None in one process."""
    levels: Any = None
    """The training prompts of each curriculum level (``sampling.curriculum``; ``.top``,
    ``.pool(level)``); None: ``train``."""

    @property
    def trained(self) -> torch.nn.Module:
        """What the learner's passes run on: ``learner``, else ``policy``."""
        return self.policy if self.learner is None else self.learner

    @property
    def trained_critic(self) -> torch.nn.Module | None:
        """What the critic's passes run on: ``critic_learner``, else ``critic``."""
        return self.critic if self.critic_learner is None else self.critic_learner


def build_critic(
    cfg: RecipeConfig,
    start: Path,
    resume_from: Path | None,
    world: World = SINGLE,
    device: torch.device | None = None,
) -> tuple[torch.nn.Module | None, torch.optim.Optimizer | None, Any, torch.nn.Module | None]:
    """(critic, its optimiser, its scheduler, its data-parallel wrapper or None), or Nones
    when ``critic.enabled`` is false.

    The critic starts from ``model.critic_path`` or the policy's start checkpoint, and
    loads ``<resume_from>/critic`` on resume. With several learner ranks it is wrapped as
    the policy is (:func:`rlmap.learner.distributed.parallel`) and the optimiser holds the
    wrapper's parameters.
    """
    if not cfg.critic.enabled:
        return None, None, None, None
    path = start if cfg.model.critic_path is None else Path(cfg.model.critic_path)
    if resume_from is not None:
        path = resume_from / CRITIC_DIR
    critic: torch.nn.Module = load_critic(path, dtype=MASTER_DTYPE, seed=cfg.seed, device=device)
    if cfg.optim.gradient_checkpointing:
        checkpoint_activations(critic)
    per_batch = critic_settings(cfg).optimizer_steps
    wrapped = parallel(critic, world) if world.parallel else None
    optimizer, scheduler = make_optimizer(
        critic if wrapped is None else wrapped,
        cfg,
        lr=cfg.optim.critic_lr,
        steps_per_batch=per_batch,
    )
    return critic, optimizer, scheduler, wrapped


def build(
    cfg: RecipeConfig,
    start: Path,
    resume_from: Path | None = None,
    reward_path: Path | None = None,
    world: World = SINGLE,
    *,
    trains: bool = True,
) -> Parts:
    """All live objects of a run that started from checkpoint ``start``, resumed from
    ``resume_from`` (:func:`load_policy`, :func:`build_critic`). With several learner ranks
    the policy is wrapped for them (:func:`rlmap.learner.distributed.wrap`), the optimiser
    holds the wrapped (FSDP2: sharded) parameters and the engine shares the plain policy
    (DDP) or keeps its own full copy (FSDP2). ``trains`` False: a process that only rolls
    out (a Ray actor), whose policy keeps no gradients or optimiser state on its GPU."""
    refuse_unavailable(cfg)
    device = learner_device(cfg)
    tokenizer = load_tokenizer(start)
    policy, reference = load_policy(cfg, start, resume_from, device)
    # every model the learner keeps on its device, before the engine that must fit beside them
    critic, critic_optimizer, critic_scheduler, critic_learner = build_critic(
        cfg, start, resume_from, world, device
    )
    reward_model = _reward_model(cfg, tokenizer, reward_path, device)
    sharded = world.parallel and world.sharding == "fsdp2"
    models = (policy, reference, critic, reward_model)  # what the engine must fit beside
    engine = make_engine(
        cfg, start, policy, tokenizer, own_copy=sharded, world=world, learner=models, trains=trains
    )
    learner = wrap(policy, world) if world.parallel else None
    optimizer, scheduler = make_optimizer(policy if learner is None else learner, cfg)
    train, heldout = load_data(cfg)
    eval_environment, eval_rescore, rescore_items = evaluation_scoring(cfg, tokenizer)
    return Parts(
        cfg,
        tokenizer,
        policy,
        reference,
        engine,
        optimizer,
        scheduler,
        train,
        heldout,
        environment_factory(cfg, tokenizer, latency=True),
        update_settings(cfg),
        critic,
        critic_optimizer,
        critic_scheduler,
        eval_environment=eval_environment,
        eval_rescore=eval_rescore,
        eval_rescore_items=rescore_items,
        reward_model=reward_model,
        base_reward=base_reward(cfg),
        shaping=shaping_reward(cfg),
        world=world,
        learner=learner,
        critic_learner=critic_learner,
        levels=curriculum_levels(cfg),
        device=device,
    )


def load_policy(
    cfg: RecipeConfig, start: Path, resume_from: Path | None, device: torch.device
) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """(policy in training mode, π_ref or None when ``kl.placement`` is none), on ``device``.

    The policy loads ``resume_from`` when given, else ``start``; with LoRA it is ``start``
    with adapters on top (``resume_from``'s on resume), and π_ref is that same model, its
    adapters off. π_ref is otherwise a frozen copy of ``start``.
    """
    m, reference = cfg.model, None
    # on the device before LoRA and the optimiser exist: adapters and AdamW state follow it
    policy = load_causal_lm(
        start if m.lora_rank else resume_from or start, dtype=MASTER_DTYPE, device=device
    )
    if cfg.optim.gradient_checkpointing:
        checkpoint_activations(policy)
    if cfg.behaviour.routing_replay and (problem := check_replayable(policy)) is not None:
        raise ConfigError(f"behaviour.routing_replay: {problem}")
    if m.lora_rank:
        policy = lora.attach(
            policy,
            rank=m.lora_rank,
            alpha=m.resolved_lora_alpha,
            targets=m.lora_modules,
            seed=cfg.seed,
            adapter=resume_from,
        )
        reference = policy if cfg.kl.placement != "none" else None  # the base: adapters off
    elif cfg.kl.placement != "none":
        reference = load_causal_lm(start, dtype=MASTER_DTYPE, device=device)
        reference.eval().requires_grad_(False)
    policy.train()
    return policy, reference


def _reward_model(
    cfg: RecipeConfig,
    tokenizer: PreTrainedTokenizerBase,
    path: Path | None,
    device: torch.device,
) -> torch.nn.Module | None:
    """The frozen reward model at ``path``; its tokenizer must be the policy's."""
    if path is None:
        if cfg.feedback.uses_reward_model:
            raise ConfigError(
                f"model.reward_path: no reward model for feedback.source={cfg.feedback.source}"
            )
        return None
    if load_tokenizer(path).get_vocab() != tokenizer.get_vocab():
        raise ConfigError(
            f"model.reward_path: {path} has a different tokenizer from the policy's; the reward "
            "model must read the policy's tokens"
        )
    return load_reward_model(path, dtype=MASTER_DTYPE, device=device)
