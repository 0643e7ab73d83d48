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
In bypass mode π_old := μ_old and nothing is recomputed.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from rlmap.core.batch import Batch
from rlmap.correction import BehaviourParams, KLParams, PolicyTerms, policy_loss, positive_nll
from rlmap.reduction import ReductionParams, reduce, token_weights
from rlmap.system.logprobs import attention_of, batched_logprobs, token_logprobs
from rlmap.system.optim_step import guarded_step


@dataclass(frozen=True)
class UpdateSettings:
    """What one policy update needs to know, gathered from the recipe config."""

    behaviour: BehaviourParams
    kl: KLParams
    reduction: ReductionParams
    epochs: int
    minibatches: int
    micro_batch_size: int
    max_grad_norm: float
    temperature: float

    @property
    def optimizer_steps(self) -> int:
        """Optimiser steps taken on one rollout batch."""
        return self.epochs * self.minibatches


def prepare_batch(
    batch: Batch,
    policy: nn.Module,
    reference: nn.Module | None,
    s: UpdateSettings,
) -> tuple[Batch, dict[str, float]]:
    """Add π_old (decoupled mode, when reused) and π_ref (KL active) to the batch.

    Also returns the seconds each forward pass took, keyed as the step metrics
    ``system/old_logprobs_s`` (actor compute) and ``system/reference_s`` (reference
    compute); a key is present only when that pass ran, so the ledger can charge
    each model its own share.
    """
    needs_old = s.behaviour.mode == "decoupled" and s.optimizer_steps > 1
    attention = attention_of(batch)
    old = ref = None
    timings: dict[str, float] = {}
    if needs_old:
        started = time.perf_counter()
        old = batched_logprobs(policy, batch.tokens, attention, temperature=s.temperature,
                               micro_batch_size=s.micro_batch_size)  # fmt: skip
        timings["system/old_logprobs_s"] = time.perf_counter() - started
    if reference is not None and s.kl.placement != "none":
        started = time.perf_counter()
        ref = batched_logprobs(reference, batch.tokens, attention, temperature=s.temperature,
                               micro_batch_size=s.micro_batch_size)  # fmt: skip
        timings["system/reference_s"] = time.perf_counter() - started
    return batch.replace(old_logprobs=old, ref_logprobs=ref), timings


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
) -> dict[str, float]:
    """All optimiser steps on one batch; returns the mean of each step's diagnostics."""
    history: defaultdict[str, list[float]] = defaultdict(list)
    for _ in range(s.epochs):
        order = torch.randperm(batch.size, generator=generator)
        for rows in order.tensor_split(s.minibatches):
            if rows.numel() == 0:
                continue
            stats = _minibatch_step(
                policy, batch.select(rows), advantages_BT[rows], s, learner_version
            )
            stats["optim/lr"] = float(optimizer.param_groups[0]["lr"])
            stats["optim/grad_norm"] = guarded_step(policy, optimizer, scheduler,
                                                    loss=stats["loss/total"],
                                                    max_grad_norm=s.max_grad_norm,
                                                    what="policy")  # fmt: skip
            for key, value in stats.items():
                history[key].append(value)
    return {k: max(v) if "max" in k else sum(v) / len(v) for k, v in history.items()}


def _minibatch_step(
    policy: nn.Module, mb: Batch, adv_BT: Tensor, s: UpdateSettings, learner_version: int
) -> dict[str, float]:
    """Forward/backward over micro-batches of one optimiser mini-batch (no optimiser step)."""
    mask = mb.action_mask
    weights = token_weights(mask, s.reduction)  # pinned once for the whole mini-batch
    nll_weights = None
    if s.behaviour.positive_nll > 0:
        keep = mask & (mb.rewards > 0).unsqueeze(-1)
        nll_weights = token_weights(keep, ReductionParams(name="token_mean"))
    sums: defaultdict[str, float] = defaultdict(float)
    parts = 0
    for start in range(0, mb.size, s.micro_batch_size):
        rows = slice(start, start + s.micro_batch_size)
        loss, diag = _micro_loss(policy, mb, rows, adv_BT[rows], weights[rows], s, learner_version)
        if nll_weights is not None:
            logprobs = diag.pop("_logprobs")
            nll, keep = positive_nll(logprobs, mask[rows], mb.rewards[rows])
            nll_loss = reduce(nll * keep, nll_weights[rows])
            loss = loss + s.behaviour.positive_nll * nll_loss
            sums["loss/nll"] += float(nll_loss.detach())
        diag.pop("_logprobs", None)
        loss.backward()
        sums["loss/total"] += float(loss.detach())
        for key, value in diag.items():
            sums[key] += float(value)
        parts += 1
    # Losses add up across micro-batches (they are parts of one sum); diagnostics average.
    return {k: v if k.startswith("loss/") else v / parts for k, v in sums.items()}


def _micro_loss(
    policy: nn.Module,
    mb: Batch,
    rows: slice,
    adv_BT: Tensor,
    w_BT: Tensor,
    s: UpdateSettings,
    learner_version: int,
) -> tuple[Tensor, dict[str, Tensor]]:
    tokens, mask = mb.tokens[rows], mb.action_mask[rows]
    logprobs, entropy = token_logprobs(
        policy, tokens, attention_of(mb)[rows], temperature=s.temperature, with_entropy=True
    )
    old = _old_logprobs(mb, rows, logprobs, s)
    terms = PolicyTerms(
        logprobs=logprobs,
        old_logprobs=old,
        behavior_logprobs=mb.behavior_logprobs[rows],
        advantages=adv_BT.detach(),
        mask=mask,
        policy_version=None if mb.policy_version is None else mb.policy_version[rows],
        learner_version=learner_version,
    )
    ref = None if mb.ref_logprobs is None else mb.ref_logprobs[rows]
    j_BT, diag = policy_loss(terms, s.behaviour, s.kl, ref)
    loss = reduce(j_BT, w_BT)
    assert entropy is not None
    count = mask.sum().clamp(min=1)
    diag = dict(diag)
    diag["entropy"] = (entropy * mask).sum() / count
    diag["loss/policy"] = loss.detach()
    diag["_logprobs"] = logprobs
    return loss, diag


def _old_logprobs(mb: Batch, rows: slice, logprobs: Tensor, s: UpdateSettings) -> Tensor:
    if s.behaviour.mode == "bypass":
        return mb.behavior_logprobs[rows]
    if mb.old_logprobs is not None:
        return mb.old_logprobs[rows]
    return logprobs.detach()  # one optimiser step per batch: π_old is the current policy
