"""The behaviour axis composed: objective × corrections (+ KL in the loss), per token.

    j_{i,t} = m_{i,t} · ( j^obj_{i,t} · Π_c w^c_{i,t}  +  β · k_{i,t} [KL in the loss] )

The result is the unreduced (B, T) loss; the reduction axis averages it with its
fixed denominator, so a correction that masks a token zeroes it without changing
any denominator. VAPO's positive-example NLL has its own mask and token mean
(:func:`rlmap.correction.nll.positive_nll`); the trainer adds μ times its reduction.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlmap.core.errors import ConfigError
from rlmap.core.ops import masked_mean
from rlmap.correction.kl import registry as kl_estimators
from rlmap.correction.objectives import registry as objectives
from rlmap.correction.params import BehaviourParams, KLParams
from rlmap.correction.terms import PolicyTerms
from rlmap.correction.weights import registry as corrections


def check_behaviour(p: BehaviourParams, kl: KLParams) -> None:
    """Raise a one-line ConfigError for an invalid behaviour/KL setting or combination."""
    objectives.get(p.objective)  # unknown names list the known ones
    for name in p.corrections:
        if corrections.get(name).needs_kappa and p.mode == "bypass":
            raise ConfigError(
                f"behaviour.corrections: '{name}' corrects κ = π_old/μ_old, which is 1 in "
                "bypass mode; use mode 'decoupled' or drop it"
            )
    if len(set(p.corrections)) != len(p.corrections):
        raise ConfigError(f"behaviour.corrections: duplicate names in {p.corrections}")
    _check_levels(p)
    _check_thresholds(p)
    _check_selections(p)
    if p.dual_clip is not None and p.dual_clip <= 1.0:
        raise ConfigError(f"behaviour.dual_clip: must be > 1, got {p.dual_clip}")
    if p.clip_low < 0 or p.clip_high < 0 or p.gate_low < 0 or p.gate_high < 0:
        raise ConfigError("behaviour.clip_low/clip_high/gate_low/gate_high: must be >= 0")
    if kl.placement != "none":
        kl_estimators.get(kl.estimator)
    if kl.target is not None and kl.target <= 0:
        raise ConfigError(f"kl.target: must be > 0, got {kl.target}")


def _check_thresholds(p: BehaviourParams) -> None:
    """DPPO, DRO and GMPO hyper-parameters, one line naming the field (docs/formulas.md §3).

    Written as ``not ok`` so that a NaN, which fails every comparison, is refused too.
    """
    for name in ("dppo_tv_low", "dppo_tv_high"):
        value = getattr(p, name)
        if not 0.0 <= value <= 1.0:
            raise ConfigError(
                f"behaviour.{name}: must be in [0, 1] (a gap of two probabilities), got {value}"
            )
    for name in ("dppo_kl_low", "dppo_kl_high", "dppo_tau", "gmpo_clip_low", "gmpo_clip_high"):
        value = getattr(p, name)
        if not value >= 0.0:
            raise ConfigError(f"behaviour.{name}: must be >= 0, got {value}")
    if not p.dro_beta > 0.0:
        raise ConfigError(
            f"behaviour.dro_beta: must be > 0 (at β = 0 dro is plain pg, silently off-policy "
            f"on a reused batch), got {p.dro_beta}"
        )


def _check_selections(p: BehaviourParams) -> None:
    """M2PO's τ and OPSM's δ (docs/formulas.md §4), checked whether or not they are listed.

    τ ≤ 0 would drop every token of nonzero (log κ)²; δ < 0 would drop an Â < 0 trajectory
    whose policy has not moved at all (its mean log μ − log π_θ is 0). ``not ok`` refuses NaN.
    """
    if not p.m2po_threshold > 0.0:
        raise ConfigError(f"behaviour.m2po_threshold: must be > 0, got {p.m2po_threshold}")
    if not p.opsm_delta >= 0.0:
        raise ConfigError(f"behaviour.opsm_delta: must be >= 0, got {p.opsm_delta}")


def _check_levels(p: BehaviourParams) -> None:
    """A sequence-level objective takes no token-level correction (docs/formulas.md §4).

    A sequence-level objective writes one sequence loss j_i on every token of i, and
    each copy carries the gradient of every token's log π_θ. A per-token weight w_t
    scales only token t's copy, so a masked (w_t = 0) or capped token still gets
    gradient through the other copies. E.g. GSPO, IcePop κ = (10, 1, 1), Â = 1, s = 1,
    response_mean: the gradient is (w_1 + w_2 + w_3)/3 · (−1/3) = −2/9 on every token,
    not (0, −1/3, −1/3).
    """
    objective = objectives.get(p.objective)
    if not objective.is_sequence_level(p):
        return
    for name in p.corrections:
        if corrections.get(name).is_token_level(p):
            switch = objective.token_switch
            fix = f"set behaviour.{switch}=true or " if switch is not None else ""
            raise ConfigError(
                f"behaviour.corrections: '{name}' weights single tokens, but objective "
                f"'{p.objective}' is sequence-level (one sequence loss on every token), so a "
                f"masked or capped token would still get gradient; {fix}use a sequence-level "
                f"correction ({_sequence_level_corrections()})"
            )


def _sequence_level_corrections() -> str:
    """The corrections that can be sequence-level, as a user would set them."""
    options = []
    for name in corrections:
        entry = corrections.get(name)
        if not entry.token_level:
            options.append(name)
        elif entry.level_switch is not None:
            options.append(f"{name} with {entry.level_switch}=sequence")
    return ", ".join(options)


def policy_loss(
    terms: PolicyTerms,
    p: BehaviourParams,
    kl: KLParams,
    ref_logprobs: Tensor | None = None,
    keep_BT: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """(j_BT, diagnostics): the objective times every correction's weight, + β·k in the loss.

    ``ref_logprobs`` (B, T) log π_ref is required when ``kl.placement == "loss"``.
    ``keep_BT`` (B, T) is the keep-mask a mini-batch correction (M2PO) selected over the
    whole optimiser mini-batch (:func:`rlmap.correction.weights.minibatch_keep`, this
    micro-batch's rows), applied like a correction's weight. The KL term is not multiplied
    by the correction weights: it regularises every action token. Diagnostics are detached
    scalars (objective, corrections, ``kl/mean``).
    """
    check_behaviour(p, kl)
    j, diag = objectives.get(p.objective).fn(terms, p)  # (B, T)
    for name in p.corrections:
        w, more = corrections.get(name).fn(terms, p)
        j = j * w.detach()
        diag |= more
    if keep_BT is not None:
        j = j * keep_BT.to(j.dtype)
    if kl.placement == "loss":
        if ref_logprobs is None:
            raise ConfigError("kl.placement: 'loss' needs ref_logprobs (log π_ref per token)")
        estimator = kl_estimators.get(kl.estimator)
        k = estimator.per_token(terms.logprobs, ref_logprobs, terms.old_logprobs)  # (B, T)
        j = j + kl.beta * k
        diag["kl/mean"] = masked_mean(k.detach(), terms.mask)
    return torch.where(terms.mask, j, 0.0), diag
