"""SkyRL's YAML (``trainer.*``, ``generator.*``) → rlmap (the inverse, for ``explain --as
skyrl``: :mod:`.skyrl_inverse`).

Defaults re-read at NovaSky-AI/SkyRL @ a9564572eb8e91076be43c1bd5e4615e3de17265
(``skyrl/train/config/config.py``, cited ``S:line``; the same commit as ``TRANSLATE.md``
§5); the mathematics from ``skyrl/backends/skyrl_train/utils/ppo_utils.py`` (losses,
advantages, ``apply_loss_reduction_to_advantages_minibatch``),
``.../utils/off_policy_correction_utils.py`` (TIS and the masks), ``skyrl/train/trainer.py``
(``apply_reward_kl_penalty``) and ``.../workers/worker.py`` (the KL loss: a per-sequence
mean). AL: ``trainer.algorithm.``, OPC: ``trainer.algorithm.off_policy_correction.``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError
from rlmap.recipes.translate import flatten
from rlmap.recipes.translate.rows import (
    IMPLIED,
    NO_ENTROPY,
    NO_TOP_K,
    NULL,
    Lookup,
    Mapped,
    Mapping,
    betas,
    field,
    implied,
    kl_controller,
    lora,
    minibatches,
    mixed_filter,
    off,
    one_of,
    read_with,
    tis,
    transformers_schedule,
    transformers_warmup,
)
from rlmap.runs.rundir import read_yaml

S = "SkyRL@a9564572 skyrl/train/config/config.py"
AL = "trainer.algorithm."
OPC = AL + "off_policy_correction."
GEN = "generator.sampling_params."
OPT = "trainer.policy.optimizer_config."
ESTIMATORS = {"grpo": "grpo", "rloo": "rloo", "reinforce++": "reinforce_pp", "gae": "gae"}
LOSSES = (
    "regular",
    "dual_clip",
    "gspo",
    "cispo",
    "sapo",
    "rollout_is",
    "dppo",
    "clip_cov",
    "kl_cov",
    "cross_entropy",
    "importance_sampling",
)
REDUCTIONS = {
    "token_mean": "token_mean",
    "sequence_mean": "response_mean",
    "seq_mean_token_sum_norm": "fixed_budget",
    "prompt_mean": "prompt_mean",
}
KL_ESTIMATORS = ("k1", "k2", "k3")


def _estimator(value: Any, get: Lookup) -> Mapped:
    one_of(AL + "advantage_estimator", value, [*ESTIMATORS, "maxrl"], "SkyRL")
    if value == "maxrl":
        return Mapped({}, "none", "rlmap has no maxrl; the closest preset's estimator is kept")
    name = ESTIMATORS[value]
    if name == "grpo" and not get(AL + "grpo_norm_by_std"):
        name = "dr_grpo"
    if name == "gae":
        return Mapped(
            {"credit.estimator": "gae", "critic.enabled": True},
            "approximate",
            "SkyRL whitens GAE advantages (ppo_utils.py "
            "compute_gae_advantage_return: masked_whiten); rlmap does not",
        )
    kind = "approximate" if name == "reinforce_pp" else "exact"
    return Mapped(
        {"credit.estimator": name, "critic.enabled": False},
        kind,
        "whitening constants differ" if kind == "approximate" else "",
    )


def _loss(value: Any, get: Lookup) -> Mapped:
    one_of(AL + "policy_loss_type", value, LOSSES, "SkyRL")
    if value in ("regular", "dual_clip"):
        dual = get(AL + "clip_ratio_c") if value == "dual_clip" else None
        return Mapped({"behaviour.objective": "ppo_clip", "behaviour.dual_clip": dual})
    if value == "gspo":
        return Mapped(
            {"behaviour.objective": "gspo", "behaviour.gspo_token": True}, note="GSPO-token"
        )
    if value == "sapo":
        return Mapped(
            {
                "behaviour.objective": "sapo",
                "behaviour.sapo_tau_pos": get(AL + "sapo.tau_pos"),
                "behaviour.sapo_tau_neg": get(AL + "sapo.tau_neg"),
            }
        )
    if value == "cispo":
        return _cispo(get)
    if value == "dppo":
        return _dppo(get)
    return Mapped({}, "none", f"rlmap has no {value} loss; the closest preset's objective is kept")


def _cispo(get: Lookup) -> Mapped:
    fields = {
        "behaviour.objective": "cispo",
        "behaviour.clip_low": get(AL + "cispo.cispo_eps_clip_low"),
        "behaviour.clip_high": get(AL + "cispo.cispo_eps_clip_high"),
    }
    if get(AL + "cispo.cispo_anchor") == "rollout":
        return Mapped(
            {**fields, "behaviour.mode": "bypass"},
            "approximate",
            "cispo_anchor=rollout: the ratio against μ (bypass)",
        )
    return Mapped(fields, note="SkyRL's default bounds are 1−1.0 and 1+4.0 (ScaleRL)")


def _dppo(get: Lookup) -> Mapped:
    kind = get(AL + "dppo.dppo_type")
    one_of(AL + "dppo.dppo_type", kind, ("binary_tv", "binary_kl"), "SkyRL")
    name = "dppo_tv" if kind == "binary_tv" else "dppo_kl"
    return Mapped(
        {
            "behaviour.objective": name,
            "behaviour.mode": "bypass",
            f"behaviour.{name}_low": get(AL + "dppo.delta_low"),
            f"behaviour.{name}_high": get(AL + "dppo.delta_high"),
            "behaviour.dppo_tau": 0.0,
        },
        note="ratio and mask against the rollout μ (bypass), no τ term",
    )


def _clip(name: str) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        if get(AL + "policy_loss_type") in ("cispo", "dppo"):
            return Mapped({}, note="read with policy_loss_type (its own bounds)")
        return Mapped({name: value})

    return convert


def _reduction(value: Any, get: Lookup) -> Mapped:
    if value not in REDUCTIONS:
        kind = "approximate" if value == "token_mean_legacy" else "none"
        fields = {"reduction.name": "token_mean"} if kind == "approximate" else {}
        return Mapped(fields, kind, f"{value}: no rlmap reduction with its denominator")
    name = REDUCTIONS[value]
    max_len = get(AL + "max_seq_len") if name == "fixed_budget" else None
    if name == "fixed_budget" and max_len is None:
        raise ConfigError(f"{AL}max_seq_len: loss_reduction=seq_mean_token_sum_norm needs it")
    note = "SkyRL cuts mini-batches at prompt boundaries" if name == "prompt_mean" else ""
    return Mapped({"reduction.name": name, "reduction.max_len": max_len}, note=note)


def _kl_loss(value: Any, get: Lookup) -> Mapped:
    in_reward = get(AL + "use_kl_in_reward")
    if value and in_reward:
        return Mapped({}, "none", "KL in the loss and in the reward at once")
    if not value:
        return Mapped({} if in_reward else {"kl.placement": "none", "kl.beta": 0.0})
    est = get(AL + "kl_estimator_type")
    if est not in KL_ESTIMATORS:
        return Mapped({}, "none", f"kl_estimator_type={est}: rlmap has k1, k2, k3")
    fields = {
        "kl.placement": "loss",
        "kl.beta": get(AL + "kl_loss_coef"),
        "kl.estimator": est,
        "kl.target": None,
    }
    if get(AL + "loss_reduction") == "sequence_mean":
        return Mapped(fields, note="trap: on by default")
    return Mapped(
        fields,
        "approximate",
        "trap: on by default; SkyRL reduces the KL per sequence "
        "(worker.py: masked_mean over tokens, mean over sequences), rlmap with the "
        "policy's reduction",
    )


def _kl_reward(value: Any, get: Lookup) -> Mapped:
    if not value or get(AL + "use_kl_loss"):
        return Mapped({})
    est = get(AL + "kl_estimator_type")
    if est != "k1":
        return Mapped({}, "none", f"a {est} KL in the reward: rlmap's in-reward KL is k1")
    fields = {
        "kl.placement": "reward",
        "kl.estimator": "k1",
        "kl.beta": get(AL + "kl_loss_coef"),
        **kl_controller(get, AL + "kl_ctrl.", "kl_target"),
    }
    return Mapped(
        fields,
        note="−β·k1 per token (trainer.py apply_reward_kl_penalty; β is "
        "kl_loss_coef); GRPO sums the token rewards, as rlmap's R",
    )


def _dynamic(value: Any, get: Lookup) -> Mapped:
    if value is None:
        return Mapped({"sampling.filter": "none"})
    if value == "filter":
        rounds = get(AL + "dynamic_sampling.max_sample_batches")
        return Mapped(
            mixed_filter(rounds),
            "approximate",
            "rlmap drops single-trajectory groups too; "
            "max_sample_batches -1 (for ever) keeps rlmap's finite cap",
        )
    return Mapped({}, "none", f"{value} (POLARIS replacement): no rlmap equivalent")


def _zero_variance(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({}, note="off")
    return Mapped(
        {"sampling.filter": "mixed", "sampling.max_rounds": 1},
        "approximate",
        "SkyRL loss-masks zero-variance groups in place; rlmap drops them after one "
        "round (their advantage is 0 either way; the token counts differ)",
    )


def _async(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"system.mode": "sync"})
    staleness = get("trainer.fully_async.max_staleness_steps")
    return Mapped(
        {
            "system.mode": "async",
            "behaviour.max_staleness": staleness,
            "behaviour.corrections": [*_opc_corrections(get), "staleness"],
        }
    )


def _scheduler(value: Any, get: Lookup) -> Mapped:
    """transformers' get_scheduler (fsdp_strategy.py); warm-up in optimiser steps."""
    return transformers_schedule(value, OPT + "num_warmup_steps", get)


def _warmup(value: Any, get: Lookup) -> Mapped:
    return transformers_warmup(value)


def _opc_corrections(get: Lookup) -> list[str]:
    """The corrections the off-policy-correction keys turn on (:func:`_tis`, :func:`_mask`)."""
    out = ["tis"] if get(OPC + "tis_ratio_type") in ("token", "sequence") else []
    return out + (["masked_is"] if get(OPC + "sequence_mask_metric") == "geometric" else [])


def _tis(value: Any, get: Lookup) -> Mapped:
    if value is None:
        return Mapped({"behaviour.corrections": []}, note="off")
    one_of(OPC + "tis_ratio_type", value, ("token", "sequence"), "SkyRL")
    cap = get(OPC + f"{value}_tis_ratio_clip_high")
    return Mapped(
        {**tis(value, cap), "behaviour.corrections": _opc_corrections(get)},
        note="w = min(κ, C), κ = π_old/μ",
    )


def _mask(value: Any, get: Lookup) -> Mapped:
    if value is None:
        return Mapped({}, note="off")
    if value != "geometric":
        return Mapped(
            {},
            "none",
            f"{value}: a mask on the product of κ; rlmap's masked_is reads the geometric mean",
        )
    return Mapped(
        {
            "behaviour.corrections": _opc_corrections(get),
            "behaviour.masked_is_low": get(OPC + "geo_mask_low"),
            "behaviour.masked_is_high": get(OPC + "geo_mask_high"),
        },
        note="drops a sequence whose geometric-mean κ leaves [low, high]; the "
        "denominators were fixed before (scaled advantages), as rlmap's",
    )


IMPLIED_FIELDS = {
    "feedback.source": "verifier",
    "behaviour.corrections": [],
    "behaviour.positive_nll": 0.0,
    "behaviour.mode": "decoupled",
    "feedback.overlong_cache": None,
}


TABLE: tuple[Mapping, ...] = (
    Mapping(
        IMPLIED + "SkyRL trainer",
        implied(IMPLIED_FIELDS, "π_old recomputed, no overlong shaping"),
        "none",
        f"{S}:794",
    ),
    Mapping(AL + "grpo_norm_by_std", read_with(AL + "advantage_estimator"), True, f"{S}:892"),
    Mapping(AL + "advantage_estimator", _estimator, "grpo", f"{S}:823"),
    Mapping(AL + "gamma", field("credit.gamma"), 1.0, f"{S}:904"),
    Mapping(AL + "lambd", field("credit.lam", "trap: rlmap's default is 0.95"), 1.0, f"{S}:902"),
    Mapping(
        AL + "value_clip",
        field("critic.value_clip", "trap: rlmap's default is 0.5"),
        0.2,
        f"{S}:921",
    ),
    Mapping(AL + "clip_ratio_c", read_with(AL + "policy_loss_type"), 3.0, f"{S}:910"),
    Mapping(AL + "cispo.cispo_eps_clip_low", read_with(AL + "policy_loss_type"), 1.0, f"{S}:751"),
    Mapping(AL + "cispo.cispo_eps_clip_high", read_with(AL + "policy_loss_type"), 4.0, f"{S}:756"),
    Mapping(AL + "cispo.cispo_anchor", read_with(AL + "policy_loss_type"), "old", f"{S}:761"),
    Mapping(AL + "sapo.tau_pos", read_with(AL + "policy_loss_type"), 1.0, f"{S}:705"),
    Mapping(AL + "sapo.tau_neg", read_with(AL + "policy_loss_type"), 1.05, f"{S}:707"),
    Mapping(AL + "dppo.dppo_type", read_with(AL + "policy_loss_type"), "binary_tv", f"{S}:779"),
    Mapping(AL + "dppo.delta_low", read_with(AL + "policy_loss_type"), 0.2, f"{S}:781"),
    Mapping(AL + "dppo.delta_high", read_with(AL + "policy_loss_type"), 0.2, f"{S}:783"),
    Mapping(AL + "eps_clip_low", _clip("behaviour.clip_low"), 0.2, f"{S}:906"),
    Mapping(AL + "eps_clip_high", _clip("behaviour.clip_high"), 0.2, f"{S}:908"),
    Mapping(AL + "policy_loss_type", _loss, "regular", f"{S}:853"),
    Mapping(AL + "max_seq_len", read_with(AL + "loss_reduction"), None, f"{S}:933"),
    Mapping(AL + "loss_reduction", _reduction, "token_mean", f"{S}:876"),
    Mapping(AL + "kl_loss_coef", read_with(AL + "use_kl_loss"), 0.001, f"{S}:836"),
    Mapping(AL + "kl_estimator_type", read_with(AL + "use_kl_loss"), "k3", f"{S}:828"),
    Mapping(AL + "kl_ctrl.type", read_with(AL + "use_kl_in_reward"), "fixed", f"{S}:693"),
    Mapping(AL + "kl_ctrl.kl_target", read_with(AL + "use_kl_in_reward"), 0.1, f"{S}:695"),
    Mapping(AL + "kl_ctrl.horizon", read_with(AL + "use_kl_in_reward"), 10000, f"{S}:697"),
    Mapping(AL + "use_kl_loss", _kl_loss, True, f"{S}:833"),
    Mapping(AL + "use_kl_in_reward", _kl_reward, False, f"{S}:830"),
    Mapping(AL + "use_entropy_loss", off(NO_ENTROPY, (False,)), False, f"{S}:838"),
    Mapping(
        AL + "temperature",
        off(
            "a loss temperature other than the sampling one: rlmap scores at the sampling "
            "temperature",
            (None,),
        ),
        NULL,
        f"{S}:843",
    ),
    Mapping(
        AL + "advantage_batch_normalize",
        off("rlmap has no batch normalisation of advantages", (False,)),
        False,
        f"{S}:849",
    ),
    Mapping(
        AL + "dynamic_sampling.max_sample_batches",
        read_with(AL + "dynamic_sampling.type"),
        30,
        f"{S}:720",
    ),
    Mapping(AL + "dynamic_sampling.type", _dynamic, NULL, f"{S}:716"),
    Mapping(AL + "zero_variance_filter", _zero_variance, False, f"{S}:895"),
    Mapping(OPC + "token_tis_ratio_clip_high", read_with(OPC + "tis_ratio_type"), 2.0, f"{S}:797"),
    Mapping(
        OPC + "sequence_tis_ratio_clip_high", read_with(OPC + "tis_ratio_type"), 5.0, f"{S}:799"
    ),
    Mapping(OPC + "tis_ratio_type", _tis, NULL, f"{S}:794"),
    Mapping(OPC + "geo_mask_low", read_with(OPC + "sequence_mask_metric"), 0.99, f"{S}:805"),
    Mapping(OPC + "geo_mask_high", read_with(OPC + "sequence_mask_metric"), 1.01, f"{S}:803"),
    Mapping(OPC + "sequence_mask_metric", _mask, NULL, f"{S}:801"),
    Mapping(
        OPC + "outlier_token_is_threshold_low",
        off("drops a sequence with any κ below it: no rlmap mask", (None,)),
        NULL,
        f"{S}:811",
    ),
    Mapping(
        OPC + "outlier_token_is_threshold_high",
        off("drops a sequence with any κ above it: no rlmap mask", (None,)),
        NULL,
        f"{S}:813",
    ),
    Mapping(
        OPC + "token_mask_is_threshold_low",
        off("masks a token outside the band without reweighting it: no rlmap mask", (None,)),
        NULL,
        f"{S}:815",
    ),
    Mapping(
        OPC + "token_mask_is_threshold_high",
        read_with(OPC + "token_mask_is_threshold_low"),
        NULL,
        f"{S}:817",
    ),
    Mapping("generator.n_samples_per_prompt", field("sampling.group_size"), 5, f"{S}:1225"),
    Mapping(
        "generator.apply_overlong_filtering",
        off("masks truncated responses out of the loss: no rlmap equivalent", (False,)),
        False,
        f"{S}:1264",
    ),
    Mapping(
        "generator.zero_reward_on_non_stop",
        off("zeroes the reward of a response that did not stop: no rlmap equivalent", (False,)),
        False,
        f"{S}:1255",
    ),
    Mapping("trainer.train_batch_size", field("sampling.prompts_per_step"), 1024, f"{S}:1390"),
    Mapping(
        "trainer.policy_mini_batch_size", minibatches("trainer.train_batch_size"), 256, f"{S}:1396"
    ),
    Mapping("trainer.update_epochs_per_batch", field("optim.epochs_per_batch"), 1, f"{S}:1387"),
    Mapping(
        "trainer.micro_train_batch_size_per_gpu", field("optim.micro_batch_size"), 1, f"{S}:1406"
    ),
    Mapping(GEN + "max_generate_length", field("generation.max_new_tokens"), 1024, f"{S}:999"),
    Mapping(GEN + "temperature", field("generation.temperature"), 1.0, f"{S}:1004"),
    Mapping(GEN + "top_p", field("generation.top_p"), 1.0, f"{S}:1007"),
    Mapping(GEN + "top_k", off(NO_TOP_K, (-1, 0)), -1, f"{S}:1011"),
    Mapping(GEN + "min_p", off("rlmap has no min_p", (0, 0.0)), 0.0, f"{S}:1009"),
    Mapping(
        "trainer.fully_async.max_staleness_steps",
        read_with("trainer.fully_async.enabled"),
        4,
        f"{S}:951",
    ),
    Mapping("trainer.fully_async.enabled", _async, False, f"{S}:949"),
    Mapping(OPT + "lr", field("optim.lr"), 1e-6, f"{S}:190"),
    Mapping(OPT + "weight_decay", field("optim.weight_decay"), 1e-2, f"{S}:194"),
    Mapping(OPT + "adam_betas", betas, [0.9, 0.999], f"{S}:192"),
    Mapping(OPT + "max_grad_norm", field("optim.max_grad_norm"), 1.0, f"{S}:196"),
    Mapping(OPT + "num_warmup_steps", _warmup, 0, f"{S}:204"),
    Mapping(OPT + "scheduler", _scheduler, "constant_with_warmup", f"{S}:206"),
    Mapping("trainer.critic.optimizer_config.lr", field("optim.critic_lr"), None, f"{S}:650"),
    Mapping(
        "trainer.policy.model.lora.alpha",
        read_with("trainer.policy.model.lora.rank"),
        16,
        f"{S}:103",
    ),
    Mapping(
        "trainer.policy.model.lora.rank", lora("trainer.policy.model.lora.alpha"), 0, f"{S}:100"
    ),
    Mapping(
        "trainer.policy.model.path",
        field("model.path", "the source's model"),
        "Qwen/Qwen2.5-1.5B-Instruct",
        f"{S}:608",
    ),
)
"""The rows, in the order they apply (a later row's fields win: fully_async after the
correction rows, because it adds the staleness correction to theirs)."""


def table(world_size: int = 1, flat: dict[str, Any] | None = None) -> tuple[Mapping, ...]:
    """The table (its rows depend neither on the number of processes nor on the file)."""
    return TABLE


def read(path: Path) -> dict[str, Any]:
    return flatten(read_yaml(path))
