"""OpenRLHF flags for an rlmap config (``rlmap explain --as openrlhf``), and what they
cannot reproduce: the inverse of :mod:`.openrlhf`'s table.
"""

from __future__ import annotations

from typing import Any

from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.translate.openrlhf import ESTIMATORS


def differences(cfg: RecipeConfig) -> list[str]:
    """What OpenRLHF's flags cannot reproduce of ``cfg``, one line each."""
    b, k, c, o = cfg.behaviour, cfg.kl, cfg.credit, cfg.optim
    name = {v: key for key, v in ESTIMATORS.items()}.get(c.estimator)
    sequence_gspo = b.objective == "gspo" and not b.gspo_token
    checks = [
        (
            c.estimator == "grpo" and c.std_eps != 1e-9,
            f"credit.std_eps: OpenRLHF adds 1e-9 to the std, rlmap {c.std_eps:g}",
        ),
        (name is None, f"credit.estimator={c.estimator}: no OpenRLHF estimator"),
        (c.estimator == "gae", "gae: OpenRLHF whitens the advantages"),
        (
            b.objective != "ppo_clip" and not sequence_gspo,
            f"behaviour.objective={b.objective}: no OpenRLHF loss",
        ),
        (
            cfg.reduction.name != ("response_mean" if sequence_gspo else "token_mean"),
            "reduction: OpenRLHF's ppo is token-level, its gspo per sequence",
        ),
        (
            k.placement == "reward" and c.estimator not in ("gae", "reinforce_pp"),
            "KL in the reward: OpenRLHF adds it per token after the group baseline",
        ),
        (
            k.placement != "none" and k.estimator not in ("k1", "k2", "k3"),
            f"kl.estimator={k.estimator}: no OpenRLHF estimator",
        ),
        (k.placement == "reward" and k.estimator != "k1", "kl: rlmap's in-reward KL is k1"),
        (
            k.placement == "loss" and cfg.reduction.name != "token_mean",
            "kl: OpenRLHF reduces the KL loss per token",
        ),
        (b.mode != "decoupled" or cfg.system.mode != "sync", "bypass / asynchronous: not written"),
        (
            not (set(b.corrections) <= {"icepop"}),
            f"corrections={list(b.corrections)}: not written "
            "(OpenRLHF's tis clamps from below, its seq-mask-tis reweights)",
        ),
        (o.schedule == "cosine", "cosine: OpenRLHF's cosine_with_min_lr keeps 0.1 of the LR"),
        (o.warmup_steps > 0, "optim.warmup_steps: OpenRLHF sets a warm-up ratio"),
        (cfg.sampling.filter not in ("none", "mixed"), f"sampling.filter={cfg.sampling.filter}"),
        (cfg.sampling.filter == "mixed", "sampling.max_rounds: OpenRLHF's filter has no cap"),
        (c.lam_critic is not None or c.adaptive_alpha is not None, "credit: OpenRLHF has one λ"),
        (
            cfg.feedback.source not in ("verifier", "reward_model"),
            f"feedback.source={cfg.feedback.source}: a verifier or a reward model only",
        ),
    ]
    return [text for failed, text in checks if failed]


def inverse(cfg: RecipeConfig) -> tuple[str, list[str]]:
    """OpenRLHF flags that reproduce ``cfg``, and what they cannot (:func:`differences`)."""
    b, k, s, c, o = cfg.behaviour, cfg.kl, cfg.sampling, cfg.credit, cfg.optim
    name = {v: key for key, v in ESTIMATORS.items()}.get(c.estimator)
    flags: dict[str, Any] = {
        "algo.advantage.estimator": name or "gae",
        "algo.advantage.gamma": c.gamma,
        "algo.advantage.lambd": c.lam,
        "rollout.n_samples_per_prompt": s.group_size,
        "rollout.batch_size": s.prompts_per_step,
        "train.batch_size": s.prompts_per_step * s.group_size // o.minibatches_per_epoch,
        "train.max_epochs": o.epochs_per_batch,
        "train.micro_batch_size": o.micro_batch_size,
        "actor.eps_clip_low_high": f"{b.clip_low} {b.clip_high}",
        "actor.policy_loss_type": "gspo" if b.objective == "gspo" else "ppo",
        "algo.kl.init_coef": k.beta if k.placement != "none" else 0.0,
        "algo.kl.estimator": k.estimator,
        "actor.adam.lr": o.lr,
        "critic.adam.lr": o.critic_lr,
        "actor.adam.betas": f"{o.adam_betas[0]} {o.adam_betas[1]}",
        "actor.adam.weight_decay": o.weight_decay,
        "actor.max_norm": o.max_grad_norm,
        "actor.lr_scheduler": "cosine_with_min_lr" if o.schedule == "cosine" else o.schedule,
        "actor.lr_warmup_ratio": 0.0,
        "rollout.temperature": cfg.generation.temperature,
        "rollout.top_p": cfg.generation.top_p,
        "rollout.max_new_tokens": cfg.generation.max_new_tokens,
        "critic.value_clip": cfg.critic.value_clip,
        "ds.lora.rank": cfg.model.lora_rank,
        "actor.model_name_or_path": cfg.model.path,
    }
    if cfg.model.lora_rank:
        alpha = cfg.model.lora_alpha
        flags["ds.lora.alpha"] = 2 * cfg.model.lora_rank if alpha is None else alpha
    if k.target is not None:
        flags |= {"algo.kl.target": k.target, "algo.kl.horizon": k.horizon}
    if cfg.feedback.overlong_cache is not None:
        flags["reward.overlong_buffer_len"] = cfg.feedback.overlong_cache
    if cfg.feedback.source == "reward_model":
        flags["reward.model_name_or_path"] = cfg.model.reward_path or "REWARD_MODEL_PATH"
    words = [f"--{key} {value}" for key, value in flags.items()]
    words += ["--algo.kl.use_loss"] if k.placement == "loss" else []
    words += [f"--actor.dual_clip {b.dual_clip}"] if b.dual_clip else []
    words += ["--algo.dynamic_filtering_enable"] if s.filter == "mixed" else []
    if "icepop" in b.corrections:
        words += [
            "--algo.advantage.is_correction_enable",
            "--algo.advantage.is_correction_type icepop",
            f"--algo.advantage.is_correction_threshold {b.icepop_low} {b.icepop_high}",
        ]
    return "python -m openrlhf.cli.train_ppo_ray \\\n  " + " \\\n  ".join(words) + "\n", (
        differences(cfg)
    )
