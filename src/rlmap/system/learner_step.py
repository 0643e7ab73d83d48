"""The learner's half of a step, the same in both loops: a batch of scored episodes in,
new weights in the rollout engine out.

    π_old / π_ref → (KL in the reward) → critic values → advantages and critic targets
    → critic steps → policy steps → new weights to the rollout engine

vLLM on the learner's GPU sleeps from π_old to the new weights (:func:`learn`). During the
critic's warm-up only the critic learns (:mod:`rlmap.system.loop_state`). Nothing here
touches files.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch

from rlmap import estimators
from rlmap.assembly.parts import Parts
from rlmap.assembly.settings import critic_settings
from rlmap.core.batch import Batch
from rlmap.core.device import elapsed, mfu, update_flops_per_token
from rlmap.core.ops import masked_mean
from rlmap.correction import kl_in_reward
from rlmap.estimators import Credit, CreditParams
from rlmap.learner.critic import compute_values, update_critic
from rlmap.learner.logprobs import attention_of
from rlmap.learner.policy import UpdateSettings, prepare_batch, update_policy
from rlmap.system.loop_state import LoopState, critic_warming_up, kl_beta


def learn(
    p: Parts, batch: Batch, state: LoopState, owner: torch.Tensor | None = None
) -> dict[str, float]:
    """:func:`update`, then the new weights to the rollout engine (:func:`publish`).

    An engine that sleeps while the learner steps (vLLM on the learner's GPU,
    ``system.engine_sleep``) sleeps here, and wakes in two halves around the reload, as TRL's
    colocated mode does: its weights' memory, the reload into it, and only then its KV cache
    (with a fresh prefix cache), which would otherwise take the reload's room.
    """
    engine: Any = p.engine
    sleeps = getattr(engine, "sleep_level", 0) > 0
    if sleeps:
        engine.sleep()
    metrics = update(p, batch, state, owner)
    if sleeps:
        engine.wake("weights")
    metrics["system/weight_sync_s"] = publish(p, state.step + 1)
    if sleeps:
        engine.wake("kv_cache")
    return metrics


def update(
    p: Parts, batch: Batch, state: LoopState, owner: torch.Tensor | None = None
) -> dict[str, float]:
    """π_old / π_ref, (KL in the reward), critic values, advantages, critic and policy steps.

    With several learner ranks ``batch`` is the global batch (the same on every rank) and
    ``owner`` the rank that trains each row; the advantages are computed on all of it.
    """
    estimator = estimators.registry.get(p.cfg.credit.estimator)
    beta = kl_beta(p, state)
    settings = replace(p.settings, kl=replace(p.settings.kl, beta=beta))
    # The KL in the reward is k1 = log π_old − log π_ref on the sampled tokens: π_old is the
    # trainer's (decoupled mode), not the engine's μ, or a train/rollout mismatch leaks in.
    kl_reward = p.cfg.kl.placement == "reward" and p.cfg.behaviour.mode == "decoupled"
    needs_pi = estimator.needs_policy_logprobs or kl_reward
    batch, timings = prepare_batch(
        batch,
        p.trained,
        p.reference,
        settings,
        policy_logprobs=needs_pi,
        world=p.world,
        owner=owner,
    )
    metrics: dict[str, float] = dict(timings)
    if p.cfg.kl.placement != "none":
        metrics["kl/beta"] = beta
    ref = batch.ref_logprobs
    if p.cfg.kl.placement == "reward" and ref is not None:
        old = batch.old_logprobs
        bypass = old is None or p.cfg.behaviour.mode == "bypass"  # π_old := μ
        current = batch.behavior_logprobs if bypass or old is None else old
        penalised = kl_in_reward(batch.step_rewards, current, ref, batch.action_mask, beta)
        batch = batch.replace(token_rewards=penalised)
        k1 = (current - ref).float()  # the penalty's KL estimate, per token
        metrics["kl/mean"] = float(masked_mean(k1, batch.action_mask))
    warming = critic_warming_up(p, state)
    if p.critic is not None:
        started = time.perf_counter()
        critic = p.trained_critic
        assert critic is not None
        values, bootstrap = compute_values(
            critic, batch, p.settings.schedule.micro_batch_size, p.settings.train_dtype
        )
        batch = batch.replace(values=values, bootstrap_values=bootstrap)
        metrics["system/critic_values_s"] = elapsed(started, p.device)
    if p.cfg.sampling.group_scope == "turn":  # GiGPO's anchor states (docs/formulas.md §2.4)
        batch = batch.replace(turn_group=estimators.turn_groups(batch))
    credit = estimator.fn(batch, _credit_params(p, warming))
    metrics |= {k: float(v) for k, v in credit.diagnostics.items()}
    seed = p.cfg.seed * 1_000_003 + state.step
    if p.critic is not None:
        metrics |= _learn_critic(p, batch, credit, seed, owner)
        metrics["critic/pretraining"] = float(warming)
    if not warming:
        metrics |= _learn_policy(p, batch, credit, state, seed, settings, owner)
    return metrics


def publish(p: Parts, version: int) -> float:
    """The policy's current weights to the rollout engine, labelled ``version``; the seconds
    it took (an HF engine that shares the policy: next to none). An engine with weights of
    its own takes them one tensor at a time (:func:`rlmap.models.lora.rollout_stream`);
    FSDP2 gathers each parameter from the shards as its turn comes, never the whole state
    dict at once — a collective, which every rank runs since every rank's engine takes the
    whole stream."""
    started = time.perf_counter()
    p.engine.update_weights(p.policy, version)
    return elapsed(started, p.device)


def _credit_params(p: Parts, warming: bool) -> CreditParams:
    """The recipe's credit settings; Monte-Carlo critic targets (λ_critic = 1) in pre-training."""
    if warming and p.cfg.critic.pretrain_mc:
        return replace(p.cfg.credit, lam_critic=1.0)
    return p.cfg.credit


def _learn_critic(
    p: Parts, batch: Batch, credit: Credit, seed: int, owner: torch.Tensor | None
) -> dict[str, float]:
    """The critic's optimiser steps toward ``credit.returns`` (V_old = ``batch.values``)."""
    critic = p.trained_critic
    assert critic is not None and p.critic_optimizer is not None
    if credit.returns is None:
        raise ValueError(f"estimator '{p.cfg.credit.estimator}' returned no critic targets")
    started = time.perf_counter()
    metrics = update_critic(
        critic,
        p.critic_optimizer,
        p.critic_scheduler,
        batch,
        credit.returns,
        critic_settings(p.cfg),
        generator=torch.Generator().manual_seed(seed),
        world=p.world,
        owner=owner,
    )
    return metrics | {"system/critic_update_s": elapsed(started, p.device)}


def _learn_policy(
    p: Parts,
    batch: Batch,
    credit: Credit,
    state: LoopState,
    seed: int,
    s: UpdateSettings,
    owner: torch.Tensor | None,
) -> dict[str, float]:
    """The policy's optimiser steps on ``credit.advantages`` (this rank's rows: ``owner``),
    timed with the device's queue drained; ``system/mfu`` where the device's peak is known."""
    started = time.perf_counter()
    metrics = update_policy(
        p.trained,
        p.optimizer,
        p.scheduler,
        batch,
        credit.advantages,
        s,
        learner_version=state.step,
        generator=torch.Generator().manual_seed(seed),
        world=p.world,
        owner=owner,
    )
    seconds = elapsed(started, p.device)
    attention = attention_of(batch)  # the tokens this rank's forward and backward passes saw
    tokens = int((attention if owner is None else attention[owner == p.world.rank]).sum())
    tokens *= s.schedule.epochs
    flops = update_flops_per_token(p.policy)
    utilisation = mfu(flops, tokens, seconds, p.device, p.cfg.system.train_dtype)
    return metrics | {
        "optim/policy_steps": float(p.settings.schedule.optimizer_steps),
        "system/policy_update_s": seconds,
        "system/update_tokens_per_s": tokens / max(seconds, 1e-9),
        **({} if utilisation is None else {"system/mfu": utilisation}),
    }
