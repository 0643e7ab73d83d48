"""OpenRLHF's command line (``python -m openrlhf.cli.train_ppo_ray --flag value …`` in a
text file) → rlmap: the table (the command line read in :mod:`.openrlhf_flags`, the inverse for
``explain --as openrlhf`` in :mod:`.openrlhf_inverse`).

Defaults re-read at OpenRLHF/OpenRLHF @ 3c3be6234e0cb353e76bb8019947db9dfe99fca7 (v0.11.0,
the commit of ``TRANSLATE.md`` §3): ``openrlhf/cli/train_ppo_ray.py`` (cited ``O:line``);
the mathematics from ``openrlhf/models/loss.py`` (PolicyLoss, aggregate_loss),
``openrlhf/trainer/ppo_utils/experience_maker.py`` (advantages, whitening, the KL in the
reward) and ``.../length_penalty.py`` (the overlong penalty). v0.11 spells flags dotted
(``--algo.kl.init_coef``); the flat ≤0.10 names (``--init_kl_coef``, read at ed62d0e2^, the
parent of the commit that renamed them) are read as aliases. A flag followed by another
flag (or nothing) is a switch, True.
"""

from __future__ import annotations

from typing import Any

from rlmap.core.errors import ConfigError
from rlmap.recipes.translate.rows import (
    IMPLIED,
    NO_ENTROPY,
    NULL,
    Lookup,
    Mapped,
    Mapping,
    betas,
    field,
    icepop,
    implied,
    lora,
    off,
    one_of,
    read_with,
    tis,
)

SRC = "OpenRLHF@3c3be623 openrlhf/cli/train_ppo_ray.py"


ESTIMATORS = {
    "gae": "gae",
    "reinforce": "reinforce_pp",
    "rloo": "rloo",
    "reinforce_baseline": "reinforce_pp_baseline",
    "group_norm": "grpo",
    "dr_grpo": "dr_grpo",
}


WHITENED = ("gae", "reinforce", "reinforce_baseline")
"""Estimators whose advantages OpenRLHF whitens over the batch (experience_maker.py)."""


def _estimator(value: Any, get: Lookup) -> Mapped:
    one_of("--algo.advantage.estimator", value, ESTIMATORS, "OpenRLHF")
    name = ESTIMATORS[value]
    if name == "gae":
        return Mapped(
            {"credit.estimator": "gae", "critic.enabled": True},
            "approximate",
            "OpenRLHF whitens GAE advantages over the batch (experience_maker.py "
            "compute_advantages_and_returns); rlmap does not",
        )
    eps = {"credit.std_eps": 1e-9} if name == "grpo" else {}
    note = {
        "reinforce": "trap: OpenRLHF's reinforce is REINFORCE++ (whitened returns)",
        "reinforce_baseline": "R − group mean, whitened over the batch",
        "group_norm": "std + 1e-9",
        "dr_grpo": "R − group mean, not whitened",
    }
    return Mapped(
        {"credit.estimator": name, "critic.enabled": False, **eps}, note=note.get(value, "")
    )


def _minibatches(value: Any, get: Lookup) -> Mapped:
    samples = get("rollout.batch_size") * get("rollout.n_samples_per_prompt")
    if not value or samples % value:
        raise ConfigError(
            f"--train.batch_size: {value} does not divide rollout.batch_size × n = {samples}"
        )
    return Mapped(
        {"optim.minibatches_per_epoch": samples // value},
        note=f"trap: {samples}/{value} = {samples // value} updates",
    )


def _kl(value: Any, get: Lookup) -> Mapped:
    beta, est = get("algo.kl.init_coef"), get("algo.kl.estimator")
    target = get("algo.kl.target")
    adaptive = {"kl.target": target, "kl.horizon": get("algo.kl.horizon")} if target else {}
    if not beta:
        return Mapped({"kl.placement": "none", "kl.beta": 0.0})
    if value:
        fields = {
            "kl.placement": "loss",
            "kl.beta": beta,
            "kl.estimator": est,
            "kl.target": None,
            **adaptive,
        }
        if get("actor.policy_loss_type") == "gspo":
            return Mapped(
                fields,
                "approximate",
                "OpenRLHF reduces the KL loss per token "
                "(ppo_actor.py), rlmap with gspo's per-sequence mean",
            )
        return Mapped(fields, note="β·k, reduced per token (ppo_actor.py); kl.target adapts it")
    if est != "k1":
        return Mapped({}, "none", f"a {est} KL in the reward: rlmap's in-reward KL is k1")
    fields = {
        "kl.placement": "reward",
        "kl.beta": beta,
        "kl.estimator": "k1",
        "kl.target": None,
        **adaptive,
    }
    if get("algo.advantage.estimator") in ("gae", "reinforce"):
        return Mapped(fields, note="trap: OpenRLHF puts 0.01·k1 in the reward by default")
    return Mapped(
        fields,
        "approximate",
        "trap: on by default; OpenRLHF adds −β·k1 per token "
        "after the group baseline (A_t = Â_i − β·Σ_{s≥t} k1_s), rlmap subtracts "
        "β·Σ_t k1_t from R_i before it",
    )


def _correction(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"behaviour.corrections": []})
    kind = get("algo.advantage.is_correction_type")
    low, high = get("algo.advantage.is_correction_threshold")
    if get("actor.policy_loss_type") == "gspo":
        return Mapped(
            {"behaviour.corrections": []},
            "approximate",
            "with gspo OpenRLHF takes "
            "the sequence ratio against μ instead of a correction (loss.py)",
        )
    one_of(
        "--algo.advantage.is_correction_type", kind, ("tis", "icepop", "seq-mask-tis"), "OpenRLHF"
    )
    if kind == "icepop":
        return Mapped(icepop(low, high), note="w = κ·1[lo ≤ κ ≤ hi]")
    if kind == "tis":
        return Mapped(
            tis("token", high), "approximate", f"OpenRLHF also clamps κ from below at {low}"
        )
    return Mapped(
        {
            "behaviour.corrections": ["masked_is"],
            "behaviour.masked_is_low": low,
            "behaviour.masked_is_high": high,
        },
        "approximate",
        "the geometric-mean mask; OpenRLHF also weights every kept token by its κ, unclamped",
    )


def _loss(value: Any, get: Lookup) -> Mapped:
    one_of("--actor.policy_loss_type", value, ("ppo", "gspo"), "OpenRLHF")
    if value == "ppo":
        return Mapped({"behaviour.objective": "ppo_clip"})
    return Mapped(
        {
            "behaviour.objective": "gspo",
            "behaviour.gspo_token": False,
            "reduction.name": "response_mean",
            "reduction.max_len": None,
        },
        note="sequence-level ratio, a per-sequence mean (loss.py)",
    )


def _scheduler(value: Any, get: Lookup) -> Mapped:
    """transformers' get_scheduler; cosine_with_min_lr keeps min_lr_ratio of the LR."""
    if value in ("constant", "constant_with_warmup", "linear"):
        return Mapped({"optim.schedule": value.removesuffix("_with_warmup")})
    if value.startswith("cosine"):
        floor = get("actor.min_lr_ratio") if value == "cosine_with_min_lr" else 0.0
        if not floor:
            return Mapped({"optim.schedule": "cosine"})
        return Mapped(
            {"optim.schedule": "cosine"},
            "approximate",
            f"rlmap's cosine goes to 0, OpenRLHF's to {floor} of the LR",
        )
    return Mapped({}, "none", f"{value}: rlmap offers constant, cosine or linear")


def _warmup_ratio(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"optim.warmup_steps": 0})
    return Mapped(
        {},
        "none",
        f"a warm-up over {value:g} of the optimiser steps, which "
        "OpenRLHF counts from the dataset: set optim.warmup_steps by hand",
    )


def _max_new(value: Any, get: Lookup) -> Mapped:
    if value is not None:
        return Mapped({"generation.max_new_tokens": value})
    return Mapped(
        {"generation.max_new_tokens": get("data.max_len")},
        "approximate",
        "unset: OpenRLHF generates up to data.max_len − prompt length",
    )


def _clip(value: Any, get: Lookup) -> Mapped:
    pair = get("actor.eps_clip_low_high")
    if pair is not None:
        return Mapped({}, note="eps_clip_low_high wins (train_ppo_ray.py)")
    return Mapped({"behaviour.clip_low": value, "behaviour.clip_high": value})


def _clip_pair(value: Any, get: Lookup) -> Mapped:
    if value is None:
        return Mapped({}, note="None: eps_clip on both sides")
    low, high = value
    return Mapped({"behaviour.clip_low": low, "behaviour.clip_high": high})


def _filter(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"sampling.filter": "none"})
    low, high = get("algo.dynamic_filtering_range")
    if (low, high) != (0, 1):
        return Mapped(
            {},
            "none",
            f"keeps groups whose mean reward is in ({low}, {high}): "
            "rlmap's mixed filter keeps (0, 1) only",
        )
    return Mapped(
        {"sampling.filter": "mixed"},
        "approximate",
        "OpenRLHF has no round cap; rlmap's max_rounds stays",
    )


def _overlong(value: Any, get: Lookup) -> Mapped:
    if value is None:
        return Mapped({"feedback.overlong_cache": None})
    if get("reward.overlong_penalty_factor") != 1:
        return Mapped({}, "none", "overlong_penalty_factor ≠ 1: rlmap's overlong term has factor 1")
    return Mapped(
        {"feedback.overlong_cache": int(value)},
        note="DAPO's −min(exceed, L_c)/L_c (length_penalty.py)",
    )


def _reward_clip(value: Any, get: Lookup) -> Mapped:
    if get("reward.model_name_or_path") is None:
        return Mapped({}, note="no effect on a verifier's rewards in [−10, 10]")
    return Mapped(
        {}, "none", f"rewards clipped to {list(value)}: rlmap does not clip a reward model's scores"
    )


def _reward_model(value: Any, get: Lookup) -> Mapped:
    if value is None:
        return Mapped(
            {"feedback.source": "verifier"},
            note="no reward model: a reward function (remote_url / agent), rlmap's verifier",
        )
    return Mapped(
        {"feedback.source": "reward_model"},
        "approximate",
        "a trained reward model: set model.reward_path to a local copy (on the "
        "embedded default rlmap trains one from preference pairs)",
    )


IMPLIED_FIELDS = {
    "reduction.name": "token_mean",
    "reduction.max_len": None,
    "behaviour.mode": "decoupled",
    "system.mode": "sync",
    "behaviour.positive_nll": 0.0,
    "behaviour.dual_clip": None,
}


TABLE: tuple[Mapping, ...] = (
    Mapping(
        IMPLIED + "PPO loss",
        implied(
            IMPLIED_FIELDS, "token-level aggregation over the optimiser step, π_old recomputed"
        ),
        "token_mean",
        "O:openrlhf/models/loss.py aggregate_loss",
    ),
    Mapping("algo.advantage.estimator", _estimator, "gae", f"{SRC}:478-483"),
    Mapping("algo.advantage.gamma", field("credit.gamma"), 1.0, f"{SRC}:392"),
    Mapping(
        "algo.advantage.lambd",
        field("credit.lam", "trap: rlmap's default is 0.95"),
        1.0,
        f"{SRC}:391",
    ),
    Mapping(
        "algo.advantage.no_std_norm",
        off("mean-only whitening of gae / reinforce / reinforce_baseline", (False,)),
        False,
        f"{SRC}:488",
    ),
    Mapping("rollout.n_samples_per_prompt", field("sampling.group_size"), 1, f"{SRC}:414"),
    Mapping("rollout.batch_size", field("sampling.prompts_per_step"), 1024, f"{SRC}:373"),
    Mapping("train.batch_size", _minibatches, 128, f"{SRC}:394"),
    Mapping("train.max_epochs", field("optim.epochs_per_batch"), 1, f"{SRC}:378"),
    Mapping("train.micro_batch_size", field("optim.micro_batch_size"), 1, f"{SRC}:393"),
    Mapping("actor.eps_clip", _clip, 0.2, f"{SRC}:387"),
    Mapping("actor.eps_clip_low_high", _clip_pair, NULL, f"{SRC}:388"),
    Mapping("actor.dual_clip", field("behaviour.dual_clip"), NULL, f"{SRC}:389"),
    Mapping("actor.policy_loss_type", _loss, "ppo", f"{SRC}:420"),
    Mapping("algo.kl.init_coef", read_with("algo.kl.use_loss"), 0.01, f"{SRC}:419"),
    Mapping("algo.kl.estimator", read_with("algo.kl.use_loss"), "k1", f"{SRC}:422"),
    Mapping("algo.kl.target", read_with("algo.kl.use_loss"), NULL, f"{SRC}:417"),
    Mapping("algo.kl.horizon", read_with("algo.kl.use_loss"), 10000, f"{SRC}:418"),
    Mapping("algo.kl.use_loss", _kl, False, f"{SRC}:485"),
    Mapping("actor.entropy_coef", off(NO_ENTROPY, (None, 0, 0.0)), NULL, f"{SRC}:432"),
    Mapping(
        "algo.advantage.is_correction_type", read_with("is_correction_enable"), "tis", f"{SRC}:266"
    ),
    Mapping(
        "algo.advantage.is_correction_threshold",
        read_with("is_correction_enable"),
        [0.5, 5.0],
        f"{SRC}:259",
    ),
    Mapping("algo.advantage.is_correction_enable", _correction, False, f"{SRC}:257"),
    Mapping("critic.value_clip", field("critic.value_clip"), 0.5, f"{SRC}:390"),
    Mapping(
        "actor.optim", off("Muon: rlmap's optimiser is AdamW", ("adam",)), "adam", f"{SRC}:448"
    ),
    Mapping("actor.adam.lr", field("optim.lr"), 1e-6, f"{SRC}:465"),
    Mapping("critic.adam.lr", field("optim.critic_lr"), 9e-6, f"{SRC}:465"),
    Mapping("actor.adam.betas", betas, [0.9, 0.95], f"{SRC}:466"),
    Mapping("actor.adam.weight_decay", field("optim.weight_decay"), 0.0, f"{SRC}:468"),
    Mapping("actor.max_norm", field("optim.max_grad_norm"), 1.0, f"{SRC}:474"),
    Mapping("actor.min_lr_ratio", read_with("actor.lr_scheduler"), 0.1, f"{SRC}:472"),
    Mapping("actor.lr_scheduler", _scheduler, "cosine_with_min_lr", f"{SRC}:470"),
    Mapping("actor.lr_warmup_ratio", _warmup_ratio, 0.03, f"{SRC}:471"),
    Mapping("rollout.temperature", field("generation.temperature"), 1.0, f"{SRC}:399"),
    Mapping("rollout.top_p", field("generation.top_p"), 1.0, f"{SRC}:398"),
    Mapping("data.max_len", read_with("rollout.max_new_tokens"), 2048, f"{SRC}:379"),
    Mapping("rollout.max_new_tokens", _max_new, NULL, f"{SRC}:381"),
    Mapping(
        "reward.overlong_penalty_factor", read_with("reward.overlong_buffer_len"), 1, f"{SRC}:496"
    ),
    Mapping("reward.overlong_buffer_len", _overlong, NULL, f"{SRC}:494"),
    Mapping(
        "reward.normalize_enable",
        off("running reward normalisation", (False,)),
        False,
        f"{SRC}:396",
    ),
    Mapping("reward.clip_range", _reward_clip, [-10, 10], f"{SRC}:437"),
    Mapping(
        "algo.dynamic_filtering_range",
        read_with("algo.dynamic_filtering_enable"),
        [0, 1],
        f"{SRC}:565",
    ),
    Mapping("algo.dynamic_filtering_enable", _filter, False, f"{SRC}:562"),
    Mapping("reward.model_name_or_path", _reward_model, NULL, f"{SRC}:518"),
    Mapping("ds.lora.alpha", read_with("ds.lora.rank"), 16, f"{SRC}:366"),
    Mapping("ds.lora.rank", lora("ds.lora.alpha"), 0, f"{SRC}:365"),
    Mapping(
        "actor.model_name_or_path", field("model.path", "the source's model"), None, f"{SRC}:517"
    ),
)
"""The rows, in the order they apply (a later row's fields win)."""


def table(world_size: int = 1, flat: dict[str, Any] | None = None) -> tuple[Mapping, ...]:
    """The table (its rows depend neither on the number of processes nor on the file)."""
    return TABLE
