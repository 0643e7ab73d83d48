"""What an advantage estimator returns, and its registry entry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from rlmap.core.batch import Batch
from rlmap.estimators.params import CreditParams


@dataclass(frozen=True)
class Credit:
    """Advantages (and critic targets) for one batch; every tensor is detached."""

    advantages: Tensor
    """(B, T) float: Â per token; zero off the action mask and on invalid rows."""
    returns: Tensor | None
    """(B, T) float: critic targets (TD(λ_critic) return or V-trace v_s), zero off the action
    mask and on invalid rows; None for critic-free estimators."""
    diagnostics: dict[str, Tensor]
    """Detached scalars: ``adv/mean``, ``adv/std``; group estimators add
    ``group/all_correct_frac``, ``group/all_wrong_frac``, ``group/zero_adv_frac`` (and with turn
    groups ``group/anchor_groups``, ``group/anchor_turn_frac``, ``group/anchor_zero_adv_frac``,
    :func:`rlmap.estimators.gigpo.anchor_diagnostics`); critic
    estimators add ``critic/explained_variance``, ``critic/value_error_first`` and
    ``critic/value_error_last`` (of the values the estimator was given), and on a batch with a
    segment boundary ``critic/segment_value_gap`` and ``critic/segment_value_gap_signed``
    (:func:`rlmap.estimators.segments.segment_value_gap`)."""


@dataclass(frozen=True)
class Estimator:
    """A registered advantage estimator: one call signature for all, plus metadata."""

    fn: Callable[[Batch, CreditParams], Credit]
    """``fn(batch, params) -> Credit``; a thin adapter over the pure math function."""
    needs_group: bool
    """Requires G >= 2 trajectories per prompt (rloo, grpo, dr_grpo, reinforce_pp_baseline)."""
    needs_critic: bool
    """Requires critic values in the batch (gae, vtrace)."""
    summary: str
    """The formula in one line."""
    paper: str
    """Short citation of the paper that introduced it."""
    needs_policy_logprobs: bool = False
    """Reads the learner's log π_θ of the batch, before the update (``batch.old_logprobs``),
    whatever the ratio mode and however many optimiser steps follow: V-trace's target
    policy. Without it (μ in its place) every ratio would be 1 and nothing corrected."""
    turn_scope: bool = False
    """Takes ``sampling.group_scope=turn``: its group baseline is applied a second time over
    the anchor states of ``Batch.turn_group`` (GiGPO, docs/formulas.md §2.4); rloo, grpo,
    dr_grpo."""
