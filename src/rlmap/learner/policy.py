"""The learner: policy updates on a scored batch, with the reduction's pinned denominator.

One rollout batch is reused for ``epochs_per_batch`` passes of
``minibatches_per_epoch`` optimiser steps. Each optimiser mini-batch computes its
reduction weights once (:func:`rlmap.reduction.token_weights`), then runs
micro-batches whose losses are Σ w·j with those weights, so the gradient does
not depend on ``micro_batch_size``.

π_old: in decoupled mode it is the trainer's own log-prob under the weights that
start the update. When the batch is used for exactly one optimiser step those
are the current weights, so π_old = sg(π_θ) from the same forward pass and the
extra forward pass is skipped; with more steps it is recomputed once up front.
In bypass mode π_old := μ_old and nothing is recomputed — unless the advantage
estimator itself reads π_θ before the update (V-trace's target policy), in which
case the pass runs whatever the mode and the number of steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rlmap.core.batch import Batch, cross
from rlmap.core.device import elapsed, model_device
from rlmap.core.errors import TrainingError
from rlmap.correction import BehaviourParams, KLParams, PolicyTerms, policy_loss, positive_nll
from rlmap.correction.weights import minibatch_keep, needs_old_before_update
from rlmap.learner.distributed import SINGLE, World, gather, micro_steps
from rlmap.learner.logprobs import attention_of, batched_logprobs, scored
from rlmap.learner.memory import autocast_to
from rlmap.learner.update_loop import Kept, Schedule, Updates, Weights, optimise
from rlmap.models.lora import adapters_off
from rlmap.models.routing import RouteStats, replaying
from rlmap.reduction import ReductionParams, reduce, token_weights


@dataclass(frozen=True)
class UpdateSettings:
    """What one policy update needs to know, gathered from the recipe config."""

    behaviour: BehaviourParams
    kl: KLParams
    reduction: ReductionParams
    schedule: Schedule
    """Epochs, mini-batches, micro-batch size and gradient clip (the critic's too)."""
    temperature: float
    """The sampling temperature: tokens are scored under π_θ^{1/T}."""
    train_dtype: torch.dtype = torch.float32
    """The forward passes' precision: autocast to it over float32 weights when narrower."""


def prepare_batch(
    batch: Batch,
    policy: nn.Module,
    reference: nn.Module | None,
    s: UpdateSettings,
    *,
    policy_logprobs: bool = False,
    world: World = SINGLE,
    owner: Tensor | None = None,
) -> tuple[Batch, dict[str, float]]:
    """Add π_old (decoupled mode, when reused; or always with ``policy_logprobs``, for an
    estimator that reads π_θ, such as V-trace) and π_ref (KL active) to the batch.

    Also returns the seconds each forward pass took, keyed as the step metrics
    ``system/old_logprobs_s`` (actor compute) and ``system/reference_s`` (reference
    compute); a key is present only when that pass ran, so the ledger can charge
    each model its own share. With several learner ranks each rank scores the rows it
    owns and the ranks exchange them (:func:`_shared_logprobs`). The reference is scored
    with any LoRA adapters off: a LoRA run's reference *is* its policy (the base is the
    policy with its adapters off, no second model), whatever wrapper the learner trains
    ``policy`` through. With ``behaviour.replay_sampling_set`` both are scored over each
    token's kept set (:func:`replayed_sets`): π_ref too, so that at θ = ref the KL is 0.
    """
    reused = s.schedule.optimizer_steps > 1
    needs_old = policy_logprobs or (s.behaviour.mode == "decoupled" and reused)
    needs_old = needs_old or needs_old_before_update(s.behaviour)  # M2PO selects from π_old
    attention = attention_of(batch)
    old = ref = None
    kept = replayed_sets(batch, s.behaviour)
    timings: dict[str, float] = {}
    if needs_old:
        started = time.perf_counter()
        replayed = batch.routed_experts if s.behaviour.routing_replay else None
        with autocast_to(policy, s.train_dtype):
            old = _shared_logprobs(
                policy, batch, attention, s, world, owner, replayed, sharded=True, kept=kept
            )
        timings["system/old_logprobs_s"] = elapsed(started, model_device(policy))
    if reference is not None and s.kl.placement != "none":
        started = time.perf_counter()
        with adapters_off(reference), autocast_to(reference, s.train_dtype):  # LoRA: the base
            ref = _shared_logprobs(
                reference, batch, attention, s, world, owner, None, sharded=False, kept=kept
            )
        timings["system/reference_s"] = elapsed(started, model_device(reference))
    return batch.replace(old_logprobs=old, ref_logprobs=ref), timings


def _shared_logprobs(
    model: nn.Module,
    batch: Batch,
    attention: Tensor,
    s: UpdateSettings,
    world: World,
    owner: Tensor | None,
    routes: Tensor | None,
    *,
    sharded: bool,
    kept: Tensor | None = None,
) -> Tensor:
    """(B, T) log-probs of the whole batch under ``model``: in one process directly; with
    several ranks each scores its own rows (the policy — ``sharded``, FSDP2's collectives
    — as many forward passes on every rank) and the rows are all-gathered into place."""
    if not world.parallel or owner is None:
        return batched_logprobs(
            model,
            batch.tokens,
            attention,
            temperature=s.temperature,
            micro_batch_size=s.schedule.micro_batch_size,
            routes_BTLK=routes,
            kept_BTK=kept,
        )
    mine = (owner == world.rank).nonzero().flatten()
    passes = micro_steps(owner, world, s.schedule.micro_batch_size) if sharded else 0
    rows = mine if mine.numel() else torch.zeros(1, dtype=torch.long)  # something to run on
    local = batched_logprobs(
        model,
        batch.tokens[rows],
        attention[rows],
        temperature=s.temperature,
        micro_batch_size=s.schedule.micro_batch_size,
        routes_BTLK=None if routes is None else routes[rows],
        passes=passes,
        kept_BTK=None if kept is None else kept[rows],
    )[: mine.numel()]
    out = torch.zeros(batch.tokens.shape, dtype=local.dtype, device=local.device)
    for index, part in gather(world, (mine.cpu(), local.cpu())):
        out[index.to(out.device)] = part.to(out.device)
    return out


def update_policy(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    batch: Batch,
    advantages_BT: Tensor,
    s: UpdateSettings,
    *,
    learner_version: int,
    generator: torch.Generator,
    world: World = SINGLE,
    owner: Tensor | None = None,
) -> dict[str, float]:
    """All optimiser steps on one batch (:func:`rlmap.learner.update_loop.optimise`).

    With several learner ranks ``batch`` is the global batch and ``owner`` the rank that
    trains each row (:mod:`rlmap.learner.distributed`); every figure returned is global.

    Losses, grad norm and lr are means over the optimiser steps. The objective's
    diagnostics (ratio tails, clip fractions, KL) and the entropy are computed once, over
    every action token of every update — a max is the max, p99 the quantile of all of
    them — so no figure depends on ``micro_batch_size``.
    """

    def micro(mb: Batch, rows: Tensor, w: Weights) -> tuple[Tensor, dict[str, Tensor], Kept]:
        adv_BT = cross(advantages_BT[rows], mb.tokens.device)  # the micro-batch's device
        return _micro_loss(policy, mb, adv_BT, w, s, learner_version)

    out = optimise(
        policy,
        optimizer,
        scheduler,
        batch,
        s.schedule,
        weights_of=lambda mb: _weights(mb, s),
        micro_loss=micro,
        generator=generator,
        what="policy",
        world=world,
        owner=owner,
    )
    steps = out.step_means()
    metrics = {
        "loss/total": steps.pop("loss"),
        "optim/grad_norm": steps.pop("grad_norm"),
        "optim/lr": steps.pop("lr"),
        **steps,
    }
    return metrics | _diagnostics(batch, advantages_BT, out, s, learner_version)


def _weights(mb: Batch, s: UpdateSettings) -> Weights:
    """The mini-batch's pinned weights: the reduction's, the keep-mask of a mini-batch
    correction (M2PO: applied to the objective, not to the KL term; all ones without one),
    and the positive NLL's when on.

    ``mb`` is the whole (global) mini-batch; its group ids serve ``prompt_mean``.
    """
    weights = token_weights(mb.action_mask, s.reduction, group_id=mb.group_id)
    selected = minibatch_keep(mb, s.behaviour).to(weights.dtype)  # over the whole mini-batch
    if s.behaviour.positive_nll <= 0:
        return weights, selected
    keep = mb.action_mask & (mb.rewards > 0).unsqueeze(-1)
    return weights, selected, token_weights(keep, ReductionParams(name="token_mean"))


def _micro_loss(
    policy: nn.Module,
    mb: Batch,
    adv_BT: Tensor,
    w: Weights,
    s: UpdateSettings,
    learner_version: int,
) -> tuple[Tensor, dict[str, Tensor], Kept]:
    """One micro-batch's loss Σ w·j (+ μ·NLL), its parts, and what diagnostics need."""
    routes = RouteStats()
    with (
        replaying(policy, mb.routed_experts, replay=s.behaviour.routing_replay, stats=routes),
        autocast_to(policy, s.train_dtype),
    ):
        logprobs, entropy = scored(
            policy,
            mb.tokens,
            attention_of(mb),
            temperature=s.temperature,
            with_entropy=True,
            kept_BTK=replayed_sets(mb, s.behaviour),
        )
    assert entropy is not None
    old = _old_logprobs(mb, logprobs, s)
    j_BT, _ = policy_loss(
        _terms(mb, logprobs, old, adv_BT, learner_version),
        s.behaviour,
        s.kl,
        mb.ref_logprobs,
        keep_BT=w[1],
    )
    loss = reduce(j_BT, w[0])
    parts = {"loss/policy": loss.detach()}
    if len(w) > 2:
        nll, keep = positive_nll(logprobs, mb.action_mask, mb.rewards)
        nll_loss = reduce(nll * keep, w[2])
        loss = loss + s.behaviour.positive_nll * nll_loss
        parts["loss/nll"] = nll_loss.detach()
    kept = {"logprobs": logprobs, "old": old, "entropy": entropy}
    if mb.routed_experts is not None:  # counts of this micro-batch, (1,) each
        kept["routes_compared"] = torch.tensor([routes.compared])
        kept["routes_mismatched"] = torch.tensor([routes.mismatched])
    return loss, parts, kept


def _terms(
    mb: Batch, logprobs: Tensor, old: Tensor, adv_BT: Tensor, learner_version: int
) -> PolicyTerms:
    return PolicyTerms(
        logprobs=logprobs,
        old_logprobs=old,
        behavior_logprobs=mb.behavior_logprobs,
        advantages=adv_BT.detach(),
        mask=mb.action_mask,
        policy_version=mb.policy_version,
        learner_version=learner_version,
    )


def _diagnostics(
    batch: Batch, adv_BT: Tensor, out: Updates, s: UpdateSettings, learner_version: int
) -> dict[str, float]:
    """The objective's diagnostics and the entropy, once over every update's tokens."""
    rows = out.all_rows
    seen = batch.select(rows)
    terms = _terms(seen, out.cat("logprobs"), out.cat("old"), adv_BT[rows], learner_version)
    with torch.no_grad():
        _, diag = policy_loss(terms, s.behaviour, s.kl, seen.ref_logprobs)
    mask = seen.action_mask
    entropy = (out.cat("entropy") * mask).sum() / mask.sum().clamp(min=1)
    metrics = {k: float(v) for k, v in diag.items()} | {
        "entropy": float(entropy),
        "approx_kl": float(approx_kl(terms.log_rho, mask)),
    }
    if "routes_compared" in out.kept:  # the learner's own top-k against the rollout's
        compared = int(out.cat("routes_compared").sum())
        mismatched = int(out.cat("routes_mismatched").sum())
        metrics["moe/route_mismatch_frac"] = mismatched / compared if compared else 0.0
    if s.behaviour.replay_sampling_set and batch.sampling_set is not None:
        metrics |= sampling_set_metrics(batch.sampling_set, batch.action_mask)
    return metrics


def approx_kl(log_ratio_BT: Tensor, mask_BT: Tensor) -> Tensor:
    """k3 of KL(π_old ‖ π_θ) over the masked tokens: mean of (r − 1) − log r, r = π_θ/π_old
    (docs/formulas.md §6.1; CleanRL's ``approx_kl``, Schulman's "Approximating KL
    divergence"). Each term is ≥ 0 and 0 only at r = 1; a detached scalar, 0 without tokens.

    ``log_ratio_BT`` is log r (π_θ at each micro-batch's forward pass, before its optimiser
    step; π_old the mode's, so μ_old in bypass mode). r − 1 is ``expm1``: for tiny |log r|
    float32 exp(log r) rounds to 1 and the term would come out −log r < 0.
    """
    x = log_ratio_BT.detach().float()  # (B, T)
    k3 = torch.where(mask_BT.bool(), torch.expm1(x) - x, 0.0)  # (B, T)
    return k3.sum() / mask_BT.sum().clamp(min=1)


def replayed_sets(batch: Batch, b: BehaviourParams) -> Tensor | None:
    """The batch's kept sets when top-p replay is on, else None. A batch with action tokens
    and no sets is a one-line error: scoring it over the full vocabulary would silently
    compare π with the engine's renormalised μ (slime #2167 refuses it too)."""
    if not b.replay_sampling_set:
        return None
    if batch.sampling_set is None and bool(batch.action_mask.any()):
        raise TrainingError(
            "behaviour.replay_sampling_set: the batch carries no kept sets "
            "(the rollout engine recorded none)"
        )
    return batch.sampling_set


def sampling_set_metrics(sets_BTK: Tensor, action_mask_BT: Tensor) -> dict[str, float]:
    """``sampling_set/mean_size``: ids per recorded set, over the action tokens with one;
    ``sampling_set/overflow_frac``: the share of action tokens without one (their set was
    over ``behaviour.sampling_set_cap``; they were scored over the full vocabulary)."""
    size = (sets_BTK >= 0).sum(-1)  # (B, T)
    recorded = action_mask_BT & (size > 0)
    tokens = int(action_mask_BT.sum())
    return {
        "sampling_set/mean_size": float(size[recorded].float().mean()) if recorded.any() else 0.0,
        "sampling_set/overflow_frac": (tokens - int(recorded.sum())) / tokens if tokens else 0.0,
    }


def _old_logprobs(mb: Batch, logprobs: Tensor, s: UpdateSettings) -> Tensor:
    if s.behaviour.mode == "bypass":
        return mb.behavior_logprobs
    if mb.old_logprobs is not None:
        return mb.old_logprobs
    return logprobs.detach()  # one optimiser step per batch: π_old is the current policy
