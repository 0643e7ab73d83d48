"""Policy objectives: per-token losses j_{i,t} to minimise (docs/formulas.md §3).

Notation: Â = advantages (B, T), m = action mask, r = exp(log ρ) the ratio the
mode selects (ρ in decoupled mode; d in bypass mode, where π_old := μ_old), sg =
stop-gradient. Every objective returns the *unreduced* (B, T) loss, zero off the
mask; averaging it is the reduction axis's job (docs/formulas.md §5).

Each objective comes in two layers: a pure ``*_loss`` function (tensors and keyword
hyper-parameters in, loss out; by family in :mod:`rlmap.correction.clip_objectives` and
:mod:`rlmap.correction.trust_region`) and a registered adapter ``fn(terms, p)``, here, that reads
:class:`BehaviourParams`, masks the loss and adds detached diagnostics: clip
fractions and the tails of every ratio in use (ρ and κ in decoupled mode, d always).
The clip fractions are keyed ``ratio/rho/*`` in both modes; in bypass mode the
clipped ratio is d (see :func:`_clip_fracs`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from rlmap.core.ops import masked_mean
from rlmap.core.registry import Registry
from rlmap.correction.clip_objectives import (
    cispo_loss,
    direct_gate_loss,
    gmpo_loss,
    gspo_loss,
    pg_loss,
    ppo_clip_active,
    ppo_clip_loss,
    sapo_loss,
)
from rlmap.correction.params import BehaviourParams
from rlmap.correction.ratios import ratio_stats, sequence_mean
from rlmap.correction.terms import PolicyTerms
from rlmap.correction.trust_region import dppo_kl_dropped, dppo_loss, dppo_tv_dropped, dro_loss

ObjectiveFn = Callable[[PolicyTerms, BehaviourParams], tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class Objective:
    """A registered policy objective: ``fn(terms, p) -> (j_BT, diagnostics)``."""

    fn: ObjectiveFn
    summary: str
    paper: str
    params: tuple[str, ...] = ()
    """The :class:`BehaviourParams` fields this objective reads (shown by ``rlmap explain``)."""
    uses_ratio: bool = True
    """False for on-policy objectives with no importance ratio: reusing a batch for a
    second update would make them silently off-policy."""
    sequence_level: bool = False
    """True if j_{i,t} is one sequence loss j_i copied onto every action token of i, so
    each token's log π_θ gets gradient through every other token's copy. A per-token
    correction weight then cannot stop a token's gradient (docs/formulas.md §4): combining
    them is a configuration error (:func:`rlmap.correction.loss.check_behaviour`)."""
    token_switch: str | None = None
    """The boolean :class:`BehaviourParams` field that, when true, makes a sequence-level
    objective token-level (gspo: ``gspo_token``); None if there is none."""
    code: str = ""
    """The anchor implementations (repository, file::function) the objective was checked
    against, where docs/formulas.md §3 says how each differs; empty where none was read."""

    def is_sequence_level(self, p: BehaviourParams) -> bool:
        """Whether the objective is sequence-level under the settings ``p``."""
        switched = self.token_switch is not None and bool(getattr(p, self.token_switch))
        return self.sequence_level and not switched


# ---------------------------------------------------------------- adapters


def _ratio_tails(terms: PolicyTerms, p: BehaviourParams) -> dict[str, Tensor]:
    """Tails of d always; of ρ and κ too in decoupled mode (in bypass ρ = d, κ ≡ 1)."""
    stats = ratio_stats(terms.log_d, terms.mask, "d")
    if p.mode == "decoupled":
        stats |= ratio_stats(terms.log_rho, terms.mask, "rho")
        stats |= ratio_stats(terms.log_kappa, terms.mask, "kappa")
    return stats


def _on_mask(j_BT: Tensor, terms: PolicyTerms) -> Tensor:
    """j where m, 0 elsewhere (``where``, not a product, so garbage off the mask cannot leak)."""
    return torch.where(terms.mask, j_BT, 0.0)


def _clip_fracs(high_BT: Tensor, low_BT: Tensor, mask_BT: Tensor) -> dict[str, Tensor]:
    """Fractions of action tokens where the clip removes the gradient (upper, lower, either).

    Keys: ``ratio/rho/clipped_frac``, ``ratio/rho/clipped_high_frac``,
    ``ratio/rho/clipped_low_frac``. The keys name ρ whatever the mode: in bypass mode
    π_old := μ_old, so the clipped ratio is the direct ratio d = π_θ/μ_old (= ρ there),
    and these fractions are d's. The names stay fixed so that a metric keeps one key
    across modes; read them together with ``behaviour.mode``.
    """
    return {
        "ratio/rho/clipped_frac": masked_mean((high_BT | low_BT).float(), mask_BT),
        "ratio/rho/clipped_high_frac": masked_mean(high_BT.float(), mask_BT),
        "ratio/rho/clipped_low_frac": masked_mean(low_BT.float(), mask_BT),
    }


def _pg(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    j = pg_loss(terms.logprobs, terms.advantages)
    return _on_mask(j, terms), _ratio_tails(terms, p)


def _ppo_clip(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clip on the mode's ratio r (ρ in decoupled mode, d in bypass mode).

    Diagnostics ``ratio/rho/clipped_*`` and ``ratio/rho/dual_clipped_frac`` measure r:
    in bypass mode they are the clip fractions of d, not of a recomputed ρ
    (see :func:`_clip_fracs`).
    """
    log_r, adv = terms.log_rho, terms.advantages
    j = ppo_clip_loss(log_r, adv, clip_low=p.clip_low, clip_high=p.clip_high, dual_clip=p.dual_clip)
    r = log_r.detach().exp()
    high, low = ppo_clip_active(r, adv, clip_low=p.clip_low, clip_high=p.clip_high)
    diag = _clip_fracs(high, low, terms.mask) | _ratio_tails(terms, p)
    if p.dual_clip is not None:
        dual = (adv < 0) & (r > p.dual_clip)
        diag["ratio/rho/dual_clipped_frac"] = masked_mean(dual.float(), terms.mask)
    return _on_mask(j, terms), diag


def _cispo(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    log_r = terms.log_rho
    j = cispo_loss(
        terms.logprobs, log_r, terms.advantages, clip_low=p.clip_low, clip_high=p.clip_high
    )
    r = log_r.detach().exp()
    high, low = r > 1.0 + p.clip_high, r < 1.0 - p.clip_low  # the weight is clipped
    return _on_mask(j, terms), _clip_fracs(high, low, terms.mask) | _ratio_tails(terms, p)


def _gspo(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    log_r, adv, mask = terms.log_rho, terms.advantages, terms.mask
    j = gspo_loss(
        log_r, adv, mask, clip_low=p.clip_low, clip_high=p.clip_high, token_level=p.gspo_token
    )
    s_B1 = sequence_mean(log_r.detach(), mask).exp().unsqueeze(-1)  # (B, 1)
    adv_sign = adv if p.gspo_token else sequence_mean(adv, mask).unsqueeze(-1)
    high, low = ppo_clip_active(
        s_B1.expand_as(adv), adv_sign.expand_as(adv), clip_low=p.clip_low, clip_high=p.clip_high
    )
    return _on_mask(j, terms), _clip_fracs(high, low, mask) | _ratio_tails(terms, p)


def _sapo(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    j = sapo_loss(terms.log_rho, terms.advantages, tau_pos=p.sapo_tau_pos, tau_neg=p.sapo_tau_neg)
    return _on_mask(j, terms), _ratio_tails(terms, p)


def _direct_gate(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    log_d = terms.log_d
    j = direct_gate_loss(
        terms.logprobs, log_d, terms.advantages, gate_low=p.gate_low, gate_high=p.gate_high
    )
    d = log_d.detach().exp()
    outside = (d <= 1.0 - p.gate_low) | (d >= 1.0 + p.gate_high)
    diag = {"ratio/d/masked_frac": masked_mean(outside.float(), terms.mask)}
    return _on_mask(j, terms), diag | _ratio_tails(terms, p)


def _dppo(
    terms: PolicyTerms, p: BehaviourParams, high: Tensor, low: Tensor
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO on the mode's r. The mask's reference is the same π_old as r's: the trainer's
    recomputation in decoupled mode, μ_old in bypass mode (the paper's, prime-rl's, SkyRL's).

    ``ratio/rho/clipped_*`` are the dropped fractions (high: Â > 0, low: Â < 0): a dropped
    token loses its gradient exactly as a clipped one does in ppo_clip.
    """
    j = dppo_loss(terms.log_rho, terms.advantages, high | low, tau=p.dppo_tau)
    return _on_mask(j, terms), _clip_fracs(high, low, terms.mask) | _ratio_tails(terms, p)


def _dppo_tv(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    high, low = dppo_tv_dropped(
        terms.logprobs,
        terms.old_logprobs,
        terms.advantages,
        delta_low=p.dppo_tv_low,
        delta_high=p.dppo_tv_high,
    )
    return _dppo(terms, p, high, low)


def _dppo_kl(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    high, low = dppo_kl_dropped(
        terms.logprobs,
        terms.old_logprobs,
        terms.advantages,
        delta_low=p.dppo_kl_low,
        delta_high=p.dppo_kl_high,
    )
    return _dppo(terms, p, high, low)


def _dro(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    j = dro_loss(terms.logprobs, terms.log_rho, terms.advantages, beta=p.dro_beta)
    return _on_mask(j, terms), _ratio_tails(terms, p)


def _gmpo(terms: PolicyTerms, p: BehaviourParams) -> tuple[Tensor, dict[str, Tensor]]:
    """``ratio/rho/clipped_*``: tokens whose log r the clip holds (no gradient), high for
    Â_i > 0 and log r > ε_high, low for Â_i < 0 and log r < −ε_low (TRL's clip_ratio/*)."""
    log_r, adv, mask = terms.log_rho, terms.advantages, terms.mask
    j = gmpo_loss(log_r, adv, mask, clip_low=p.gmpo_clip_low, clip_high=p.gmpo_clip_high)
    adv_B1 = sequence_mean(adv, mask).unsqueeze(-1)  # (B, 1)
    log_r = log_r.detach()
    high = (adv_B1 > 0) & (log_r > p.gmpo_clip_high)
    low = (adv_B1 < 0) & (log_r < -p.gmpo_clip_low)
    return _on_mask(j, terms), _clip_fracs(high, low, mask) | _ratio_tails(terms, p)


registry: Registry[Objective] = Registry("policy objective")
_CLIP = ("clip_low", "clip_high")
registry.add(
    "pg",
    Objective(_pg, "−Â·log π_θ, on-policy REINFORCE", "Williams 1992", uses_ratio=False),
)
registry.add(
    "ppo_clip",
    Objective(
        _ppo_clip,
        "PPO clip on ρ, asymmetric ε, optional dual clip",
        "Schulman et al. 2017",
        (*_CLIP, "dual_clip"),
    ),
)
registry.add(
    "cispo",
    Objective(_cispo, "clipped, detached IS weight × Â·log π_θ", "MiniMax-M1, 2025", _CLIP),
)
registry.add(
    "gspo",
    Objective(
        _gspo,
        "PPO clip on the sequence ratio",
        "Zheng et al. 2025 (GSPO)",
        (*_CLIP, "gspo_token"),
        sequence_level=True,
        token_switch="gspo_token",
    ),
)
registry.add(
    "sapo",
    Objective(
        _sapo,
        "soft sigmoid gate instead of a clip",
        "Gao et al. 2025 (SAPO)",
        ("sapo_tau_pos", "sapo_tau_neg"),
    ),
)
registry.add(
    "direct_gate",
    Objective(
        _direct_gate,
        "d·Â·log π_θ gated to 1−ε_l < d < 1+ε_h (DIS)",
        "Hou et al. (SAO)",
        ("gate_low", "gate_high"),
    ),
)
_DPPO_PAPER = "Qi et al. 2026, Rethinking the Trust Region in LLM RL (DPPO), arXiv 2602.04879"
registry.add(
    "dppo_tv",
    Objective(
        _dppo_tv,
        "raw r·Â; a token whose probability moved past δ in Â's direction is dropped (TV)",
        _DPPO_PAPER + ", Eq. 13",
        ("dppo_tv_low", "dppo_tv_high", "dppo_tau"),
        code="verl trainer/ppo/core_algos.py::compute_policy_loss_dppo_tv (0.9.1); prime-rl "
        "trainer/rl/loss.py::default_loss_fn; SkyRL skyrl_train/utils/ppo_utils.py::"
        "dppo_policy_loss (binary_tv)",
    ),
)
registry.add(
    "dppo_kl",
    Objective(
        _dppo_kl,
        "raw r·Â; a token whose binary KL to the reference passed δ in Â's direction is dropped",
        _DPPO_PAPER + ", Eq. 14",
        ("dppo_kl_low", "dppo_kl_high", "dppo_tau"),
        code="verl trainer/ppo/core_algos.py::compute_policy_loss_dppo_kl (0.9.1); SkyRL "
        "skyrl_train/utils/ppo_utils.py::dppo_policy_loss (binary_kl)",
    ),
)
registry.add(
    "dro",
    Objective(
        _dro,
        "−Â·log π_θ + (β/2)(log r)², direct reward optimisation",
        "Richemond et al. 2024, arXiv 2405.19107; Kimi Team 2025, Kimi k1.5, arXiv 2501.12599",
        ("dro_beta",),
        code="verl trainer/ppo/core_algos.py::compute_policy_loss_dro (0.9.1); Tinker "
        'loss_fn="dro" (tinker-docs /tinker/losses/dro)',
    ),
)
registry.add(
    "gmpo",
    Objective(
        _gmpo,
        "−Â_i × geometric mean of the log-space-clipped token ratios",
        "Zhao et al. 2025, Geometric-Mean Policy Optimization (GMPO), arXiv 2507.20673",
        ("gmpo_clip_low", "gmpo_clip_high"),
        sequence_level=True,
        code="verl trainer/ppo/core_algos.py::compute_policy_loss_geo_mean (0.9.1); TRL "
        "trl/experimental/gmpo/gmpo_trainer.py::GMPOTrainer._compute_loss",
    ),
)
