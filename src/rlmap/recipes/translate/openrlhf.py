"""OpenRLHF's command line (``python -m openrlhf.cli.train_ppo_ray --flag value …`` in a
text file) → rlmap, and the inverse (flags).

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

import shlex
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError, InputError
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.translate import (
    IMPLIED,
    NULL,
    Lookup,
    Mapped,
    Mapping,
    betas,
    field,
    implied,
    off,
    read_with,
)

SRC = "OpenRLHF@3c3be623 openrlhf/cli/train_ppo_ray.py"
FLAT = {
    "advantage_estimator": "algo.advantage.estimator",
    "gamma": "algo.advantage.gamma",
    "lambd": "algo.advantage.lambd",
    "n_samples_per_prompt": "rollout.n_samples_per_prompt",
    "rollout_batch_size": "rollout.batch_size",
    "train_batch_size": "train.batch_size",
    "max_epochs": "train.max_epochs",
    "micro_train_batch_size": "train.micro_batch_size",
    "init_kl_coef": "algo.kl.init_coef",
    "use_kl_loss": "algo.kl.use_loss",
    "kl_estimator": "algo.kl.estimator",
    "kl_target": "algo.kl.target",
    "kl_horizon": "algo.kl.horizon",
    "entropy_loss_coef": "actor.entropy_coef",
    "no_advantage_std_norm": "algo.advantage.no_std_norm",
    "enable_vllm_is_correction": "algo.advantage.is_correction_enable",
    "vllm_is_correction_type": "algo.advantage.is_correction_type",
    "vllm_is_truncated_threshold": "algo.advantage.is_correction_threshold",
    "dynamic_filtering": "algo.dynamic_filtering_enable",
    "dynamic_filtering_reward_range": "algo.dynamic_filtering_range",
    "pretrain": "actor.model_name_or_path",
    "reward_pretrain": "reward.model_name_or_path",
    "critic_pretrain": "critic.model_name_or_path",
    "actor_learning_rate": "actor.adam.lr",
    "critic_learning_rate": "critic.adam.lr",
    "adam_betas": "actor.adam.betas",
    "l2": "actor.adam.weight_decay",
    "max_norm": "actor.max_norm",
    "lr_scheduler": "actor.lr_scheduler",
    "lr_warmup_ratio": "actor.lr_warmup_ratio",
    "eps_clip": "actor.eps_clip",
    "eps_clip_low_high": "actor.eps_clip_low_high",
    "dual_clip": "actor.dual_clip",
    "value_clip": "critic.value_clip",
    "policy_loss_type": "actor.policy_loss_type",
    "normalize_reward": "reward.normalize_enable",
    "reward_clip_range": "reward.clip_range",
    "top_p": "rollout.top_p",
    "temperature": "rollout.temperature",
    "max_len": "data.max_len",
    "max_new_tokens": "rollout.max_new_tokens",
    "lora_rank": "ds.lora.rank",
    "lora_alpha": "ds.lora.alpha",
    "overlong_buffer_len": "reward.overlong_buffer_len",
    "overlong_penalty_factor": "reward.overlong_penalty_factor",
    "async_train": "train.async_enable",
}
"""≤0.10 flat flag → v0.11 dotted flag."""
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
    if value not in ESTIMATORS:
        raise ConfigError(
            f"--algo.advantage.estimator: {value!r} is not an OpenRLHF value "
            f"(one of {', '.join(ESTIMATORS)})"
        )
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
    if kind == "icepop":
        return Mapped(
            {
                "behaviour.corrections": ["icepop"],
                "behaviour.icepop_low": low,
                "behaviour.icepop_high": high,
            },
            note="w = κ·1[lo ≤ κ ≤ hi]",
        )
    if kind == "tis":
        return Mapped(
            {
                "behaviour.corrections": ["tis"],
                "behaviour.tis_level": "token",
                "behaviour.tis_cap": high,
            },
            "approximate",
            f"OpenRLHF also clamps κ from below at {low}",
        )
    if kind == "seq-mask-tis":
        return Mapped(
            {
                "behaviour.corrections": ["masked_is"],
                "behaviour.masked_is_low": low,
                "behaviour.masked_is_high": high,
            },
            "approximate",
            "the geometric-mean mask; OpenRLHF also weights every kept token by its κ, unclamped",
        )
    raise ConfigError(
        f"--algo.advantage.is_correction_type: {kind!r} is not an OpenRLHF value "
        "(tis, icepop, seq-mask-tis)"
    )


def _loss(value: Any, get: Lookup) -> Mapped:
    if value == "ppo":
        return Mapped({"behaviour.objective": "ppo_clip"})
    if value == "gspo":
        return Mapped(
            {
                "behaviour.objective": "gspo",
                "behaviour.gspo_token": False,
                "reduction.name": "response_mean",
                "reduction.max_len": None,
            },
            note="sequence-level ratio, a per-sequence mean (loss.py)",
        )
    raise ConfigError(f"--actor.policy_loss_type: {value!r} is not an OpenRLHF value (ppo, gspo)")


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


def _lora(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"model.lora_rank": 0}, note="rank 0: full fine-tuning")
    return Mapped({"model.lora_rank": value, "model.lora_alpha": get("ds.lora.alpha")})


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
    Mapping(
        "actor.entropy_coef", off("rlmap has no entropy bonus", (None, 0, 0.0)), NULL, f"{SRC}:432"
    ),
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
    Mapping("ds.lora.rank", _lora, 0, f"{SRC}:365"),
    Mapping(
        "actor.model_name_or_path", field("model.path", "the source's model"), None, f"{SRC}:517"
    ),
)
"""The rows, in the order they apply (a later row's fields win)."""


def table(world_size: int = 1, flat: dict[str, Any] | None = None) -> tuple[Mapping, ...]:
    """The table (its rows depend neither on the number of processes nor on the file)."""
    return TABLE


def read(path: Path) -> dict[str, Any]:
    """The flags of the ``train_ppo_ray`` invocation in ``path`` (line continuations and
    comments allowed), flat names mapped to the dotted ones."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, IsADirectoryError):
        raise InputError(f"{path}: no such file") from None
    try:
        words = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise InputError(f"{path}: not a command line ({exc})") from None
    if not any("openrlhf" in w for w in words):
        raise InputError(f"{path}: no openrlhf command (python -m openrlhf.cli.train_ppo_ray …)")
    return _flags(words[next(i for i, w in enumerate(words) if "openrlhf" in w) + 1 :])


def _value(word: str) -> Any:
    """A flag's value: a number as a number (YAML 1.1 reads ``5e-7`` as a string)."""
    import yaml

    for kind in (int, float):
        try:
            return kind(word)
        except ValueError:
            pass
    return yaml.safe_load(word)


def _flags(words: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    while i < len(words):
        name = words[i].removeprefix("--")
        values: list[Any] = []
        while i + 1 < len(words) and not words[i + 1].startswith("--"):
            i += 1
            values.append(_value(words[i]))
        out[FLAT.get(name, name)] = (
            True if not values else values[0] if len(values) == 1 else values
        )
        i += 1
    return out


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
