"""Behaviour axis: which distribution produced the data, and how is the update corrected?

- ``registry``: policy objectives (pg, ppo_clip, cispo, gspo, sapo, direct_gate), each
  ``fn(terms, p) -> (j_BT, diagnostics)``;
- ``corrections``: behaviour corrections (tis, icepop, masked_is, staleness, decoupled),
  each ``fn(terms, p) -> (w_BT, diagnostics)``;
- ``kl_estimators``: k1, k2, k3;
- :func:`policy_loss` composes them; ratios, KL, VAPO NLL and routing replay are
  plain functions in their modules (docs/formulas.md §1, §3, §4, §6).
"""

from __future__ import annotations

from rlmap.correction.kl import KLEstimator, adaptive_beta, k1, k2, k3, kl_in_reward
from rlmap.correction.kl import registry as kl_estimators
from rlmap.correction.loss import check_behaviour, policy_loss
from rlmap.correction.nll import positive_nll
from rlmap.correction.objectives import Objective, registry
from rlmap.correction.params import BehaviourParams, KLParams
from rlmap.correction.r3 import replay_router_logits, router_mask
from rlmap.correction.ratios import ratio_stats, resolve_old
from rlmap.correction.terms import PolicyTerms, terms_from_batch
from rlmap.correction.weights import Correction
from rlmap.correction.weights import registry as corrections

__all__ = [
    "BehaviourParams",
    "Correction",
    "KLEstimator",
    "KLParams",
    "Objective",
    "PolicyTerms",
    "adaptive_beta",
    "check_behaviour",
    "corrections",
    "k1",
    "k2",
    "k3",
    "kl_estimators",
    "kl_in_reward",
    "policy_loss",
    "positive_nll",
    "ratio_stats",
    "registry",
    "replay_router_logits",
    "resolve_old",
    "router_mask",
    "terms_from_batch",
]
