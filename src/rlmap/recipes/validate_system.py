"""Combination checks of where and how a run executes: loggers, the system axis (mode,
engine, actors, sleep, learners, determinism) and the optimiser's schedule
(:func:`rlmap.recipes.validate.validate` runs them with the rest)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from rlmap import sampling
from rlmap.core.device import SETTING as DEVICE_SETTING
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.system_params import SystemParams
from rlmap.runs import trackers


def loggers(cfg: RecipeConfig) -> Iterator[str]:
    """``run.loggers``: known trackers, each named once and installed (here, so that a
    missing one fails before a run directory exists)."""
    names = cfg.run.logger_names
    for i, name in enumerate(names):
        if name not in trackers.registry:
            known = ", ".join(trackers.registry.names())
            yield f"run.loggers: unknown tracker '{name}'; known: {known}"
        elif name in names[:i]:
            yield f"run.loggers: '{name}' is named twice"
    if not cfg.run.project.strip():
        yield "run.project: must not be empty (the trackers' project or experiment name)"
    for name in cfg.run.trackers:
        if name in trackers.registry:
            field = "run.loggers" if name in names else "run.tensorboard"
            problem = trackers.not_installed(name, field)
            if problem is not None:
                yield problem


def system(cfg: RecipeConfig) -> Iterator[str]:
    if not DEVICE_SETTING.fullmatch(cfg.system.device):
        yield f"system.device: one of auto, cpu, cuda, cuda:N, got {cfg.system.device!r}"
    if cfg.system.partial_rollout and cfg.system.mode != "async":
        yield (
            "system.partial_rollout: needs system.mode=async (the synchronous loop never "
            "updates weights while a trajectory runs)"
        )
    if cfg.system.deterministic:
        yield from _deterministic(cfg)
    if cfg.system.backend == "ray" and cfg.system.mode != "async":
        yield (
            "system.backend: 'ray' runs the asynchronous loop's rollout workers; "
            "set system.mode=async"
        )
    if cfg.system.mode == "async" and sampling.registry.get(cfg.sampling.filter).needs_group:
        yield (
            f"sampling.filter: '{cfg.sampling.filter}' filters whole groups, but the "
            "asynchronous queue consumes trajectories as they finish, not groups; use "
            "sampling.filter=none with system.mode=async"
        )
    bound = cfg.behaviour.max_staleness + 1
    if cfg.system.mode == "async" and cfg.system.publish_every > bound:
        yield (
            f"system.publish_every: {cfg.system.publish_every} steps between publications "
            f"exceed behaviour.max_staleness + 1 = {bound}: before each publication "
            "every queued trajectory would be too stale to consume"
        )
    for name in ("workers", "publish_every", "learners"):
        if getattr(cfg.system, name) < 1:
            yield f"system.{name}: must be >= 1, got {getattr(cfg.system, name)}"
    yield from _learners(cfg)
    yield from _engine_sleep(cfg.system)
    yield from _actors(cfg.system)


def _actors(s: SystemParams) -> Iterator[str]:
    """Where Ray's rollout actors run: settings that place nothing outside Ray, a share of
    more than one GPU (tensor parallelism is not built), and colocation asking for none."""
    field = "actor_gpus" if s.actor_gpus is not None else "actor_placement"
    if s.backend != "ray" and (s.actor_gpus is not None or s.actor_placement != "separate"):
        yield f"system.{field}: places Ray's rollout actors; set system.backend=ray"
    if s.actor_gpus is not None and not (s.actor_gpus == 0 or 1e-4 <= s.actor_gpus <= 1):
        yield (
            f"system.actor_gpus: must be 0 or in [0.0001, 1] (Ray's unit is 1e-4; more than "
            f"one GPU per actor is not built), got {s.actor_gpus}"
        )
    if s.actor_placement == "colocate" and s.actor_gpus == 0:
        yield (
            "system.actor_placement: colocate shares the learner's GPU with the actors, and "
            "system.actor_gpus=0 gives them none"
        )


def _engine_sleep(s: SystemParams) -> Iterator[str]:
    """Where vLLM cannot sleep while the learner steps (``auto`` resolves to off there): an
    explicit level needs the vLLM engine, an idle engine (the synchronous loop) and a build
    with sleep mode (vLLM's CUDA build), and a learner on the GPU to give the memory to."""
    level = s.engine_sleep
    if level in ("auto", "off"):
        return
    why = None
    if s.engine != "vllm":
        why = f"is for the vLLM engine; system.engine={s.engine} never sleeps"
    elif s.partial_rollout:
        why = (
            "cannot go with system.partial_rollout (its trajectories stay in the engine "
            "across weight updates)"
        )
    elif s.mode != "sync":
        why = (
            "needs system.mode=sync (the asynchronous loop's workers sample while the "
            "learner steps)"
        )
    elif not torch.cuda.is_available():
        why = "needs vLLM's CUDA build: its CPU build has no sleep mode"
    elif s.device == "cpu":
        why = "needs the learner on the GPU, and system.device=cpu puts it on the CPU"
    if why is not None:
        yield f"system.engine_sleep: {level} {why}; set system.engine_sleep=off or auto"


def _deterministic(cfg: RecipeConfig) -> Iterator[str]:
    s = cfg.system
    if s.mode != "async":
        yield (
            "system.deterministic: needs system.mode=async (the synchronous loop always "
            "repeats exactly)"
        )
    if s.partial_rollout:
        yield (
            "system.deterministic: not with system.partial_rollout (which weights arrive "
            "between two turns is up to timing)"
        )


def _learners(cfg: RecipeConfig) -> Iterator[str]:
    """What data-parallel learners (``system.learners > 1``) do not run yet, and a batch
    too small to give every rank a prompt."""
    n = cfg.system.learners
    if n <= 1:
        if cfg.system.learner_sharding != "ddp":
            yield (
                f"system.learner_sharding: '{cfg.system.learner_sharding}' shards over "
                "learner ranks; set system.learners > 1"
            )
        return
    if cfg.system.mode != "sync":
        yield (
            f"system.learners: {n} needs system.mode=sync (data-parallel learners run the "
            "synchronous loop; the asynchronous one is not there yet)"
        )
    elif cfg.model.lora_rank:
        yield (
            f"system.learners: {n} does not train LoRA adapters yet; set model.lora_rank=0 "
            "or system.learners=1"
        )
    elif cfg.sampling.prompts_per_step < n:
        yield (
            f"system.learners: {n} ranks need at least as many prompts per step, got "
            f"sampling.prompts_per_step={cfg.sampling.prompts_per_step} (a prompt's G "
            "samples never straddle ranks)"
        )


def optim(cfg: RecipeConfig) -> Iterator[str]:
    o = cfg.optim
    for field in ("steps", "epochs_per_batch", "minibatches_per_epoch", "micro_batch_size"):
        if getattr(o, field) < 1:
            yield f"optim.{field}: must be >= 1, got {getattr(o, field)}"
    if o.lr <= 0:
        yield f"optim.lr: must be > 0, got {o.lr}"
    if not all(0.0 <= beta < 1.0 for beta in o.adam_betas):
        yield f"optim.adam_betas: each must be in [0, 1), got {list(o.adam_betas)}"
