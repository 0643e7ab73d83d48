"""SkyRL's settings for an rlmap config (``rlmap explain --as skyrl``), and what they cannot
reproduce: the inverse of :mod:`.skyrl`'s table.
"""

from __future__ import annotations

from typing import Any

import yaml

from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.translate.skyrl import ESTIMATORS, KL_ESTIMATORS, REDUCTIONS


def _loss_type(cfg: RecipeConfig) -> str | None:
    b = cfg.behaviour
    regular = "dual_clip" if b.dual_clip else "regular"
    return {
        "ppo_clip": regular,
        "gspo": "gspo",
        "sapo": "sapo",
        "cispo": "cispo",
        "dppo_tv": "dppo",
        "dppo_kl": "dppo",
    }.get(b.objective)


def differences(cfg: RecipeConfig) -> list[str]:
    """What SkyRL's settings cannot reproduce of ``cfg``, one line each."""
    b, k, r, s, c = cfg.behaviour, cfg.kl, cfg.reduction, cfg.sampling, cfg.credit
    dppo = b.objective in ("dppo_tv", "dppo_kl")
    checks = [
        (
            c.estimator == "grpo" and c.std_eps != 1e-6,
            f"credit.std_eps: SkyRL adds 1e-6 to the std, rlmap {c.std_eps:g}",
        ),
        (
            c.estimator not in {*ESTIMATORS.values(), "dr_grpo"},
            f"credit.estimator={c.estimator}: no SkyRL estimator",
        ),
        (c.estimator == "gae", "gae: SkyRL whitens the advantages (masked_whiten)"),
        (c.estimator == "reinforce_pp", "reinforce_pp: SkyRL whitens with another std"),
        (_loss_type(cfg) is None, f"behaviour.objective={b.objective}: no SkyRL policy_loss_type"),
        (b.objective == "gspo" and not b.gspo_token, "gspo: SkyRL's is token-level"),
        (
            dppo and (b.mode != "bypass" or b.dppo_tau != 0),
            "dppo: SkyRL's is against μ (bypass) with no τ term",
        ),
        (not dppo and b.mode != "decoupled", "behaviour.mode=bypass: only SkyRL's dppo"),
        (r.name not in REDUCTIONS.values(), f"reduction.name={r.name}: no SkyRL loss_reduction"),
        (
            k.placement == "loss" and r.name != "response_mean",
            "kl: SkyRL reduces the KL per sequence",
        ),
        (
            k.placement == "loss" and k.estimator not in KL_ESTIMATORS,
            f"kl.estimator={k.estimator}: no SkyRL kl_estimator_type",
        ),
        (k.placement == "reward" and k.estimator != "k1", "kl: rlmap's in-reward KL is k1"),
        (k.placement == "loss" and k.target is not None, "kl.target: SkyRL adapts the reward KL"),
        (
            not set(b.corrections) <= {"tis", "masked_is", "staleness"}
            or ("staleness" in b.corrections) != (cfg.system.mode == "async"),
            f"behaviour.corrections={list(b.corrections)}: not in SkyRL",
        ),
        (s.filter not in ("none", "mixed"), f"sampling.filter={s.filter}: mixed only"),
        (cfg.feedback.overlong_cache is not None, "feedback.overlong_cache: not in SkyRL"),
        (c.lam_critic is not None or c.adaptive_alpha is not None, "credit: SkyRL has one λ"),
        (cfg.optim.warmup_steps > 0, "optim.warmup_steps: transformers warms up as s/W"),
    ]
    return [text for failed, text in checks if failed]


def _algorithm(cfg: RecipeConfig) -> dict[str, Any]:
    b, k, r, s, c = cfg.behaviour, cfg.kl, cfg.reduction, cfg.sampling, cfg.credit
    names = {v: key for key, v in ESTIMATORS.items()}
    algorithm: dict[str, Any] = {
        "advantage_estimator": names.get(c.estimator, "grpo"),
        "grpo_norm_by_std": c.estimator != "dr_grpo",
        "gamma": c.gamma,
        "lambd": c.lam,
        "value_clip": cfg.critic.value_clip,
        "policy_loss_type": _loss_type(cfg) or "regular",
        "eps_clip_low": b.clip_low,
        "eps_clip_high": b.clip_high,
        "clip_ratio_c": b.dual_clip or 3.0,
        "sapo": {"tau_pos": b.sapo_tau_pos, "tau_neg": b.sapo_tau_neg},
        "loss_reduction": {v: key for key, v in REDUCTIONS.items()}.get(r.name, "token_mean"),
        "max_seq_len": r.max_len,
        "use_kl_loss": k.placement == "loss",
        "kl_loss_coef": k.beta,
        "kl_estimator_type": k.estimator,
        "use_kl_in_reward": k.placement == "reward",
        "kl_ctrl": {
            "type": "fixed" if k.target is None else "adaptive",
            "kl_target": k.target or 0.1,
            "horizon": k.horizon,
        },
        "dynamic_sampling": {
            "type": "filter" if s.filter == "mixed" else None,
            "max_sample_batches": s.max_rounds,
        },
        "off_policy_correction": {
            "tis_ratio_type": b.tis_level if "tis" in b.corrections else None,
            f"{b.tis_level}_tis_ratio_clip_high": b.tis_cap,
            "sequence_mask_metric": "geometric" if "masked_is" in b.corrections else None,
            "geo_mask_low": b.masked_is_low,
            "geo_mask_high": b.masked_is_high,
        },
    }
    if b.objective == "cispo":
        algorithm["cispo"] = {"cispo_eps_clip_low": b.clip_low, "cispo_eps_clip_high": b.clip_high}
    if b.objective in ("dppo_tv", "dppo_kl"):
        kind = b.objective.removeprefix("dppo_")
        algorithm["dppo"] = {
            "dppo_type": f"binary_{kind}",
            "delta_low": getattr(b, f"{b.objective}_low"),
            "delta_high": getattr(b, f"{b.objective}_high"),
        }
    return algorithm


def inverse(cfg: RecipeConfig) -> tuple[str, list[str]]:
    """SkyRL YAML that reproduces ``cfg``, and what it cannot (:func:`differences`)."""
    s, o, g, m = cfg.sampling, cfg.optim, cfg.generation, cfg.model
    schedule = "constant_with_warmup" if o.schedule == "constant" else o.schedule
    alpha = 2 * m.lora_rank if m.lora_alpha is None else m.lora_alpha  # rlmap's None: 2·r
    data = {
        "trainer": {
            "algorithm": _algorithm(cfg),
            "train_batch_size": s.prompts_per_step,
            "policy_mini_batch_size": s.prompts_per_step // o.minibatches_per_epoch,
            "update_epochs_per_batch": o.epochs_per_batch,
            "micro_train_batch_size_per_gpu": o.micro_batch_size,
            "fully_async": {
                "enabled": cfg.system.mode == "async",
                "max_staleness_steps": cfg.behaviour.max_staleness,
            },
            "policy": {
                "model": {"path": m.path, "lora": {"rank": m.lora_rank, "alpha": alpha}},
                "optimizer_config": {
                    "lr": o.lr,
                    "weight_decay": o.weight_decay,
                    "max_grad_norm": o.max_grad_norm,
                    "adam_betas": list(o.adam_betas),
                    "scheduler": schedule,
                    "num_warmup_steps": o.warmup_steps,
                },
            },
        },
        "generator": {
            "n_samples_per_prompt": s.group_size,
            "sampling_params": {
                "max_generate_length": g.max_new_tokens,
                "temperature": g.temperature,
                "top_p": g.top_p,
            },
        },
    }
    if cfg.critic.enabled:
        data["trainer"]["critic"] = {"optimizer_config": {"lr": o.critic_lr}}
    return yaml.safe_dump(data, sort_keys=False), differences(cfg)
