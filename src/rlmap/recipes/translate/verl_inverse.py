"""verl's settings for an rlmap config (``rlmap explain --as verl``), and what they cannot
reproduce: the inverse of :mod:`.verl`'s table.
"""

from __future__ import annotations

from typing import Any

import yaml

from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.translate.verl_rows import ESTIMATORS

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
