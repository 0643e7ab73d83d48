"""OpenRLHF's command line as flat dotted keys: the flags of a ``train_ppo_ray`` invocation,
the flat ≤0.10 names read as aliases of v0.11's dotted ones (sources in :mod:`.openrlhf`).
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rlmap.core.errors import InputError

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
