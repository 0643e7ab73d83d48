"""TRL's GRPOConfig and RLOOConfig (flat dataclass fields as YAML or JSON) → rlmap: the
GRPOConfig table (RLOOConfig's in :mod:`.trl_rloo`, the rows both share in :mod:`.trl_args`,
the inverse for ``explain --as trl`` in :mod:`.trl_inverse`).

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
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError, InputError
from rlmap.recipes.translate import flatten, trl_rloo
from rlmap.recipes.translate.rows import (
    IMPLIED,
    NO_ENTROPY,
    NULL,
    Lookup,
    Mapped,
    Mapping,
    field,
    icepop,
    implied,
    off,
    one_of,
    read_with,
    tis,
)
from rlmap.recipes.translate.trl_args import shared
from rlmap.runs.rundir import read_yaml

T = "trl 1.16.0 trl/trainer/grpo_config.py"
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
    one_of("loss_type", value, LOSS_TYPES, "TRL")
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
    one_of("scale_rewards", value, ("group", "batch", "none"), "TRL")
    if value == "group":
        return Mapped(
            {"credit.estimator": "grpo", "credit.std_eps": 1e-4},
            note="ε=1e-4 (grpo_trainer.py: std_rewards + 1e-4)",
        )
    if value == "none":
        return Mapped({"credit.estimator": "dr_grpo"})
    return Mapped({}, "none", "group mean, batch std: rlmap has no batch-std scaling")


def _level(value: Any, get: Lookup) -> Mapped:
    one_of("importance_sampling_level", value, ("token", "sequence"), "TRL")
    if value == "token":
        return Mapped({"behaviour.objective": "ppo_clip"})
    return Mapped(
        {"behaviour.objective": "gspo", "behaviour.gspo_token": False},
        note="the geometric-mean ratio; reduction from loss_type",
    )


def _vllm_fields(get: Lookup) -> tuple[dict[str, Any], str, str]:
    """The correction rlmap applies for GRPOTrainer's vLLM importance sampling
    (grpo_trainer.py, "Compute the importance sampling ratio when using vLLM")."""
    if not get("use_vllm") or not get("vllm_importance_sampling_correction"):
        return {"behaviour.corrections": []}, "exact", "no importance-sampling correction"
    mode = get("vllm_importance_sampling_mode")
    low, high = get("vllm_importance_sampling_clip_min"), get("vllm_importance_sampling_clip_max")
    high = get("vllm_importance_sampling_cap") or high  # the deprecated name wins, as in TRL
    if mode == "token_mask" and high is not None:
        return icepop(low or 0.0, high), "exact", "w = κ·1[C_min ≤ κ ≤ C_max]"
    if high is None:
        return {}, "none", f"{mode} without an upper bound: no rlmap correction"
    fields = tis("token" if mode.startswith("token") else "sequence", high)
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
        Mapping("entropy_coef", off(NO_ENTROPY, (0, 0.0)), 0.0, f"{T}:877"),
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
