"""verl's rows outside the policy loss (:mod:`.verl_loss`): the advantage estimator, the KL
term, the optimiser and its schedule, dynamic sampling, the reward. Sources in :mod:`.verl`.
A: ``actor_rollout_ref.actor.``, RO: ``actor_rollout_ref.rollout.``, ALG: ``algorithm.``,
RC: ``algorithm.rollout_correction.``.
"""

from __future__ import annotations

from typing import Any

from rlmap.recipes.translate.rows import Lookup, Mapped, kl_controller, mixed_filter, one_of

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


KL_TYPES = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}


def estimator(value: Any, get: Lookup) -> Mapped:
    one_of(ALG + "adv_estimator", value, [*ESTIMATORS, *NO_ESTIMATOR], "verl")
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


def std_norm(value: Any, get: Lookup) -> Mapped:
    return Mapped({}, note="read with adv_estimator (False with grpo: dr_grpo)")


def kl_loss(value: Any, get: Lookup) -> Mapped:
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


def kl_in_reward(value: Any, get: Lookup) -> Mapped:
    if not value or get(A + "use_kl_loss"):
        return Mapped({}, note="" if not value else "see use_kl_loss")
    penalty = get(ALG + "kl_penalty")
    if KL_TYPES.get(penalty) != "k1":
        return Mapped({}, "none", f"kl_penalty={penalty}: rlmap's in-reward KL is k1")
    fields = {
        "kl.placement": "reward",
        "kl.estimator": "k1",
        "kl.beta": get(ALG + "kl_ctrl.kl_coef"),
        **kl_controller(get, ALG + "kl_ctrl.", "target_kl"),
    }
    return Mapped(
        fields,
        note="−β·k1 per token; an outcome estimator's R is their sum, as "
        "verl's score (token_level_rewards.sum(-1))",
    )


def _per_step(get: Lookup) -> int:
    """Optimiser steps per verl training step (epochs × mini-batches)."""
    return int(get(A + "ppo_epochs")) * (
        get("data.train_batch_size") // get(A + "ppo_mini_batch_size")
    )


def warmup(value: Any, get: Lookup) -> Mapped:
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


def schedule(value: Any, get: Lookup) -> Mapped:
    one_of(A + "optim.lr_scheduler_type", value, ("constant", "cosine"), "verl")
    if value == "constant":
        return Mapped({"optim.schedule": "constant"})
    return Mapped(
        {"optim.schedule": "cosine"},
        "approximate",
        "verl steps its scheduler once "
        "per training step (rlmap per optimiser step) and keeps min_lr_ratio and "
        "num_cycles",
    )


def filter_groups(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"sampling.filter": "none"})
    metric = get(ALG + "filter_groups.metric")
    rounds = get(ALG + "filter_groups.max_num_gen_batches")
    fields = mixed_filter(rounds)
    why = "" if metric == "acc" else f"metric={metric} includes shaping; "
    return Mapped(
        fields,
        "approximate",
        why + "verl keeps single-trajectory groups, rlmap drops "
        "them; max_num_gen_batches ≤ 0 (unbounded) keeps rlmap's finite cap",
    )


OVERLONG = "reward.reward_kwargs.overlong_buffer_cfg."


def overlong(value: Any, get: Lookup) -> Mapped:
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


def reward_model(value: Any, get: Lookup) -> Mapped:
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
