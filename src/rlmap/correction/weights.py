"""Behaviour corrections: detached per-token weights that scale the objective (docs/formulas.md §4).

Notation: κ = π_old/μ_old (training vs rollout engine), m = action mask, |o_i| =
Σ_t m_{i,t}. A correction returns w (B, T), detached: a weight, a 0/1 mask, or
both. A mask never changes a denominator: dropped tokens contribute zero to the
reduction's fixed denominator (docs/formulas.md §5). Values of w off the action mask are
irrelevant (the loss is zero there).

κ-based corrections (tis, icepop, masked_is, decoupled) need decoupled mode: in
bypass mode π_old := μ_old, so κ ≡ 1 and they do nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlmap.core.errors import ConfigError
from rlmap.core.ops import masked_mean
from rlmap.core.registry import Registry
from rlmap.correction.params import BehaviourParams
from rlmap.correction.ratios import LOG_RATIO_BOUND, sequence_mean
from rlmap.correction.terms import PolicyTerms

CorrectionFn = Callable[[PolicyTerms, BehaviourParams], tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class Correction:
    """A registered correction: ``fn(terms, p) -> (w_BT detached, diagnostics)``."""

    fn: CorrectionFn
    needs_kappa: bool
    """True if it corrects κ = π_old/μ_old (meaningless in bypass mode, where κ ≡ 1)."""
    token_level: bool
    """True if its weight can differ between the tokens of one trajectory (a per-token
    weight or mask); False if it is constant along each trajectory. A token-level
    weight cannot stop a token's gradient under a sequence-level objective, whose
    sequence loss sits on every token (:attr:`Objective.sequence_level`)."""
    summary: str
    paper: str
    params: tuple[str, ...] = ()
    """The :class:`BehaviourParams` fields this correction reads (shown by ``rlmap explain``)."""
    level_switch: str | None = None
    """The :class:`BehaviourParams` field whose value ``"sequence"`` makes a token-level
    correction sequence-level (tis: ``tis_level``); None if there is none."""

    def is_token_level(self, p: BehaviourParams) -> bool:
        """Whether the weight is token-level under the settings ``p``."""
        switched = self.level_switch is not None and getattr(p, self.level_switch) == "sequence"
        return self.token_level and not switched


# ---------------------------------------------------------------- pure math


def tis_weight(log_kappa_BT: Tensor, mask_BT: Tensor, *, cap: float, level: str) -> Tensor:
    """Truncated importance sampling: w = min(κ, C); (B, T), detached.

    Paper: Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training" (C = 2). ``level`` "token": κ_t per token; "sequence":
    κ_seq,i = exp(Σ_t m_{i,t} log κ_{i,t}) (log clamped to [−20, 20]) on every token
    of trajectory i.
    """
    log_k = log_kappa_BT.detach()
    if level == "sequence":
        log_seq_B = torch.where(mask_BT, log_k, 0.0).sum(-1)  # (B,)
        log_k = log_seq_B.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).unsqueeze(-1).expand_as(log_k)
    elif level != "token":
        raise ConfigError(f"behaviour.tis_level: expected 'token' or 'sequence', got {level!r}")
    return log_k.exp().clamp(max=cap)


def icepop_weight(log_kappa_BT: Tensor, *, low: float, high: float) -> Tensor:
    """IcePop: w = κ · 1[α ≤ κ ≤ β]; (B, T), detached (masked tokens get no gradient).

    Paper: Ling Team 2025 (Ring-1T, IcePop); α = 0.5, β = 5.
    """
    kappa = log_kappa_BT.detach().exp()
    return torch.where((kappa >= low) & (kappa <= high), kappa, 0.0)


def masked_is_weight(log_kappa_BT: Tensor, mask_BT: Tensor, *, low: float, high: float) -> Tensor:
    """Sequence masked IS: w_i = 1[α ≤ g_i ≤ β], g_i = exp(Σ_t m log κ / |o_i|); (B, T).

    g_i is the geometric mean of κ over trajectory i; a trajectory outside [α, β] is
    dropped whole. A mask only: the surviving tokens are not reweighted.
    """
    g_B = sequence_mean(log_kappa_BT.detach(), mask_BT).exp()  # (B,)
    keep_B = (g_B >= low) & (g_B <= high)
    return keep_B.to(log_kappa_BT.dtype).unsqueeze(-1).expand_as(log_kappa_BT)


def version_lag(policy_version_BT: Tensor, mask_BT: Tensor, learner_version: int) -> Tensor:
    """(B,) long: learner version − the oldest action token's policy version (0 if none)."""
    big = torch.iinfo(policy_version_BT.dtype).max
    oldest_B = torch.where(mask_BT, policy_version_BT, big).amin(-1)  # (B,)
    return torch.where(mask_BT.any(-1), learner_version - oldest_B, 0)


def staleness_weight(
    policy_version_BT: Tensor, mask_BT: Tensor, *, learner_version: int, max_staleness: int
) -> Tensor:
    """w_i = 1[learner_version − min_t{v_{i,t} : m_{i,t}} ≤ η]; (B, T) float.

    A trajectory is dropped whole when its oldest action token (partial rollouts mix
    versions) lags the learner by more than η versions.
    """
    keep_B = version_lag(policy_version_BT, mask_BT, learner_version) <= max_staleness
    return keep_B.float().unsqueeze(-1).expand(mask_BT.shape)


def decoupled_weight(log_kappa_BT: Tensor, *, cap: float) -> Tensor:
    """AReaL decoupled PPO behaviour weight: w = min(sg(π_prox/μ), cap); (B, T), detached.

    Paper: Fu et al. 2025 (AReaL): ppo_clip on u = π_θ/π_prox times sg(π_prox/μ).
    Here π_prox = π_old, so u = ρ and the weight is min(κ, cap): the same weight as
    token-level TIS. Meant to be used with ``ppo_clip`` in decoupled mode.
    Differs from the public implementation: AReaL's code *drops* tokens whose weight
    exceeds the cap (``behav_imp_weight_cap``); rlmap truncates at the cap as
    docs/formulas.md §4 writes it. Use ``icepop`` with α = 0 for the dropping variant.
    """
    return log_kappa_BT.detach().exp().clamp(max=cap)


# ---------------------------------------------------------------- adapters


def _trajectory_frac(flag_B: Tensor, mask_BT: Tensor) -> Tensor:
    """Fraction of trajectories with at least one action token for which ``flag_B`` holds."""
    return masked_mean(flag_B.float(), mask_BT.any(-1))


def _tis(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    w = tis_weight(terms.log_kappa, terms.mask, cap=p.tis_cap, level=p.tis_level)
    return w, {"ratio/kappa/capped_frac": masked_mean((w >= p.tis_cap).float(), terms.mask)}


def _icepop(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    w = icepop_weight(terms.log_kappa, low=p.icepop_low, high=p.icepop_high)
    return w, {"ratio/kappa/masked_frac": masked_mean((w == 0).float(), terms.mask)}


def _masked_is(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    w = masked_is_weight(terms.log_kappa, terms.mask, low=p.masked_is_low, high=p.masked_is_high)
    dropped_B = (w == 0).any(-1)  # w is constant along a row
    return w, {"ratio/kappa/seq_masked_frac": _trajectory_frac(dropped_B, terms.mask)}


def _staleness(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    version, v = terms.policy_version, terms.learner_version
    if version is None:
        raise ConfigError(
            "behaviour.corrections: 'staleness' needs policy_version (the weight version "
            "that produced each token); the rollout engine did not record it"
        )
    if v is None:
        raise ConfigError(
            "behaviour.corrections: 'staleness' needs learner_version (the learner's current "
            "weight version); pass it to terms_from_batch"
        )
    # A version from the future is a bookkeeping bug, and would pass as lag < 0 (never
    # stale); checking it costs one host sync per call.
    future_BT = terms.mask & (version > v)
    if bool(future_BT.any()):
        newest = int(version[future_BT].amax())
        raise ConfigError(
            f"behaviour.corrections: 'staleness' got policy_version {newest} > learner_version "
            f"{v}; a token cannot come from weights newer than the learner's (version bookkeeping)"
        )
    w = staleness_weight(version, terms.mask, learner_version=v, max_staleness=p.max_staleness)
    lag_B = version_lag(version, terms.mask, v)
    diag = {
        "system/stale_frac": _trajectory_frac(lag_B > p.max_staleness, terms.mask),
        "system/max_version_lag": lag_B.amax().float(),
    }
    return w, diag


def _decoupled(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    w = decoupled_weight(terms.log_kappa, cap=p.decoupled_cap)
    capped = (w >= p.decoupled_cap).float()
    return w, {"ratio/kappa/decoupled_capped_frac": masked_mean(capped, terms.mask)}


registry: Registry[Correction] = Registry("behaviour correction")
registry.add(
    "tis",
    Correction(
        _tis,
        needs_kappa=True,
        token_level=True,
        summary="w = min(κ, C), token or sequence",
        paper="Yao et al. 2025 (TIS)",
        params=("tis_cap", "tis_level"),
        level_switch="tis_level",
    ),
)
registry.add(
    "icepop",
    Correction(
        _icepop,
        needs_kappa=True,
        token_level=True,
        summary="w = κ·1[α ≤ κ ≤ β]",
        paper="Ling Team 2025 (IcePop)",
        params=("icepop_low", "icepop_high"),
    ),
)
registry.add(
    "masked_is",
    Correction(
        _masked_is,
        needs_kappa=True,
        token_level=False,
        summary="drop trajectories whose geometric-mean κ leaves [α, β]",
        paper="sequence-level masked IS (verl rollout correction, 2025)",
        params=("masked_is_low", "masked_is_high"),
    ),
)
registry.add(
    "staleness",
    Correction(
        _staleness,
        needs_kappa=False,
        token_level=False,
        summary="drop trajectories more than η versions stale",
        paper="AReaL, SAO",
        params=("max_staleness",),
    ),
)
registry.add(
    "decoupled",
    Correction(
        _decoupled,
        needs_kappa=True,
        token_level=True,
        summary="AReaL behaviour weight min(π_prox/μ, cap)",
        paper="Fu et al. 2025 (AReaL)",
        params=("decoupled_cap",),
    ),
)
