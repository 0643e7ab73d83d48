"""TRL's GRPOConfig (flat dataclass fields as YAML or JSON) → rlmap, and the inverse.

Defaults are those of trl 1.16.0's ``trl/trainer/grpo_config.py`` (written ``T:line``,
the line of the field's ``default=``) and transformers' ``TrainingArguments`` (HF);
``TRANSLATE.md`` §2a has the reasoning. Batch sizes count completions per device, so
the number of processes (``world_size``) is needed to know the prompts per step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from rlmap.core.errors import ConfigError
from rlmap.recipes.config import RecipeConfig, read_yaml
from rlmap.recipes.translate import IMPLIED, NULL, Lookup, Mapped, Mapping, flatten, implied

T = "trl 1.16.0 trl/trainer/grpo_config.py"
HF = "transformers TrainingArguments"
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo")


def _field(name: str, note: str = "", kind: str = "exact") -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({name: value}, kind, note)

    return convert


def _read_with(other: str) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({}, note=f"read with {other}")

    return convert


def _loss_type(value: Any, get: Lookup) -> Mapped:
    if value not in LOSS_TYPES:
        raise ConfigError(
            f"loss_type: {value!r} is not a TRL value (one of {', '.join(LOSS_TYPES)})"
        )
    none = {"reduction.max_len": None}
    if value == "dapo":
        return Mapped({"reduction.name": "token_mean", **none},
                      note="trap: TRL's default loss_type is dapo (global token mean)")  # fmt: skip
    if value in ("grpo", "sapo"):
        objective = {"behaviour.objective": "sapo"} if value == "sapo" else {}
        return Mapped({"reduction.name": "response_mean", **none, **objective})
    if value == "bnpo":
        return Mapped({"reduction.name": "token_mean", **none}, "approximate",
                      "the denominator is the local micro-batch's token count")  # fmt: skip
    if value == "dr_grpo":
        budget = get("max_completion_length")
        return Mapped({"reduction.name": "fixed_budget", "reduction.max_len": budget},
                      note="reduction only: the advantage still divides by the std unless "
                      "scale_rewards=none")  # fmt: skip
    if value == "cispo":
        return _cispo(get)
    return Mapped({}, "none", f"rlmap has no {value} loss; the closest preset's is kept")


def _cispo(get: Lookup) -> Mapped:
    cap = get("epsilon_high") or get("epsilon")
    if cap < 1:
        raise ConfigError(f"epsilon_high: {cap} caps the CISPO ratio below 1 (TRL caps at "
                          "epsilon_high itself); rlmap cannot express it")  # fmt: skip
    return Mapped({"behaviour.objective": "cispo", "behaviour.clip_low": 1.0,
                   "behaviour.clip_high": cap - 1, "reduction.name": "token_mean",
                   "reduction.max_len": None},
                  note="TRL's cap is epsilon_high, not 1+ε")  # fmt: skip


def _epsilon_high(value: Any, get: Lookup) -> Mapped:
    if get("loss_type") == "cispo":
        return Mapped({}, note="read with loss_type=cispo")
    return Mapped({"behaviour.clip_high": get("epsilon") if value is None else value},
                  note="None: epsilon")  # fmt: skip


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
        return Mapped({"kl.placement": "none", "kl.beta": 0.0},
                      note="trap: TRL's default is no KL and no reference model")  # fmt: skip
    return Mapped({"kl.placement": "loss", "kl.estimator": "k3", "kl.beta": value},
                  note="TRL's k3 has no ±10 clamp")  # fmt: skip


def _scale(value: Any, get: Lookup) -> Mapped:
    value = {True: "group", False: "none"}.get(value, value)
    if value == "group":
        return Mapped({"credit.estimator": "grpo", "credit.std_eps": 1e-4},
                      note="ε=1e-4 (grpo_trainer.py: std_rewards + 1e-4)")  # fmt: skip
    if value == "none":
        return Mapped({"credit.estimator": "dr_grpo"})
    if value == "batch":
        return Mapped({}, "none", "group mean, batch std: rlmap has no batch-std scaling")
    raise ConfigError(f"scale_rewards: {value!r} is not a TRL value (one of group, batch, none)")


def _level(value: Any, get: Lookup) -> Mapped:
    if value == "token":
        return Mapped({"behaviour.objective": "ppo_clip"})
    if value == "sequence":
        return Mapped({"behaviour.objective": "gspo", "behaviour.gspo_token": False},
                      note="the geometric-mean ratio; reduction from loss_type")  # fmt: skip
    raise ConfigError(f"importance_sampling_level: {value!r} is not a TRL value (token, sequence)")


def _prompts(world_size: int) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        steps = get("steps_per_generation") or get("gradient_accumulation_steps")
        batch = value or get("per_device_train_batch_size") * world_size * steps
        group = get("num_generations")
        if batch % group:
            raise ConfigError(
                f"generation_batch_size: {batch} is not a multiple of num_generations {group}"
            )
        minibatches = steps // get("gradient_accumulation_steps")
        return Mapped({"sampling.prompts_per_step": batch // group,
                       "optim.minibatches_per_epoch": max(1, minibatches)},
                      note=f"{batch} completions / G={group}, {world_size} procs")  # fmt: skip

    return convert


def _scheduler(value: Any, get: Lookup) -> Mapped:
    if value in ("constant", "constant_with_warmup"):
        return Mapped({"optim.schedule": "constant"})
    if value == "cosine":
        return Mapped({"optim.schedule": "cosine"})
    return Mapped({}, "none", f"{value}: rlmap offers constant or cosine only (trap: TRL's default "
                  "linear decays to 0 over num_train_epochs)")  # fmt: skip


def _off(what: str, neutral: tuple[Any, ...]) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return (
            Mapped({}, note="off: needs nothing") if value in neutral else Mapped({}, "none", what)
        )

    return convert


def _vllm(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({}, note="no vLLM: no importance-sampling correction")
    mode, cap = get("vllm_importance_sampling_mode"), get("vllm_importance_sampling_cap")
    fields = {"behaviour.corrections": ["tis"], "behaviour.tis_cap": cap}
    if mode in ("token_truncate", "sequence_truncate"):
        return Mapped({**fields, "behaviour.tis_level": mode.split("_")[0]})
    return Mapped({**fields, "behaviour.tis_level": "sequence"}, "approximate",
                  f"{mode}: TRL zeroes the weight above the cap; TIS truncates")  # fmt: skip


IMPLIED_FIELDS = {"behaviour.mode": "decoupled", "behaviour.corrections": [],
                  "behaviour.positive_nll": 0.0, "system.mode": "sync", "sampling.filter": "none",
                  "feedback.overlong_cache": None, "critic.enabled": False}  # fmt: skip


def table(world_size: int = 1) -> tuple[Mapping, ...]:
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
        Mapping("num_generations", _field("sampling.group_size"), 8, f"{T}:481"),
        Mapping(
            "per_device_train_batch_size", _field("optim.micro_batch_size", "completions"), 8, HF
        ),
        Mapping("gradient_accumulation_steps", _read_with("generation_batch_size"), 1, HF),
        Mapping("steps_per_generation", _read_with("generation_batch_size"), None, f"{T}:529"),
        Mapping(
            "generation_batch_size",
            _prompts(world_size),
            NULL,
            f"{T}:522 (None: per_device × world × steps_per_generation)",
        ),
        Mapping("num_iterations", _field("optim.epochs_per_batch"), 1, f"{T}:690"),
        Mapping("importance_sampling_level", _level, "token", f"{T}:761"),
        Mapping("loss_type", _loss_type, "dapo", f"{T}:802"),
        Mapping("epsilon", _epsilon, 0.2, f"{T}:694"),
        Mapping("epsilon_high", _epsilon_high, NULL, f"{T}:706"),
        Mapping("delta", _delta, NULL, f"{T}:698"),
        Mapping("beta", _beta, 0.0, f"{T}:682"),
        Mapping("scale_rewards", _scale, "group", f"{T}:790"),
        Mapping(
            "mask_truncated_completions",
            _off("rlmap cannot mask truncated completions", (False,)),
            False,
            T,
        ),
        Mapping("temperature", _field("generation.temperature"), 1.0, f"{T}:533"),
        Mapping("top_p", _field("generation.top_p"), 1.0, f"{T}:537"),
        Mapping("top_k", _off("rlmap has no top_k", (0, -1, None)), 0, f"{T}:544"),
        Mapping("max_completion_length", _field("generation.max_new_tokens"), 512, f"{T}:495"),
        Mapping("learning_rate", _field("optim.lr"), 1e-6, f"{T}:424"),
        Mapping("lr_scheduler_type", _scheduler, "linear", HF),
        Mapping("warmup_steps", _field("optim.warmup_steps"), 0, HF),
        Mapping("weight_decay", _field("optim.weight_decay"), 0.0, HF),
        Mapping("max_grad_norm", _field("optim.max_grad_norm"), 1.0, HF),
        Mapping("max_steps", _field("optim.steps"), None, HF),
        Mapping("vllm_importance_sampling_mode", _read_with("use_vllm"), "sequence_mask", T),
        Mapping("vllm_importance_sampling_cap", _read_with("use_vllm"), 3.0, T),
        Mapping("use_vllm", _vllm, False, f"{T}:588"),
        Mapping(
            "model_name_or_path",
            _field("model.path", "the source's model"),
            None,
            "TRL ModelConfig",
        ),
    )


def read(path: Path) -> dict[str, Any]:
    """GRPOConfig fields as YAML or JSON (JSON is YAML; a ``.json`` is read as JSON so that
    its errors name the line). ``"None"`` in the table stands for TRL's None default."""
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            from rlmap.core.errors import InputError

            raise InputError(f"{path}:{exc.lineno}: not valid JSON") from None
        except FileNotFoundError:
            from rlmap.core.errors import InputError

            raise InputError(f"{path}: no such file") from None
        return flatten(data)
    return flatten(read_yaml(path))


def inverse(cfg: RecipeConfig) -> tuple[str, list[str]]:
    """GRPOConfig fields that reproduce ``cfg`` (one process), and what they cannot."""
    b, k, r, s, c, o = cfg.behaviour, cfg.kl, cfg.reduction, cfg.sampling, cfg.credit, cfg.optim
    differs: list[str] = []
    loss = {"token_mean": "dapo", "response_mean": "grpo", "fixed_budget": "dr_grpo"}.get(r.name)
    if loss is None:
        differs.append(f"reduction.name={r.name}: no TRL loss_type")
    cispo = b.objective == "cispo" and b.clip_low == 1.0 and r.name == "token_mean"
    loss = "sapo" if b.objective == "sapo" else "cispo" if cispo else loss
    if (
        b.objective not in ("ppo_clip", "sapo")
        and not cispo
        and not (b.objective == "gspo" and not b.gspo_token)
    ):
        differs.append(f"behaviour.objective={b.objective}: not written for TRL")
    if b.objective == "sapo" and r.name != "response_mean":
        differs.append("sapo: TRL's sapo loss is a per-sequence mean")
    if c.estimator not in ("grpo", "dr_grpo"):
        differs.append(
            f"credit.estimator={c.estimator}: GRPOConfig has group-normalised advantages only"
        )
    if c.estimator == "grpo":
        differs.append(f"credit.std_eps: TRL adds 1e-4 to the std, rlmap {c.std_eps:g}")
    if k.placement == "reward" or (k.placement == "loss" and k.estimator != "k3"):
        differs.append(f"kl: TRL has a k3 KL in the loss only, got {k.estimator} in {k.placement}")
    if s.filter != "none" or b.corrections or b.mode != "decoupled" or cfg.feedback.overlong_cache:
        differs.append(
            "dynamic sampling, corrections, bypass and overlong shaping: not in GRPOConfig"
        )
    if r.name == "fixed_budget" and r.max_len != cfg.generation.max_new_tokens:
        differs.append("reduction.max_len: TRL's dr_grpo divides by max_completion_length")
    data: dict[str, Any] = {
        "num_generations": s.group_size,
        "per_device_train_batch_size": o.micro_batch_size,
        "generation_batch_size": s.prompts_per_step * s.group_size,
        "gradient_accumulation_steps": 1,
        "steps_per_generation": o.minibatches_per_epoch,
        "num_iterations": o.epochs_per_batch,
        "loss_type": loss or "dapo",
        "epsilon": b.clip_low,
        "epsilon_high": 1 + b.clip_high if cispo else b.clip_high,
        "delta": b.dual_clip,
        "importance_sampling_level": "sequence" if b.objective == "gspo" else "token",
        "beta": k.beta if k.placement == "loss" else 0.0,
        "scale_rewards": "none" if c.estimator == "dr_grpo" else "group",
        "temperature": cfg.generation.temperature,
        "top_p": cfg.generation.top_p,
        "max_completion_length": cfg.generation.max_new_tokens,
        "learning_rate": o.lr,
        "lr_scheduler_type": o.schedule,
        "warmup_steps": o.warmup_steps,
        "weight_decay": o.weight_decay,
        "max_grad_norm": o.max_grad_norm,
        "max_steps": o.steps,
        "model_name_or_path": cfg.model.path,
    }
    return yaml.safe_dump(data, sort_keys=False), differs
