"""Axis 3, credit: how far must credit travel? Advantage estimators and the critic's loss.

``registry`` names every estimator; each entry's ``fn(batch, params) -> Credit`` is a
thin adapter over a pure function exported here (docs/formulas.md §2).
"""

from rlmap.core.registry import Registry
from rlmap.estimators.adapters import build_registry, train_mask, turn_groups
from rlmap.estimators.critic import explained_variance, value_errors, value_loss
from rlmap.estimators.gae import adaptive_lambda, gae, gae_advantages, turn_gae
from rlmap.estimators.gigpo import (
    TurnAdvantages,
    anchor_diagnostics,
    anchor_ids,
    gigpo_advantages,
)
from rlmap.estimators.group import (
    GroupStats,
    dr_grpo_advantages,
    group_diagnostics,
    group_stats,
    grpo_advantages,
    rloo_advantages,
)
from rlmap.estimators.params import CreditParams, CriticParams
from rlmap.estimators.record import Credit, Estimator
from rlmap.estimators.reinforce import (
    discounted_returns,
    reinforce_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
)
from rlmap.estimators.stats import whiten
from rlmap.estimators.turns import TurnIndex
from rlmap.estimators.vtrace import turn_vtrace, vtrace

registry: Registry[Estimator] = build_registry()
"""The advantage estimators: reinforce, rloo, grpo, dr_grpo, reinforce_pp,
reinforce_pp_baseline, gae, vtrace. With ``sampling.group_scope=turn`` rloo, grpo and
dr_grpo add GiGPO's step baseline over anchor states (``gigpo_advantages``)."""

__all__ = [
    "Credit",
    "CreditParams",
    "CriticParams",
    "Estimator",
    "GroupStats",
    "TurnAdvantages",
    "TurnIndex",
    "adaptive_lambda",
    "anchor_diagnostics",
    "anchor_ids",
    "discounted_returns",
    "dr_grpo_advantages",
    "explained_variance",
    "gae",
    "gae_advantages",
    "gigpo_advantages",
    "group_diagnostics",
    "group_stats",
    "grpo_advantages",
    "registry",
    "reinforce_advantages",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "rloo_advantages",
    "train_mask",
    "turn_gae",
    "turn_groups",
    "turn_vtrace",
    "value_errors",
    "value_loss",
    "vtrace",
    "whiten",
]
