"""verl's policy-loss rows: ``loss_mode`` and the bounds it reads, ``loss_agg_mode``, the
rollout correction (``rollout_is``, ``rollout_rs``) and bypass mode. Sources in :mod:`.verl`.
"""

from __future__ import annotations

from typing import Any

from rlmap.core.errors import ConfigError
from rlmap.recipes.translate.rows import Lookup, Mapped, icepop, one_of, tis
from rlmap.recipes.translate.verl_rows import RC, A

LOSS_MODES = (
    "vanilla",
    "gspo",
    "sapo",
    "cispo",
    "gpg",
    "clip_cov",
    "kl_cov",
    "geo_mean",
    "dro",
    "dppo_tv",
    "dppo_kl",
)


AGG_MODES = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
    "seq-mean-token-sum",
    "token-sum",
)
PER_SEQUENCE = {"reduction.name": "response_mean", "reduction.max_len": None}


def _bypass(get: Lookup) -> bool:
    return bool(get(RC + "bypass_mode"))


def loss_mode(value: Any, get: Lookup) -> Mapped:
    one_of(A + "policy_loss.loss_mode", value, LOSS_MODES, "verl")
    if _bypass(get):
        return Mapped(
            {},
            note="ignored: rollout_correction.bypass_mode replaces every loss_mode "
            "(rollout_corr_helper.apply_bypass_mode)",
        )
    if value == "vanilla":
        dual = get(A + "clip_ratio_c")
        return Mapped(
            {"behaviour.objective": "ppo_clip", "behaviour.dual_clip": dual},
            note="trap: vanilla always dual-clips A<0 at clip_ratio_c "
            "(core_algos.py compute_policy_loss_vanilla)",
        )
    if value == "gspo":
        return Mapped(
            {"behaviour.objective": "gspo", "behaviour.gspo_token": True, **PER_SEQUENCE},
            note="forces seq-mean-token-mean whatever loss_agg_mode says",
        )
    if value == "sapo":
        return Mapped(
            {
                "behaviour.objective": "sapo",
                "behaviour.sapo_tau_pos": get(A + "tau_pos"),
                "behaviour.sapo_tau_neg": get(A + "tau_neg"),
                **PER_SEQUENCE,
            },
            note="forces seq-mean-token-mean whatever loss_agg_mode says",
        )
    if value in ("cispo", "gpg"):
        objective = "cispo" if value == "cispo" else "pg"
        return Mapped(
            {"behaviour.objective": objective, "behaviour.dual_clip": None},
            note="gpg: the objective only" if value == "gpg" else "",
        )
    return _other_loss(value, get)


def _other_loss(value: Any, get: Lookup) -> Mapped:
    """geo_mean (GMPO), dro and DPPO: clip_ratio_low/high are their bounds, not PPO's."""
    low, high = get(A + "clip_ratio_low"), get(A + "clip_ratio_high")
    if value == "geo_mean":
        return Mapped(
            {
                "behaviour.objective": "gmpo",
                "behaviour.gmpo_clip_low": low,
                "behaviour.gmpo_clip_high": high,
                **PER_SEQUENCE,
            },
            note="clip_ratio_low/high are GMPO's log-space bounds; a mean over "
            "sequences (torch.mean of the per-sequence loss)",
        )
    if value == "dro":
        beta = get(A + "policy_loss.dro_beta")
        if beta is None or beta <= 0:
            raise ConfigError(
                f"{A}policy_loss.dro_beta: loss_mode=dro needs dro_beta > 0, got {beta!r}"
            )
        return Mapped({"behaviour.objective": "dro", "behaviour.dro_beta": beta})
    if value in ("dppo_tv", "dppo_kl"):
        return Mapped(
            {
                "behaviour.objective": value,
                f"behaviour.{value}_low": low,
                f"behaviour.{value}_high": high,
                "behaviour.dppo_tau": 0.0,
            },
            "approximate",
            "clip_ratio_low/high are DPPO's δ; verl also truncates the ratio at "
            "clip_ratio_c (the same gradient wherever r < c)",
        )
    return Mapped({}, "none", f"rlmap has no {value} loss; the closest preset's objective is kept")


def clip(name: str) -> Any:
    """clip_ratio_low/high: PPO's ε for vanilla, gspo and cispo; other losses read them."""

    def convert(value: Any, get: Lookup) -> Mapped:
        mode = "vanilla" if _bypass(get) else get(A + "policy_loss.loss_mode")
        if mode in ("geo_mean", "dppo_tv", "dppo_kl"):
            return Mapped({}, note=f"read with loss_mode={mode}")
        return Mapped({name: value})

    return convert


def clip_c(value: Any, get: Lookup) -> Mapped:
    mode = "vanilla" if _bypass(get) else get(A + "policy_loss.loss_mode")
    used = {
        "vanilla": "behaviour.dual_clip (read with loss_mode)",
        "dppo_tv": "the ratio's truncation (read with loss_mode)",
        "dppo_kl": "the ratio's truncation (read with loss_mode)",
    }
    return Mapped({}, note=used.get(mode, "unused by this loss_mode"))


def agg(value: Any, get: Lookup) -> Mapped:
    key = A + "loss_agg_mode"
    one_of(key, value, AGG_MODES, "verl")
    simple = {
        "token-mean": "token_mean",
        "seq-mean-token-mean": "response_mean",
        "seq-mean-token-sum": "seq_mean_token_sum",
        "token-sum": "token_sum",
    }
    if value in simple:
        trap = "trap: rlmap's grpo preset is response_mean" if value == "token-mean" else ""
        return Mapped({"reduction.name": simple[value], "reduction.max_len": None}, note=trap)
    scale = get(A + "loss_scale_factor")
    fields = {
        "reduction.name": "fixed_budget",
        "reduction.max_len": scale or get("data.max_response_length"),
    }
    if scale:
        return Mapped(fields)
    return Mapped(
        fields,
        "approximate",
        "loss_scale_factor unset: verl divides by the "
        "micro-batch's padded width, which changes with packing",
    )


def _band(key: str, value: Any) -> tuple[float | None, float]:
    """A threshold as (lower, upper): a float is an upper bound alone, "lo_hi" a band
    (rollout_corr_helper._parse_rollout_is_threshold and _parse_rollout_rs_thresholds)."""
    text = str(value).strip()
    try:
        if "_" in text:
            low, high = text.split("_", 1)
            return float(low), float(high)
        return None, float(text)
    except ValueError:
        raise ConfigError(f"{key}: {value!r} is neither a float nor 'lower_upper'") from None


def _is_fields(get: Lookup) -> tuple[dict[str, Any], str, str]:
    """The IS weight rlmap applies for rollout_is (decoupled mode): fields, kind, note."""
    level = get(RC + "rollout_is")
    if level is None:
        return (
            {},
            "exact",
            "off (the YAML's null; a RolloutCorrectionConfig() in code is 'sequence')",
        )
    one_of(RC + "rollout_is", level, ("token", "sequence"), "verl")
    low, high = _band(RC + "rollout_is_threshold", get(RC + "rollout_is_threshold"))
    if low is None:
        return tis(level, high), "exact", "w = min(κ, C)"  # a float: TIS's cap
    if level == "token":
        return icepop(low, high), "exact", "w = κ·1[lo ≤ κ ≤ hi]"
    return {}, "none", "sequence-level IcePop: rlmap's icepop is per token"


def rollout_is(value: Any, get: Lookup) -> Mapped:
    if _bypass(get):
        if value is None or get(RC + "loss_type") == "ppo_clip":
            return Mapped(
                {}, note="bypass with ppo_clip: verl computes the weights for metrics only"
            )
        return Mapped({}, note="read with bypass_mode")
    fields, kind, note = _is_fields(get)
    return Mapped(fields, kind, note)


def _rs_band(value: Any) -> tuple[float, float]:
    """rollout_rs_threshold for a *_k1 option as the band of the geometric-mean κ it keeps.

    verl keeps −mean log κ in [log lo, log hi], i.e. κ̄ in [1/hi, 1/lo]; a single number u
    means lo = 1/u (rollout_corr_helper._parse_rollout_rs_thresholds)."""
    low, high = _band(RC + "rollout_rs_threshold", value)
    low = 1.0 / high if low is None else low
    return 1.0 / high, 1.0 / low


def rollout_rs(value: Any, get: Lookup) -> Mapped:
    if value is None:
        return Mapped({}, note="no rejection sampling")
    if _bypass(get):
        return Mapped(
            {},
            "none",
            "bypass mode rejects on π_θ/μ; rlmap's masks read κ = π_old/μ, "
            "which is 1 in bypass mode",
        )
    if value != "seq_mean_k1":
        return Mapped({}, "none", f"rollout_rs={value}: rlmap's masked_is is seq_mean_k1 only")
    threshold = get(RC + "rollout_rs_threshold")
    if threshold is None:
        raise ConfigError(f"{RC}rollout_rs_threshold: rollout_rs={value} needs a threshold")
    low, high = _rs_band(threshold)
    is_fields, _, _ = _is_fields(get)
    corrections = [*is_fields.get("behaviour.corrections", []), "masked_is"]
    fields = {
        "behaviour.corrections": corrections,
        "behaviour.masked_is_low": low,
        "behaviour.masked_is_high": high,
    }
    return Mapped(
        fields,
        "approximate",
        f"keeps κ̄ in [{low:g}, {high:g}]; verl drops the "
        "rejected tokens from the loss's denominators (and the KL term), rlmap "
        "weights them 0 and still counts them",
    )


def bypass_mode(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({}, note="decoupled: π_old recomputed by the actor")
    if get(RC + "loss_type") != "ppo_clip":
        return Mapped(
            {},
            "none",
            "loss_type=reinforce (IS-weighted policy gradient in bypass mode): no rlmap objective",
        )
    return Mapped(
        {
            "behaviour.mode": "bypass",
            "behaviour.objective": "ppo_clip",
            "behaviour.dual_clip": get(A + "clip_ratio_c"),
            "behaviour.corrections": [],
        },
        note="π_old := μ; vanilla PPO whatever loss_mode says, so dual-clipped at clip_ratio_c",
    )
