"""TRL's GRPOConfig and RLOOConfig (flat dataclass fields as YAML or JSON) → rlmap, and
the inverse (GRPOConfig).

Defaults are those of trl 1.16.0 (``trl/trainer/grpo_config.py``, written ``T:line``, the
line of the field's ``default=``; ``rloo_config.py`` in :mod:`.trl_rloo`) and of
transformers 5.19's ``TrainingArguments`` (``transformers/training_args.py``, ``HF:line``),
both read from the installed packages; the trainers' code from ``grpo_trainer.py`` and
``rloo_trainer.py`` there. ``TRANSLATE.md`` §2 has the reasoning. Batch sizes count
completions per device, so the number of processes (``world_size``) is needed to know the
prompts per step.

Which trainer: a file with ``trainer: rloo`` (not a TRL field: rlmap's way to say it) or an
RLOOConfig-only field (``normalize_advantages``, ``reward_clip_range``) is an RLOOConfig;
anything else a GRPOConfig (``trainer: grpo`` says so explicitly).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from rlmap.core.errors import ConfigError, InputError
from rlmap.recipes.config import RecipeConfig, read_yaml
from rlmap.recipes.translate import (
    IMPLIED,
    NULL,
    Lookup,
    Mapped,
    Mapping,
    field,
    flatten,
    implied,
    off,
    read_with,
)

T = "trl 1.16.0 trl/trainer/grpo_config.py"
HF = "transformers 5.19 transformers/training_args.py"
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")
RLOO_ONLY = ("normalize_advantages", "reward_clip_range")
GRPO_ONLY = (
    "loss_type",
    "scale_rewards",
    "delta",
    "importance_sampling_level",
    "vllm_importance_sampling_mode",
    "use_bias_correction_kl",
    "off_policy_mask_threshold",
)


def trainer_of(flat: dict[str, Any]) -> str:
    """'grpo' or 'rloo': the file's ``trainer`` key, else RLOOConfig-only fields; a file
    that names both trainers' own fields is one line naming them."""
    named = flat.get("trainer")
    if named not in (None, "grpo", "rloo"):
        raise ConfigError(f"trainer: {named!r} is not a TRL trainer rlmap reads (grpo, rloo)")
    rloo_keys = [k for k in RLOO_ONLY if k in flat]
    grpo_keys = [k for k in GRPO_ONLY if k in flat]
    if named is None and rloo_keys and grpo_keys:
        raise ConfigError(
            f"{grpo_keys[0]}: a GRPOConfig field in a file with RLOOConfig's "
            f"{rloo_keys[0]}; say which with trainer: grpo|rloo"
        )
    kind = named or ("rloo" if rloo_keys else "grpo")
    clash = grpo_keys if kind == "rloo" else rloo_keys
    if clash:
        raise ConfigError(f"{clash[0]}: not a field of TRL's {kind.upper()}Config")
    return kind


def _loss_type(value: Any, get: Lookup) -> Mapped:
    if value not in LOSS_TYPES:
        raise ConfigError(
            f"loss_type: {value!r} is not a TRL value (one of {', '.join(LOSS_TYPES)})"
        )
    none = {"reduction.max_len": None}
    if value == "dapo":
        return Mapped(
            {"reduction.name": "token_mean", **none},
            note="trap: TRL's default loss_type is dapo (global token mean)",
        )
    if value in ("grpo", "sapo"):
        objective = {"behaviour.objective": "sapo"} if value == "sapo" else {}
        return Mapped({"reduction.name": "response_mean", **none, **objective})
    if value == "bnpo":
        return Mapped(
            {"reduction.name": "token_mean", **none},
            "approximate",
            "the denominator is the local micro-batch's token count",
        )
    if value == "dr_grpo":
        budget = get("max_completion_length")
        return Mapped(
            {"reduction.name": "fixed_budget", "reduction.max_len": budget},
            note="reduction only: the advantage still divides by the std unless scale_rewards=none",
        )
    if value == "cispo":
        return _cispo(get)
    return Mapped({}, "none", f"rlmap has no {value} loss; the closest preset's is kept")


def _cispo(get: Lookup) -> Mapped:
    cap = get("epsilon_high") or get("epsilon")
    if cap < 1:
        raise ConfigError(
            f"epsilon_high: {cap} caps the CISPO ratio below 1 (TRL caps at "
            "epsilon_high itself); rlmap cannot express it"
        )
    return Mapped(
        {
            "behaviour.objective": "cispo",
            "behaviour.clip_low": 1.0,
            "behaviour.clip_high": cap - 1,
            "reduction.name": "token_mean",
            "reduction.max_len": None,
        },
        note="TRL's cap is epsilon_high, not 1+ε",
    )


def _epsilon_high(value: Any, get: Lookup) -> Mapped:
    if get("loss_type") == "cispo":
        return Mapped({}, note="read with loss_type=cispo")
    return Mapped(
        {"behaviour.clip_high": get("epsilon") if value is None else value}, note="None: epsilon"
    )


def _epsilon(value: Any, get: Lookup) -> Mapped:
    if get("loss_type") == "cispo":
        return Mapped({}, note="read with loss_type=cispo")
    return Mapped({"behaviour.clip_low": value})


def _delta(value: Any, get: Lookup) -> Mapped:
    high = 1 + (get("epsilon_high") or get("epsilon"))
    if value is None:
        return Mapped({"behaviour.dual_clip": None}, note="no dual clip")
    if value <= high:
        return Mapped(
            {}, "none", f"delta={value} ≤ 1+epsilon_high caps every ratio, not a dual clip"
        )
    return Mapped({"behaviour.dual_clip": value}, note="clamp(ratio, max=delta) is a dual clip")


def _beta(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped(
            {"kl.placement": "none", "kl.beta": 0.0},
            note="trap: TRL's default is no KL and no reference model",
        )
    fields = {"kl.placement": "loss", "kl.beta": value, "kl.target": None}
    if not get("use_bias_correction_kl"):
        return Mapped({**fields, "kl.estimator": "k3"}, note="TRL's k3 has no ±10 clamp")
    if get("importance_sampling_level") == "sequence":
        return Mapped(
            {},
            "none",
            "use_bias_correction_kl with importance_sampling_level="
            "sequence weights k3 by the sequence ratio: no rlmap estimator",
        )
    return Mapped(
        {**fields, "kl.estimator": "k3_iw"},
        note="use_bias_correction_kl: k3 × π_θ/π_old, not detached",
    )


def _scale(value: Any, get: Lookup) -> Mapped:
    value = {True: "group", False: "none"}.get(value, value)
    if value == "group":
        return Mapped(
            {"credit.estimator": "grpo", "credit.std_eps": 1e-4},
            note="ε=1e-4 (grpo_trainer.py: std_rewards + 1e-4)",
        )
    if value == "none":
        return Mapped({"credit.estimator": "dr_grpo"})
    if value == "batch":
        return Mapped({}, "none", "group mean, batch std: rlmap has no batch-std scaling")
    raise ConfigError(f"scale_rewards: {value!r} is not a TRL value (one of group, batch, none)")


def _level(value: Any, get: Lookup) -> Mapped:
    if value == "token":
        return Mapped({"behaviour.objective": "ppo_clip"})
    if value == "sequence":
        return Mapped(
            {"behaviour.objective": "gspo", "behaviour.gspo_token": False},
            note="the geometric-mean ratio; reduction from loss_type",
        )
    raise ConfigError(f"importance_sampling_level: {value!r} is not a TRL value (token, sequence)")


def steps_per_generation(get: Lookup, world_size: int) -> int:
    """TRL's optimiser-batch count per generation (GRPOConfig.__post_init__): the field, else
    generation_batch_size / (per-device batch × processes), else gradient_accumulation_steps."""
    given, batch = get("steps_per_generation"), get("generation_batch_size")
    if given:
        return int(given)
    if batch:
        return int(batch) // (get("per_device_train_batch_size") * world_size)
    return int(get("gradient_accumulation_steps"))


def updates_per_batch(get: Lookup, world_size: int) -> int:
    """rlmap optimiser steps per rollout batch: mini-batches × num_iterations."""
    minibatches = max(
        1, steps_per_generation(get, world_size) // get("gradient_accumulation_steps")
    )
    return minibatches * int(get("num_iterations"))


def prompts(world_size: int) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        steps = steps_per_generation(get, world_size)
        batch = value or get("per_device_train_batch_size") * world_size * steps
        group = get("num_generations")
        if batch % group:
            raise ConfigError(
                f"generation_batch_size: {batch} is not a multiple of num_generations {group}"
            )
        minibatches = steps // get("gradient_accumulation_steps")
        return Mapped(
            {
                "sampling.prompts_per_step": batch // group,
                "optim.minibatches_per_epoch": max(1, minibatches),
            },
            note=f"{batch} completions / G={group}, {world_size} procs",
        )

    return convert


def max_steps(world_size: int) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        if value is None or value < 0:
            return Mapped({}, note="unset: TRL runs num_train_epochs over the dataset")
        per_batch = updates_per_batch(get, world_size)
        steps = math.ceil(value / per_batch)
        kind = "exact" if steps * per_batch == value else "approximate"
        return Mapped(
            {"optim.steps": steps},
            kind,
            f"TRL counts optimiser steps: {value} / {per_batch} a batch",
        )

    return convert


def scheduler(value: Any, get: Lookup) -> Mapped:
    """lr_scheduler_type: linear (the default), cosine, constant(_with_warmup)."""
    known = {
        "linear": "linear",
        "cosine": "cosine",
        "constant": "constant",
        "constant_with_warmup": "constant",
    }
    if value not in known:
        return Mapped({}, "none", f"{value}: rlmap offers constant, cosine or linear")
    fields = {"optim.schedule": known[value]}
    if value == "constant" and get("warmup_steps"):
        return Mapped(
            {**fields, "optim.warmup_steps": 0},
            "approximate",
            "transformers' constant schedule ignores warmup_steps",
        )
    decays = value in ("linear", "cosine")
    if decays and (get("max_steps") or -1) < 0:
        return Mapped(
            fields,
            "approximate",
            "with max_steps unset TRL decays over "
            "num_train_epochs × the data's batches, rlmap over optim.steps",
        )
    return Mapped(fields, note="trap: TRL's default is linear decay to 0" if decays else "")


def warmup(value: Any, get: Lookup) -> Mapped:
    """warmup_steps: optimiser steps (≥ 1) or a ratio of the total (< 1)."""
    if not value:
        return Mapped({"optim.warmup_steps": 0})
    if value >= 1:
        steps = int(value)
    elif (get("max_steps") or -1) > 0:
        steps = math.ceil(get("max_steps") * value)
    else:
        return Mapped({}, "none", "a warm-up ratio of a run whose length is set by the dataset")
    return Mapped(
        {"optim.warmup_steps": steps},
        "approximate",
        "transformers warms up as s/W (0 at the first step), rlmap as (s+1)/W",
    )


def adam_betas(value: Any, get: Lookup) -> Mapped:
    return Mapped({"optim.adam_betas": [float(get("adam_beta1")), float(value)]})


def _vllm_fields(get: Lookup) -> tuple[dict[str, Any], str, str]:
    """The correction rlmap applies for GRPOTrainer's vLLM importance sampling
    (grpo_trainer.py, "Compute the importance sampling ratio when using vLLM")."""
    if not get("use_vllm") or not get("vllm_importance_sampling_correction"):
        return {"behaviour.corrections": []}, "exact", "no importance-sampling correction"
    mode = get("vllm_importance_sampling_mode")
    low, high = get("vllm_importance_sampling_clip_min"), get("vllm_importance_sampling_clip_max")
    high = get("vllm_importance_sampling_cap") or high  # the deprecated name wins, as in TRL
    if mode == "token_mask" and high is not None:
        return (
            {
                "behaviour.corrections": ["icepop"],
                "behaviour.icepop_low": low or 0.0,
                "behaviour.icepop_high": high,
            },
            "exact",
            "w = κ·1[C_min ≤ κ ≤ C_max]",
        )
    if high is None:
        return {}, "none", f"{mode} without an upper bound: no rlmap correction"
    level = "token" if mode.startswith("token") else "sequence"
    fields = {
        "behaviour.corrections": ["tis"],
        "behaviour.tis_level": level,
        "behaviour.tis_cap": high,
    }
    if mode.endswith("_truncate"):
        if low is None:
            return fields, "exact", "w = min(κ, C_max)"
        return fields, "approximate", f"TRL also clamps κ from below at {low}"
    return (
        fields,
        "approximate",
        (
            f"{mode}: TRL zeroes the weight outside [C_min, C_max] "
            "(the product ratio); TIS truncates at C_max"
        ),
    )


def _vllm(value: Any, get: Lookup) -> Mapped:
    fields, kind, note = _vllm_fields(get)
    return Mapped(fields, kind, note)


def _opsm(value: Any, get: Lookup) -> Mapped:
    if value is None:
        return Mapped({}, note="off")
    fields, _, _ = _vllm_fields(get)
    corrections = [*fields.get("behaviour.corrections", []), "opsm"]
    return Mapped(
        {"behaviour.corrections": corrections, "behaviour.opsm_delta": value},
        note="keep Â ≥ 0 or mean log μ − log π_θ ≤ δ (get_off_policy_mask)",
    )


IMPLIED_FIELDS = {
    "feedback.source": "verifier",
    "behaviour.mode": "decoupled",
    "behaviour.corrections": [],
    "behaviour.positive_nll": 0.0,
    "system.mode": "sync",
    "sampling.filter": "none",
    "feedback.overlong_cache": None,
    "critic.enabled": False,
}


GRPO_LINES = {
    "generation_batch_size": 522,
    "steps_per_generation": 529,
    "num_iterations": 690,
    "mask_truncated_completions": 837,
    "temperature": 533,
    "top_p": 537,
    "top_k": 544,
    "min_p": 551,
    "max_completion_length": 495,
    "learning_rate": 424,
}
"""The line of each shared field's ``default=`` in grpo_config.py."""


def shared(world_size: int, src: str, lines: dict[str, int]) -> tuple[Mapping, ...]:
    """TrainingArguments rows and the sampling rows GRPOConfig and RLOOConfig share; ``src``
    and ``lines`` cite the config file and the line of each field's default there."""

    def at(key: str) -> str:
        return f"{src}:{lines[key]}"

    return (
        Mapping(
            "per_device_train_batch_size",
            field("optim.micro_batch_size", "completions"),
            8,
            f"{HF}:775",
        ),
        Mapping("gradient_accumulation_steps", read_with("generation_batch_size"), 1, f"{HF}:847"),
        Mapping(
            "steps_per_generation",
            read_with("generation_batch_size"),
            None,
            at("steps_per_generation"),
        ),
        Mapping(
            "generation_batch_size",
            prompts(world_size),
            NULL,
            f"{at('generation_batch_size')} (None: per_device × world × steps_per_generation)",
        ),
        Mapping("num_iterations", field("optim.epochs_per_batch"), 1, at("num_iterations")),
        Mapping(
            "mask_truncated_completions",
            off("rlmap cannot mask truncated completions", (False,)),
            False,
            at("mask_truncated_completions"),
        ),
        Mapping("temperature", field("generation.temperature"), 1.0, at("temperature")),
        Mapping("top_p", field("generation.top_p"), 1.0, at("top_p")),
        Mapping(
            "top_k", off("rlmap has no top_k (docs/translate.md)", (0, -1, None)), 0, at("top_k")
        ),
        Mapping("min_p", off("rlmap has no min_p", (None, 0, 0.0)), NULL, at("min_p")),
        Mapping(
            "max_completion_length",
            field("generation.max_new_tokens"),
            512,
            at("max_completion_length"),
        ),
        Mapping("learning_rate", field("optim.lr"), 1e-6, at("learning_rate")),
        Mapping("max_steps", max_steps(world_size), -1, f"{HF}:777"),
        Mapping("lr_scheduler_type", scheduler, "linear", f"{HF}:786"),
        Mapping("warmup_steps", warmup, 0, f"{HF}:796"),
        Mapping("weight_decay", field("optim.weight_decay"), 0.0, f"{HF}:820"),
        Mapping("adam_beta1", read_with("adam_beta2"), 0.9, f"{HF}:826"),
        Mapping("adam_beta2", adam_betas, 0.999, f"{HF}:832"),
        Mapping("max_grad_norm", field("optim.max_grad_norm"), 1.0, f"{HF}:864"),
        Mapping(
            "model_name_or_path", field("model.path", "the source's model"), None, "TRL ModelConfig"
        ),
    )


def grpo_table(world_size: int) -> tuple[Mapping, ...]:
    """GRPOConfig's rows, in the order they apply (a later row's fields win)."""
    return (
        Mapping(
            IMPLIED + "GRPOTrainer",
            implied(
                IMPLIED_FIELDS,
                "π_old recomputed, no group filter, no overlong shaping, no critic, synchronous",
            ),
            "grpo",
            "trl GRPOTrainer",
        ),
        Mapping("trainer", read_with("--from trl: GRPOConfig"), None, "rlmap (not a TRL field)"),
        Mapping("num_generations", field("sampling.group_size"), 8, f"{T}:481"),
        *shared(world_size, T, GRPO_LINES),
        Mapping("importance_sampling_level", _level, "token", f"{T}:761"),
        Mapping("loss_type", _loss_type, "dapo", f"{T}:802"),
        Mapping("epsilon", _epsilon, 0.2, f"{T}:694"),
        Mapping("epsilon_high", _epsilon_high, NULL, f"{T}:706"),
        Mapping("delta", _delta, NULL, f"{T}:698"),
        Mapping("use_bias_correction_kl", read_with("beta"), True, f"{T}:973"),
        Mapping("beta", _beta, 0.0, f"{T}:682"),
        Mapping("scale_rewards", _scale, "group", f"{T}:790"),
        Mapping("entropy_coef", off("rlmap has no entropy bonus", (0, 0.0)), 0.0, f"{T}:877"),
        Mapping(
            "top_entropy_quantile",
            off("rlmap keeps every token in the loss", (1, 1.0)),
            1.0,
            f"{T}:867",
        ),
        Mapping("vllm_importance_sampling_correction", read_with("use_vllm"), True, f"{T}:926"),
        Mapping(
            "vllm_importance_sampling_mode", read_with("use_vllm"), "sequence_mask", f"{T}:935"
        ),
        Mapping("vllm_importance_sampling_clip_min", read_with("use_vllm"), NULL, f"{T}:956"),
        Mapping("vllm_importance_sampling_clip_max", read_with("use_vllm"), 3.0, f"{T}:948"),
        Mapping(
            "vllm_importance_sampling_cap",
            read_with("use_vllm"),
            None,
            f"{T}:1040 (deprecated: clip_max)",
        ),
        Mapping("use_vllm", _vllm, False, f"{T}:588"),
        Mapping("off_policy_mask_threshold", _opsm, NULL, f"{T}:964"),
    )


def table(world_size: int = 1, flat: dict[str, Any] | None = None) -> tuple[Mapping, ...]:
    """GRPOConfig's rows, or RLOOConfig's when the file is one (:func:`trainer_of`)."""
    if flat is not None and trainer_of(flat) == "rloo":
        from rlmap.recipes.translate import trl_rloo

        return trl_rloo.table(world_size)
    return grpo_table(world_size)


def read(path: Path) -> dict[str, Any]:
    """Config fields as YAML or JSON (JSON is YAML; a ``.json`` is read as JSON so that its
    errors name the line)."""
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}: not valid JSON") from None
        except FileNotFoundError:
            raise InputError(f"{path}: no such file") from None
        return flatten(data)
    return flatten(read_yaml(path))


def _differences(cfg: RecipeConfig, cispo: bool) -> list[str]:
    """What GRPOConfig cannot reproduce of ``cfg``, one line each."""
    b, k, r, s, c = cfg.behaviour, cfg.kl, cfg.reduction, cfg.sampling, cfg.credit
    sequence_gspo = b.objective == "gspo" and not b.gspo_token
    checks = [
        (
            r.name not in ("token_mean", "response_mean", "fixed_budget"),
            f"reduction.name={r.name}: no TRL loss_type",
        ),
        (
            b.objective not in ("ppo_clip", "sapo") and not cispo and not sequence_gspo,
            f"behaviour.objective={b.objective}: not written for TRL",
        ),
        (
            b.objective == "sapo" and r.name != "response_mean",
            "sapo: TRL's sapo loss is a per-sequence mean",
        ),
        (
            c.estimator not in ("grpo", "dr_grpo"),
            f"credit.estimator={c.estimator}: GRPOConfig has group-normalised advantages only",
        ),
        (
            c.estimator == "grpo" and c.std_eps != 1e-4,
            f"credit.std_eps: TRL adds 1e-4 to the std, rlmap {c.std_eps:g}",
        ),
        (
            k.placement == "reward"
            or (k.placement == "loss" and k.estimator not in ("k3", "k3_iw"))
            or (k.estimator == "k3_iw" and sequence_gspo),
            f"kl: TRL has a k3 KL in the loss only, got {k.estimator} in {k.placement}",
        ),
        (k.target is not None, "kl.target: TRL's β is fixed"),
        (
            s.filter != "none" or b.mode != "decoupled" or cfg.feedback.overlong_cache is not None,
            "dynamic sampling, bypass and overlong shaping: not in GRPOConfig",
        ),
        (
            not set(b.corrections) <= {"tis", "icepop", "opsm"}
            or {"tis", "icepop"} <= set(b.corrections),
            f"behaviour.corrections={list(b.corrections)}: not in GRPOConfig",
        ),
        (
            r.name == "fixed_budget" and r.max_len != cfg.generation.max_new_tokens,
            "reduction.max_len: TRL's dr_grpo divides by max_completion_length",
        ),
        (cfg.optim.warmup_steps > 0, "optim.warmup_steps: transformers warms up as s/W"),
    ]
    return [text for failed, text in checks if failed]


def _vllm_settings(cfg: RecipeConfig) -> dict[str, Any]:
    b = cfg.behaviour
    out: dict[str, Any] = {"use_vllm": "tis" in b.corrections or "icepop" in b.corrections}
    if "tis" in b.corrections:
        out |= {
            "vllm_importance_sampling_mode": f"{b.tis_level}_truncate",
            "vllm_importance_sampling_clip_max": b.tis_cap,
        }
    if "icepop" in b.corrections:
        out |= {
            "vllm_importance_sampling_mode": "token_mask",
            "vllm_importance_sampling_clip_min": b.icepop_low,
            "vllm_importance_sampling_clip_max": b.icepop_high,
        }
    if "opsm" in b.corrections:
        out["off_policy_mask_threshold"] = b.opsm_delta
    return out


def inverse(cfg: RecipeConfig) -> tuple[str, list[str]]:
    """GRPOConfig fields that reproduce ``cfg`` (one process), and what they cannot."""
    b, k, r, s, c, o = cfg.behaviour, cfg.kl, cfg.reduction, cfg.sampling, cfg.credit, cfg.optim
    loss = {"token_mean": "dapo", "response_mean": "grpo", "fixed_budget": "dr_grpo"}.get(r.name)
    cispo = b.objective == "cispo" and b.clip_low == 1.0 and r.name == "token_mean"
    loss = "sapo" if b.objective == "sapo" else "cispo" if cispo else loss
    completions = s.prompts_per_step * s.group_size
    schedule = "constant_with_warmup" if o.schedule == "constant" and o.warmup_steps else o.schedule
    data: dict[str, Any] = {
        "trainer": "grpo",
        "num_generations": s.group_size,
        "per_device_train_batch_size": max(1, completions // o.minibatches_per_epoch),
        "generation_batch_size": completions,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": o.minibatches_per_epoch,
        "num_iterations": o.epochs_per_batch,
        "loss_type": loss or "dapo",
        "epsilon": b.clip_low,
        "epsilon_high": 1 + b.clip_high if cispo else b.clip_high,
        "delta": b.dual_clip,
        "importance_sampling_level": "sequence" if b.objective == "gspo" else "token",
        "beta": k.beta if k.placement == "loss" else 0.0,
        "use_bias_correction_kl": k.estimator == "k3_iw",
        "scale_rewards": "none" if c.estimator == "dr_grpo" else "group",
        "temperature": cfg.generation.temperature,
        "top_p": cfg.generation.top_p,
        "max_completion_length": cfg.generation.max_new_tokens,
        **_vllm_settings(cfg),
        "learning_rate": o.lr,
        "lr_scheduler_type": schedule,
        "warmup_steps": o.warmup_steps,
        "weight_decay": o.weight_decay,
        "adam_beta1": o.adam_betas[0],
        "adam_beta2": o.adam_betas[1],
        "max_grad_norm": o.max_grad_norm,
        "max_steps": o.steps * o.minibatches_per_epoch * o.epochs_per_batch,
        "model_name_or_path": cfg.model.path,
    }
    return yaml.safe_dump(data, sort_keys=False), _differences(cfg, cispo)
