"""verl's Hydra config → rlmap: the table, and its inverse for ``explain --as verl``.

Defaults are those of verl 0.9.1's ``verl/trainer/config/_generated_ppo_trainer.yaml``
(written ``G:line`` below), read from the PyPI wheel ``verl-0.9.1-py3-none-any.whl``; the
losses, the rollout correction and the advantage code from the same wheel
(``verl/trainer/ppo/core_algos.py``, ``verl/trainer/ppo/rollout_corr_helper.py``,
``verl/trainer/ppo/ray_trainer.py``). ``TRANSLATE.md`` §1 has the reasoning.
A: ``actor_rollout_ref.actor.``, RO: ``actor_rollout_ref.rollout.``, ALG: ``algorithm.``,
RC: ``algorithm.rollout_correction.``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlmap.core.errors import ConfigError
from rlmap.recipes.config import RecipeConfig, read_yaml
from rlmap.recipes.translate import (
    IMPLIED,
    NULL,
    Lookup,
    Mapped,
    Mapping,
    betas,
    field,
    flatten,
    implied,
    off,
    read_with,
)

A = "actor_rollout_ref.actor."
RO = "actor_rollout_ref.rollout."
ALG = "algorithm."
RC = "algorithm.rollout_correction."
G = "verl 0.9.1 verl/trainer/config/_generated_ppo_trainer.yaml"

ESTIMATORS = {
    "gae": "gae",
    "grpo": "grpo",
    "grpo_vectorized": "grpo",
    "rloo": "rloo",
    "rloo_vectorized": "rloo",
    "reinforce_plus_plus": "reinforce_pp",
    "reinforce_plus_plus_baseline": "reinforce_pp_baseline",
}
NO_ESTIMATOR = {
    "remax": "needs a greedy baseline rollout",
    "opo": "a length-weighted baseline",
    "grpo_passk": "credit to the top-1 only",
    "gpg": "scales by B/#nonzero",
    "optimal_token_baseline": "no such baseline in rlmap",
    "tir_optimal_token_baseline": "no such baseline in rlmap",
    "gdpo": "no such estimator in rlmap",
}
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
KL_TYPES = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}
PER_SEQUENCE = {"reduction.name": "response_mean", "reduction.max_len": None}


def _one_of(key: str, value: Any, known: Any) -> None:
    if value not in known:
        raise ConfigError(f"{key}: {value!r} is not a verl value (one of {', '.join(known)})")


def _estimator(value: Any, get: Lookup) -> Mapped:
    _one_of(ALG + "adv_estimator", value, [*ESTIMATORS, *NO_ESTIMATOR])
    if value in NO_ESTIMATOR:
        return Mapped({}, "none", f"{NO_ESTIMATOR[value]}; the closest preset's estimator is kept")
    name = ESTIMATORS[value]
    if name == "grpo" and not get(ALG + "norm_adv_by_std_in_grpo"):
        return Mapped(
            {"credit.estimator": "dr_grpo", "critic.enabled": False},
            note="norm_adv_by_std_in_grpo=False",
        )
    if name == "gae":
        return Mapped(
            {"credit.estimator": "gae", "critic.enabled": True},
            "approximate",
            "verl whitens GAE advantages over the batch (core_algos.py "
            "compute_gae_advantage_return); rlmap does not. Trap: verl's default "
            "estimator is gae, i.e. critic PPO",
        )
    if name.startswith("reinforce_pp"):
        return Mapped(
            {"credit.estimator": name, "critic.enabled": False},
            "approximate",
            "verl whitens with the unbiased variance + 1e-8, rlmap the biased std + "
            "1e-6: a factor N/(N-1) over the batch's tokens",
        )
    std = {"credit.std_eps": 1e-6} if name == "grpo" else {}
    return Mapped(
        {"credit.estimator": name, "critic.enabled": False, **std},
        note="a singleton group gets A=R in verl, 0 in rlmap" if std else "",
    )


def _std_norm(value: Any, get: Lookup) -> Mapped:
    return Mapped({}, note="read with adv_estimator (False with grpo: dr_grpo)")


def _bypass(get: Lookup) -> bool:
    return bool(get(RC + "bypass_mode"))


def _loss_mode(value: Any, get: Lookup) -> Mapped:
    _one_of(A + "policy_loss.loss_mode", value, LOSS_MODES)
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


def _clip(name: str) -> Any:
    """clip_ratio_low/high: PPO's ε for vanilla, gspo and cispo; other losses read them."""

    def convert(value: Any, get: Lookup) -> Mapped:
        mode = "vanilla" if _bypass(get) else get(A + "policy_loss.loss_mode")
        if mode in ("geo_mean", "dppo_tv", "dppo_kl"):
            return Mapped({}, note=f"read with loss_mode={mode}")
        return Mapped({name: value})

    return convert


def _clip_c(value: Any, get: Lookup) -> Mapped:
    mode = "vanilla" if _bypass(get) else get(A + "policy_loss.loss_mode")
    used = {
        "vanilla": "behaviour.dual_clip (read with loss_mode)",
        "dppo_tv": "the ratio's truncation (read with loss_mode)",
        "dppo_kl": "the ratio's truncation (read with loss_mode)",
    }
    return Mapped({}, note=used.get(mode, "unused by this loss_mode"))


def _agg(value: Any, get: Lookup) -> Mapped:
    key = A + "loss_agg_mode"
    _one_of(
        key,
        value,
        (
            "token-mean",
            "seq-mean-token-mean",
            "seq-mean-token-sum-norm",
            "seq-mean-token-sum",
            "token-sum",
        ),
    )
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


def _kl_loss(value: Any, get: Lookup) -> Mapped:
    in_reward = get(ALG + "use_kl_in_reward")
    if value and in_reward:
        return Mapped(
            {}, "none", "KL in the loss and in the reward at once: rlmap has one placement"
        )
    if not value:
        return Mapped(
            {} if in_reward else {"kl.placement": "none", "kl.beta": 0.0},
            note="trap: verl's default is no KL loss",
        )
    kl_type = get(A + "kl_loss_type")
    if kl_type not in KL_TYPES:
        return Mapped({}, "none", f"kl_loss_type={kl_type}: rlmap has k1, k2, k3 only")
    return Mapped(
        {
            "kl.placement": "loss",
            "kl.beta": get(A + "kl_loss_coef"),
            "kl.estimator": KL_TYPES[kl_type],
            "kl.target": None,
        }
    )


def _kl_in_reward(value: Any, get: Lookup) -> Mapped:
    if not value or get(A + "use_kl_loss"):
        return Mapped({}, note="" if not value else "see use_kl_loss")
    penalty = get(ALG + "kl_penalty")
    if KL_TYPES.get(penalty) != "k1":
        return Mapped({}, "none", f"kl_penalty={penalty}: rlmap's in-reward KL is k1")
    fields = {
        "kl.placement": "reward",
        "kl.estimator": "k1",
        "kl.beta": get(ALG + "kl_ctrl.kl_coef"),
    }
    if get(ALG + "kl_ctrl.type") == "adaptive":
        fields |= {
            "kl.target": get(ALG + "kl_ctrl.target_kl"),
            "kl.horizon": get(ALG + "kl_ctrl.horizon"),
        }
    else:
        fields["kl.target"] = None
    return Mapped(
        fields,
        note="−β·k1 per token; an outcome estimator's R is their sum, as "
        "verl's score (token_level_rewards.sum(-1))",
    )


def _minibatches(value: Any, get: Lookup) -> Mapped:
    batch = get("data.train_batch_size")
    if not value or batch % value:
        raise ConfigError(
            f"{A}ppo_mini_batch_size: {value} does not divide data.train_batch_size {batch}"
        )
    return Mapped(
        {"optim.minibatches_per_epoch": batch // value},
        note=f"trap: {batch}/{value} = {batch // value} updates a batch",
    )


def _per_step(get: Lookup) -> int:
    """Optimiser steps per verl training step (epochs × mini-batches)."""
    return int(get(A + "ppo_epochs")) * (
        get("data.train_batch_size") // get(A + "ppo_mini_batch_size")
    )


def _warmup(value: Any, get: Lookup) -> Mapped:
    per_step = _per_step(get)
    steps = max(int(value), 0) * per_step
    if steps == 0:
        return Mapped({"optim.warmup_steps": 0}, note="no warm-up")
    return Mapped(
        {"optim.warmup_steps": steps},
        "approximate",
        f"verl steps its scheduler once per training step, rlmap once per optimiser "
        f"step: {value} × {per_step}",
    )


def _schedule(value: Any, get: Lookup) -> Mapped:
    _one_of(A + "optim.lr_scheduler_type", value, ("constant", "cosine"))
    if value == "constant":
        return Mapped({"optim.schedule": "constant"})
    return Mapped(
        {"optim.schedule": "cosine"},
        "approximate",
        "verl steps its scheduler once "
        "per training step (rlmap per optimiser step) and keeps min_lr_ratio and "
        "num_cycles",
    )


def _filter(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"sampling.filter": "none"})
    metric = get(ALG + "filter_groups.metric")
    rounds = get(ALG + "filter_groups.max_num_gen_batches")
    fields = {"sampling.filter": "mixed", **({"sampling.max_rounds": rounds} if rounds > 0 else {})}
    why = "" if metric == "acc" else f"metric={metric} includes shaping; "
    return Mapped(
        fields,
        "approximate",
        why + "verl keeps single-trajectory groups, rlmap drops "
        "them; max_num_gen_batches ≤ 0 (unbounded) keeps rlmap's finite cap",
    )


OVERLONG = "reward.reward_kwargs.overlong_buffer_cfg."


def _overlong(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"feedback.overlong_cache": None})
    factor = get(OVERLONG + "penalty_factor")
    if factor != 1.0:
        return Mapped({}, "none", f"penalty_factor={factor}: rlmap's overlong term has factor 1")
    return Mapped(
        {"feedback.overlong_cache": get(OVERLONG + "len")},
        "approximate",
        "verl's DAPO reward is ±1, rlmap's exact_match 0/1: the overlong penalty "
        "weighs 2× more in rlmap",
    )


def _is_threshold(value: Any) -> tuple[float | None, float]:
    """rollout_is_threshold as (lower, upper): a float is TIS's cap; "lo_hi" IcePop's band
    (rollout_corr_helper._parse_rollout_is_threshold)."""
    text = str(value).strip()
    try:
        if "_" in text:
            low, high = text.split("_", 1)
            return float(low), float(high)
        return None, float(text)
    except ValueError:
        raise ConfigError(
            f"{RC}rollout_is_threshold: {value!r} is neither a float nor 'lower_upper'"
        ) from None


def _is_fields(get: Lookup) -> tuple[dict[str, Any], str, str]:
    """The IS weight rlmap applies for rollout_is (decoupled mode): fields, kind, note."""
    level = get(RC + "rollout_is")
    if level is None:
        return (
            {},
            "exact",
            "off (the YAML's null; a RolloutCorrectionConfig() in code is 'sequence')",
        )
    _one_of(RC + "rollout_is", level, ("token", "sequence"))
    low, high = _is_threshold(get(RC + "rollout_is_threshold"))
    if low is None:
        return (
            {
                "behaviour.corrections": ["tis"],
                "behaviour.tis_level": level,
                "behaviour.tis_cap": high,
            },
            "exact",
            "w = min(κ, C)",
        )
    if level == "token":
        return (
            {
                "behaviour.corrections": ["icepop"],
                "behaviour.icepop_low": low,
                "behaviour.icepop_high": high,
            },
            "exact",
            "w = κ·1[lo ≤ κ ≤ hi]",
        )
    return {}, "none", "sequence-level IcePop: rlmap's icepop is per token"


def _rollout_is(value: Any, get: Lookup) -> Mapped:
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
    text = str(value).strip()
    try:
        low, high = (float(v) for v in text.split("_", 1)) if "_" in text else (None, float(text))
    except ValueError:
        raise ConfigError(
            f"{RC}rollout_rs_threshold: {value!r} is neither a float nor 'lower_upper'"
        ) from None
    low = 1.0 / high if low is None else low
    return 1.0 / high, 1.0 / low


def _rollout_rs(value: Any, get: Lookup) -> Mapped:
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


def _bypass_mode(value: Any, get: Lookup) -> Mapped:
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


def _reward_model(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped(
            {"feedback.source": "verifier"},
            note="a reward function (the reward manager), rlmap's verifier",
        )
    return Mapped(
        {"feedback.source": "reward_model"},
        "approximate",
        "a trained reward model: set model.reward_path to a local copy",
    )


BEHAVIOUR = {
    "behaviour.mode": "decoupled",
    "behaviour.corrections": [],
    "behaviour.positive_nll": 0.0,
    "system.mode": "sync",
}


TABLE: tuple[Mapping, ...] = (
    Mapping(
        IMPLIED + "behaviour policy",
        implied(BEHAVIOUR, "π_old recomputed by the actor, no rollout correction, synchronous"),
        "decoupled",
        f"{G} (rollout_correction: null)",
    ),
    Mapping(
        OVERLONG + "len",
        read_with(OVERLONG + "enable"),
        0,
        "verl-recipe dapo/config/dapo_trainer.yaml",
    ),
    Mapping(
        OVERLONG + "penalty_factor",
        read_with(OVERLONG + "enable"),
        0.0,
        "verl-recipe dapo/config/dapo_trainer.yaml",
    ),
    Mapping(OVERLONG + "enable", _overlong, False, "verl-recipe dapo/config/dapo_trainer.yaml"),
    Mapping("reward.reward_model.enable", _reward_model, False, f"{G}:793"),
    Mapping(ALG + "adv_estimator", _estimator, "gae", f"{G}:861"),
    Mapping(ALG + "norm_adv_by_std_in_grpo", _std_norm, True, f"{G}:862"),
    Mapping(ALG + "gamma", field("credit.gamma"), 1.0, f"{G}:859"),
    Mapping(ALG + "lam", field("credit.lam", "trap: rlmap's default is 0.95"), 1.0, f"{G}:860"),
    Mapping(
        RO + "n",
        field("sampling.group_size", "trap: 1 by default"),
        1,
        "verl 0.9.1 verl/trainer/config/rollout/rollout.yaml:127",
    ),
    Mapping("data.train_batch_size", field("sampling.prompts_per_step"), 1024, f"{G}:506"),
    Mapping(A + "ppo_mini_batch_size", _minibatches, 256, f"{G}:80"),
    Mapping(A + "ppo_epochs", field("optim.epochs_per_batch"), 1, f"{G}:111"),
    Mapping(A + "ppo_micro_batch_size_per_gpu", field("optim.micro_batch_size"), None, f"{G}:82"),
    Mapping(A + "clip_ratio_low", _clip("behaviour.clip_low"), 0.2, f"{G}:86"),
    Mapping(A + "clip_ratio_high", _clip("behaviour.clip_high"), 0.2, f"{G}:87"),
    Mapping(A + "clip_ratio_c", _clip_c, 3.0, f"{G}:100"),
    Mapping(A + "tau_pos", read_with(A + "policy_loss.loss_mode"), 1.0, f"{G}:88"),
    Mapping(A + "tau_neg", read_with(A + "policy_loss.loss_mode"), 1.05, f"{G}:89"),
    Mapping(A + "policy_loss.dro_beta", read_with(A + "policy_loss.loss_mode"), NULL, f"{G}:99"),
    Mapping(A + "loss_scale_factor", read_with(A + "loss_agg_mode"), None, f"{G}:102"),
    Mapping(A + "loss_agg_mode", _agg, "token-mean", f"{G}:101"),
    Mapping(A + "policy_loss.loss_mode", _loss_mode, "vanilla", f"{G}:93"),
    Mapping(A + "entropy_coeff", off("rlmap has no entropy bonus", (0, 0.0)), 0, f"{G}:103"),
    Mapping(A + "kl_loss_coef", read_with(A + "use_kl_loss"), 0.001, f"{G}:109"),
    Mapping(A + "kl_loss_type", read_with(A + "use_kl_loss"), "low_var_kl", f"{G}:110"),
    Mapping(ALG + "kl_penalty", read_with(ALG + "use_kl_in_reward"), "kl", f"{G}:870"),
    Mapping(ALG + "kl_ctrl.type", read_with(ALG + "use_kl_in_reward"), "fixed", f"{G}:873"),
    Mapping(ALG + "kl_ctrl.kl_coef", read_with(ALG + "use_kl_in_reward"), 0.001, f"{G}:874"),
    Mapping(ALG + "kl_ctrl.horizon", read_with(ALG + "use_kl_in_reward"), 10000, f"{G}:875"),
    Mapping(ALG + "kl_ctrl.target_kl", read_with(ALG + "use_kl_in_reward"), 0.1, f"{G}:876"),
    Mapping(A + "use_kl_loss", _kl_loss, False, f"{G}:106"),
    Mapping(ALG + "use_kl_in_reward", _kl_in_reward, False, f"{G}:869"),
    Mapping(
        ALG + "filter_groups.metric", read_with(ALG + "filter_groups.enable"), "reward", f"{G}:866"
    ),
    Mapping(
        ALG + "filter_groups.max_num_gen_batches",
        read_with(ALG + "filter_groups.enable"),
        0,
        f"{G}:867",
    ),
    Mapping(ALG + "filter_groups.enable", _filter, False, f"{G}:865"),
    Mapping(RC + "rollout_is_threshold", read_with(RC + "rollout_is"), 2.0, f"{G}:852"),
    Mapping(RC + "rollout_is", _rollout_is, NULL, f"{G}:851"),
    Mapping(RC + "rollout_rs_threshold", read_with(RC + "rollout_rs"), NULL, f"{G}:854"),
    Mapping(RC + "rollout_rs", _rollout_rs, NULL, f"{G}:853"),
    Mapping(
        RC + "rollout_is_batch_normalize",
        off("IS weights normalised to mean 1 over the batch: no rlmap correction", (False,)),
        False,
        f"{G}:857",
    ),
    Mapping(RC + "loss_type", read_with(RC + "bypass_mode"), "ppo_clip", f"{G}:856"),
    Mapping(RC + "bypass_mode", _bypass_mode, False, f"{G}:855"),
    Mapping("data.max_response_length", field("generation.max_new_tokens"), 512, f"{G}:505"),
    Mapping("data.max_prompt_length", off("a data filter, not a run setting", ()), 512, f"{G}:504"),
    Mapping(RO + "temperature", field("generation.temperature"), 1.0, f"{G}:297"),
    Mapping(RO + "top_p", field("generation.top_p"), 1.0, f"{G}:299"),
    Mapping(RO + "top_k", off("rlmap has no top_k (docs/translate.md)", (-1, 0)), -1, f"{G}:298"),
    Mapping(A + "optim.lr", field("optim.lr"), 1e-6, f"{G}:12"),
    Mapping(
        A + "optim.weight_decay",
        field("optim.weight_decay", "trap: rlmap's default is 0"),
        0.01,
        f"{G}:15",
    ),
    Mapping(A + "optim.betas", betas, [0.9, 0.999], f"{G}:17-19"),
    Mapping(A + "optim.lr_warmup_steps", _warmup, -1, f"{G}:16"),
    Mapping(A + "optim.lr_scheduler_type", _schedule, "constant", f"{G}:23"),
    Mapping(A + "optim.clip_grad", field("optim.max_grad_norm"), 1.0, f"{G}:20"),
    Mapping("critic.optim.lr", field("optim.critic_lr"), None, f"{G}:539"),
    Mapping("critic.cliprange_value", field("critic.value_clip"), None, f"{G}:617"),
    Mapping(
        "actor_rollout_ref.model.path", field("model.path", "the source's model"), None, f"{G}:436"
    ),
    Mapping("trainer.total_training_steps", field("optim.steps"), None, f"{G}:952"),
)
"""The rows, in the order they apply (a later row's fields win: loss_mode after
loss_agg_mode, because gspo and sapo force their own reduction; bypass_mode last of the
behaviour rows, because it replaces the loss)."""


def table(world_size: int = 1, flat: dict[str, Any] | None = None) -> tuple[Mapping, ...]:
    """The table (its rows depend neither on the number of processes nor on the file)."""
    return TABLE


def read(path: Path) -> dict[str, Any]:
    """A verl YAML (a run's resolved config or a recipe) as flat dotted keys."""
    return flatten(read_yaml(path))


LOSS_MODE = {
    "ppo_clip": "vanilla",
    "gspo": "gspo",
    "sapo": "sapo",
    "cispo": "cispo",
    "pg": "gpg",
    "gmpo": "geo_mean",
    "dro": "dro",
}
AGG = {
    "token_mean": "token-mean",
    "response_mean": "seq-mean-token-mean",
    "fixed_budget": "seq-mean-token-sum-norm",
    "seq_mean_token_sum": "seq-mean-token-sum",
    "token_sum": "token-sum",
}
FORCED_PER_SEQUENCE = ("gspo", "sapo", "gmpo")
KL_NAMES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


def differences(cfg: RecipeConfig) -> list[str]:
    """What verl's settings cannot reproduce of ``cfg``, one line each."""
    b, r, s, c, k = cfg.behaviour, cfg.reduction, cfg.sampling, cfg.credit, cfg.kl
    checks = [
        (
            cfg.feedback.source not in ("verifier", "reward_model"),
            f"feedback.source={cfg.feedback.source}: a reward function or a reward model only",
        ),
        (
            c.estimator == "grpo" and c.std_eps != 1e-6,
            f"credit.std_eps: verl adds 1e-6 to the std, rlmap {c.std_eps:g}",
        ),
        (
            c.estimator not in {*ESTIMATORS.values(), "dr_grpo"},
            f"credit.estimator={c.estimator}: no verl estimator",
        ),
        (c.estimator == "gae", "gae: verl whitens the advantages over the batch"),
        (c.estimator.startswith("reinforce_pp"), "reinforce_pp: verl whitens with another std"),
        (b.objective not in LOSS_MODE, f"behaviour.objective={b.objective}: no verl loss_mode"),
        (
            b.objective == "ppo_clip" and b.dual_clip is None,
            "behaviour.dual_clip=None: verl's vanilla loss always dual-clips (c=3)",
        ),
        (
            (b.objective == "gspo" and not b.gspo_token)
            or (b.objective in FORCED_PER_SEQUENCE and r.name != "response_mean"),
            f"{b.objective}: verl forces seq-mean-token-mean (and token-level GSPO)",
        ),
        (r.name not in AGG, f"reduction.name={r.name}: no verl loss_agg_mode"),
        (
            b.mode == "bypass" and (b.objective != "ppo_clip" or b.dual_clip is None),
            "behaviour.mode=bypass: verl's bypass mode is dual-clipped vanilla PPO only",
        ),
        (
            not set(b.corrections) <= {"tis", "icepop", "masked_is"}
            or (b.mode == "bypass" and bool(b.corrections)),
            f"behaviour.corrections={list(b.corrections)}: not in verl's rollout correction",
        ),
        (
            "masked_is" in b.corrections,
            "masked_is: verl drops rejected tokens from the denominators",
        ),
        (k.placement == "reward" and k.estimator != "k1", "kl: verl's in-reward KL is k1 here"),
        (
            k.placement == "loss" and k.estimator not in KL_NAMES,
            f"kl.estimator={k.estimator}: no verl kl_loss_type",
        ),
        (s.filter not in ("none", "mixed"), f"sampling.filter={s.filter}: verl filters mixed only"),
        (
            cfg.feedback.overlong_cache is not None,
            "feedback.overlong_cache: verl's DAPO reward is ±1, rlmap's 0/1 (penalty weighs 2×)",
        ),
        (c.lam_critic is not None or c.adaptive_alpha is not None, "credit: verl has one λ"),
        (cfg.optim.warmup_steps > 0, "optim.warmup_steps: verl counts training steps"),
        (
            cfg.optim.schedule != "constant",
            f"optim.schedule={cfg.optim.schedule}: verl steps its schedule per training step",
        ),
    ]
    return [text for failed, text in checks if failed]


def _actor(cfg: RecipeConfig) -> dict[str, Any]:
    b, k, r, o = cfg.behaviour, cfg.kl, cfg.reduction, cfg.optim
    low, high = b.clip_low, b.clip_high
    if b.objective == "gmpo":
        low, high = b.gmpo_clip_low, b.gmpo_clip_high
    actor: dict[str, Any] = {
        "clip_ratio_low": low,
        "clip_ratio_high": high,
        "clip_ratio_c": b.dual_clip or 3.0,
        "loss_agg_mode": AGG.get(r.name, "token-mean"),
        "policy_loss": {"loss_mode": LOSS_MODE.get(b.objective, "vanilla")},
        "tau_pos": b.sapo_tau_pos,
        "tau_neg": b.sapo_tau_neg,
        "use_kl_loss": k.placement == "loss",
        "kl_loss_coef": k.beta,
        "kl_loss_type": KL_NAMES.get(k.estimator, "low_var_kl"),
        "ppo_mini_batch_size": cfg.sampling.prompts_per_step // o.minibatches_per_epoch,
        "ppo_epochs": o.epochs_per_batch,
        "optim": {
            "lr": o.lr,
            "weight_decay": o.weight_decay,
            "clip_grad": o.max_grad_norm,
            "betas": list(o.adam_betas),
            "lr_scheduler_type": o.schedule,
            "lr_warmup_steps": o.warmup_steps,
        },
    }
    if b.objective == "dro":
        actor["policy_loss"]["dro_beta"] = b.dro_beta
    if r.max_len is not None:
        actor["loss_scale_factor"] = r.max_len
    return actor


def _correction(cfg: RecipeConfig) -> dict[str, Any]:
    """``algorithm.rollout_correction`` for the behaviour axis's mode and corrections."""
    b = cfg.behaviour
    out: dict[str, Any] = {
        "bypass_mode": b.mode == "bypass",
        "rollout_is": None,
        "rollout_rs": None,
    }
    if "tis" in b.corrections:
        out |= {"rollout_is": b.tis_level, "rollout_is_threshold": b.tis_cap}
    if "icepop" in b.corrections:
        out |= {"rollout_is": "token", "rollout_is_threshold": f"{b.icepop_low}_{b.icepop_high}"}
    if "masked_is" in b.corrections:
        out |= {
            "rollout_rs": "seq_mean_k1",
            "rollout_rs_threshold": f"{1 / b.masked_is_high:g}_{1 / b.masked_is_low:g}",
        }
    return out


def inverse(cfg: RecipeConfig) -> tuple[str, list[str]]:
    """verl YAML that reproduces ``cfg``, and what it cannot (:func:`differences`)."""
    k, s, c, g = cfg.kl, cfg.sampling, cfg.credit, cfg.generation
    adv = {v: key for key, v in reversed(ESTIMATORS.items())}.get(c.estimator, "grpo")
    overlong = cfg.feedback.overlong_cache
    kl_ctrl: dict[str, Any] = {"kl_coef": k.beta, "type": "fixed"}
    if k.placement == "reward" and k.target is not None:
        kl_ctrl |= {"type": "adaptive", "target_kl": k.target, "horizon": k.horizon}
    data: dict[str, Any] = {
        "data": {"train_batch_size": s.prompts_per_step, "max_response_length": g.max_new_tokens},
        "actor_rollout_ref": {
            "model": {"path": cfg.model.path},
            "actor": _actor(cfg),
            "rollout": {"n": s.group_size, "temperature": g.temperature, "top_p": g.top_p},
        },
        "algorithm": {
            "adv_estimator": adv,
            "norm_adv_by_std_in_grpo": c.estimator != "dr_grpo",
            "gamma": c.gamma,
            "lam": c.lam,
            "use_kl_in_reward": k.placement == "reward",
            "kl_penalty": "kl",
            "kl_ctrl": kl_ctrl,
            "filter_groups": {
                "enable": s.filter == "mixed",
                "metric": "acc",
                "max_num_gen_batches": s.max_rounds,
            },
            "rollout_correction": _correction(cfg),
        },
        "reward": {
            "reward_kwargs": {
                "overlong_buffer_cfg": {
                    "enable": overlong is not None,
                    "len": overlong or 0,
                    "penalty_factor": 1.0,
                }
            },
            "reward_model": {"enable": cfg.feedback.source == "reward_model"},
        },
        "trainer": {"total_training_steps": cfg.optim.steps},
    }
    if cfg.critic.enabled:
        data["critic"] = {
            "optim": {"lr": cfg.optim.critic_lr},
            "cliprange_value": cfg.critic.value_clip,
        }
    return yaml.safe_dump(data, sort_keys=False), differences(cfg)
