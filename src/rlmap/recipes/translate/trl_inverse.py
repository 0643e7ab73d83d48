"""TRL GRPOConfig fields for an rlmap config (``rlmap explain --as trl``), and what they
cannot reproduce: the inverse of :mod:`.trl`'s table.
"""

from __future__ import annotations

from typing import Any

import yaml

from rlmap.recipes.config import RecipeConfig


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
