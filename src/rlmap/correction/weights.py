"""Behaviour corrections: detached per-token weights that scale the objective (docs/formulas.md §4).

Notation: κ = π_old/μ_old (training vs rollout engine), m = action mask, |o_i| =
Σ_t m_{i,t}. A correction returns w (B, T), detached: a weight, a 0/1 mask, or
both. A mask never changes a denominator: dropped tokens contribute zero to the
reduction's fixed denominator (docs/formulas.md §5). Values of w off the action mask are
irrelevant (the loss is zero there).

κ-based corrections (tis, icepop, masked_is, decoupled, m2po) need decoupled mode: in
bypass mode π_old := μ_old, so κ ≡ 1 and they do nothing.

M2PO selects over the whole optimiser mini-batch, so it cannot be a per-micro-batch weight:
its entry has a ``minibatch`` keep function that the learner applies once per mini-batch to
the pinned reduction weights (:func:`minibatch_keep`); its ``fn`` returns w ≡ 1 and the
diagnostics only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlmap.core.batch import Batch
from rlmap.core.errors import ConfigError
from rlmap.core.ops import at_least_float32, masked_mean
from rlmap.core.registry import Registry
from rlmap.correction.params import BehaviourParams
from rlmap.correction.ratios import LOG_RATIO_BOUND, log_kappa, sequence_mean
from rlmap.correction.terms import PolicyTerms

CorrectionFn = Callable[[PolicyTerms, BehaviourParams], tuple[Tensor, dict[str, Tensor]]]
MinibatchFn = Callable[[Tensor, Tensor, BehaviourParams], Tensor]
"""(log κ (B, T), action mask (B, T), params) -> keep (B, T) bool, over one whole mini-batch."""


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
    minibatch: MinibatchFn | None = None
    """A keep-mask selected over the whole optimiser mini-batch (M2PO), or None. The learner
    multiplies the mini-batch's pinned reduction weights by it before any micro-batch runs
    (:func:`minibatch_keep`), so it cannot depend on ``micro_batch_size``; it reads π_old,
    which the trainer then recomputes before the update. ``fn`` returns w ≡ 1."""

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


def m2po_keep(log_kappa_BT: Tensor, mask_BT: Tensor, *, threshold: float) -> Tensor:
    """M2PO: drop the tokens of largest M2 = (log κ)² until the rest's mean M2 ≤ τ; (B, T) bool.

    Paper: Zheng et al. 2025, "Prosperity before Collapse" (arXiv 2510.01161), τ_M2 = 0.04 in
    AReaL's ``examples/math/gsm8k_m2po.yaml``. Code: AReaL
    ``areal/trainer/ppo/actor.py::_apply_m2po_masking``, ``::_get_m2po_loss_mask``. With the
    N masked values sorted m_(1) ≥ … ≥ m_(N), k is the smallest count for which
    (1/(N−k)) Σ_{j>k} m_(j) ≤ τ, and every token with M2 ≥ m_(k) is dropped: ties at the cut
    go together, so the mask does not depend on the order of the rows. Differs from AReaL:
    the learner selects over the optimiser mini-batch (AReaL: per micro-batch) and the
    reduction's denominator keeps the dropped tokens (AReaL's shrinks, docs/formulas.md §5);
    the test is ≤ τ (AReaL: < τ); when no k < N works every token is dropped (AReaL keeps the
    smallest one, to avoid dividing by 0).
    """
    m2_BT = at_least_float32(log_kappa_BT.detach()).square()
    if m2_BT.numel() == 0:
        return mask_BT.clone()
    desc = torch.where(mask_BT, m2_BT, -torch.inf).flatten().sort(descending=True).values
    values = torch.where(torch.isfinite(desc), desc, 0.0).double()  # the N masked ones, then 0
    dropped = torch.cat([values.new_zeros(1), values.cumsum(0)])  # Σ of the k largest, k = 0..L
    rest = mask_BT.sum() - torch.arange(dropped.numel(), device=desc.device)  # N − k, k = 0..L
    fits = (rest <= 0) | (dropped[-1] - dropped <= threshold * rest)
    k = fits.int().argmax()  # the first count that fits; k = N always does
    cut = torch.where(k > 0, desc[(k - 1).clamp(min=0)], torch.inf)  # m_(k), the smallest dropped
    return mask_BT & (m2_BT < cut)


def opsm_keep(log_d_BT: Tensor, advantages_BT: Tensor, mask_BT: Tensor, *, delta: float) -> Tensor:
    """Off-policy sequence mask: w_i = 1[Â_i ≥ 0 ∨ D_i ≤ δ]; (B, T), constant along each row.

    D_i = (1/|o_i|) Σ_t m_{i,t} sg(log μ_old − log π_θ) = −mean_t log d, the sampled-token
    estimate of KL(μ_old ‖ π_θ); Â_i = (1/|o_i|) Σ_t m Â, the trajectory's advantage. A
    trajectory that was bad (Â_i < 0) and that π_θ has moved away from (D_i > δ) is dropped
    whole; Â_i ≥ 0 is never dropped; an empty row has D_i = 0 and is kept.
    Paper: DeepSeek-AI 2025, DeepSeek-V3.2 (arXiv 2512.02556), "Off-Policy Sequence Masking".
    Code: slime ``slime/utils/ppo_utils.py::compute_opsm_mask`` (``--use-opsm``, δ =
    ``--opsm-delta`` = 1e-4); TRL ``GRPOTrainer.get_off_policy_mask``
    (``off_policy_mask_threshold``, off by default). "old" is μ_old, the rollout engine's
    log-prob, as in the paper (π_old "directly returned by the inference framework") and TRL
    with vLLM, so both the policy's drift and the engine mismatch count, in either mode.
    Differs: slime's default "old" is the trainer's π_old (μ only with
    ``--use-rollout-logprobs``); slime and TRL test each token's Â_{i,t}, rlmap the row's
    mean Â_i — the same for outcome advantages, and the mask stays sequence-level (usable
    under GSPO) for per-token ones.
    """
    kl_B = -sequence_mean(log_d_BT.detach(), mask_BT)  # (B,)
    adv_B = sequence_mean(advantages_BT.detach(), mask_BT)  # (B,)
    keep_B = (adv_B >= 0) | (kl_B <= delta)
    return keep_B.to(kl_B.dtype).unsqueeze(-1).expand(mask_BT.shape)


def minibatch_keep(batch: Batch, p: BehaviourParams) -> Tensor:
    """(B, T) bool: the product of the listed mini-batch corrections' keep-masks (M2PO).

    ``batch`` is one whole optimiser mini-batch, before any micro-batch runs
    (:func:`rlmap.learner.policy._weights` multiplies its pinned weights by this), so the
    selection is the same whatever ``micro_batch_size``. All True when none is listed.
    """
    keep = torch.ones(batch.action_mask.shape, dtype=torch.bool)
    selectors = [c.minibatch for c in map(registry.get, p.corrections) if c.minibatch is not None]
    if not selectors:
        return keep
    if batch.old_logprobs is None:
        raise ConfigError(
            "behaviour.corrections: a mini-batch correction (m2po) reads log κ = log π_old − "
            "log μ_old before the update, but π_old was not recomputed (Batch.old_logprobs)"
        )
    log_k = log_kappa(batch.old_logprobs, batch.behavior_logprobs)
    mask = batch.action_mask & batch.valid.unsqueeze(-1)
    for select in selectors:
        keep = keep & select(log_k, mask, p)
    return keep


def needs_old_before_update(p: BehaviourParams) -> bool:
    """Whether a listed correction selects over the mini-batch from π_old (M2PO): the
    trainer must then recompute π_old before the update, even for one optimiser step."""
    return any(registry.get(name).minibatch is not None for name in p.corrections)


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


def _m2po_select(log_kappa_BT: Tensor, mask_BT: Tensor, p: BehaviourParams) -> Tensor:
    return m2po_keep(log_kappa_BT, mask_BT, threshold=p.m2po_threshold)


def _m2po(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    """w ≡ 1: the learner applies the mini-batch's selection; here only its figures, over
    the tokens given (the whole batch's updates, in the learner's diagnostics)."""
    keep = m2po_keep(terms.log_kappa, terms.mask, threshold=p.m2po_threshold)
    diag = {
        "ratio/kappa/m2": masked_mean(at_least_float32(terms.log_kappa).square(), terms.mask),
        "ratio/kappa/m2po_masked_frac": masked_mean((~keep).float(), terms.mask),
    }
    return torch.ones_like(terms.log_kappa), diag


def _opsm(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    w = opsm_keep(terms.log_d, terms.advantages, terms.mask, delta=p.opsm_delta)
    dropped_B = (w == 0).any(-1)  # w is constant along a row
    return w, {"ratio/d/seq_masked_frac": _trajectory_frac(dropped_B, terms.mask)}


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
registry.add(
    "m2po",
    Correction(
        _m2po,
        needs_kappa=True,
        token_level=True,
        summary="drop the largest (log κ)² until the rest's mean is ≤ τ, per optimiser mini-batch",
        paper="Zheng et al. 2025 (M2PO, arXiv 2510.01161); AReaL "
        "areal/trainer/ppo/actor.py::_apply_m2po_masking",
        params=("m2po_threshold",),
        minibatch=_m2po_select,
    ),
)
registry.add(
    "opsm",
    Correction(
        _opsm,
        needs_kappa=False,
        token_level=False,
        summary="drop trajectories with Â < 0 whose mean log μ_old − log π_θ exceeds δ",
        paper="DeepSeek-AI 2025 (DeepSeek-V3.2, arXiv 2512.02556); slime "
        "slime/utils/ppo_utils.py::compute_opsm_mask, TRL GRPOTrainer.get_off_policy_mask",
        params=("opsm_delta",),
    ),
)
