"""OpenRLHF's command line (``python -m openrlhf.cli.train_ppo_ray --flag value …`` in a
text file) → rlmap, and the inverse (flags).

Defaults are those the research note ``TRANSLATE.md`` §3 read at OpenRLHF v0.11.0
(``openrlhf/cli/train_ppo_ray.py``, cited ``O:line``); they were not re-read for this
module. v0.11 spells flags dotted (``--algo.kl.init_coef``); the flat ≤0.10 names the
note lists (``--init_kl_coef``) are read as aliases. A flag followed by another flag (or
nothing) is a switch, True.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError, InputError
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.translate import IMPLIED, NULL, Lookup, Mapped, Mapping, implied

SRC = "OpenRLHF v0.11.0 openrlhf/cli/train_ppo_ray.py (TRANSLATE.md §3)"
FLAT = {"advantage_estimator": "algo.advantage.estimator", "gamma": "algo.advantage.gamma",
        "lambd": "algo.advantage.lambd", "n_samples_per_prompt": "rollout.n_samples_per_prompt",
        "rollout_batch_size": "rollout.batch_size", "train_batch_size": "train.batch_size",
        "max_epochs": "train.max_epochs", "micro_train_batch_size": "train.micro_batch_size",
        "init_kl_coef": "algo.kl.init_coef", "use_kl_loss": "algo.kl.use_loss",
        "kl_estimator": "algo.kl.estimator", "entropy_loss_coef": "actor.entropy_coef",
        "no_advantage_std_norm": "algo.advantage.no_std_norm",
        "enable_vllm_is_correction": "algo.advantage.is_correction_enable",
        "vllm_is_correction_type": "algo.advantage.is_correction_type",
        "dynamic_filtering": "algo.dynamic_filtering_enable",
        "pretrain": "actor.model_name_or_path"}  # fmt: skip
ESTIMATORS = {"gae": "gae", "reinforce": "reinforce_pp", "rloo": "rloo",
              "reinforce_baseline": "reinforce_pp_baseline", "group_norm": "grpo",
              "dr_grpo": "dr_grpo"}  # fmt: skip


def _field(name: str, note: str = "", kind: str = "exact") -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({name: value}, kind, note)

    return convert


def _read_with(other: str) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({}, note=f"read with {other}")

    return convert


def _estimator(value: Any, get: Lookup) -> Mapped:
    if value not in ESTIMATORS:
        raise ConfigError(f"--algo.advantage.estimator: {value!r} is not an OpenRLHF value "
                          f"(one of {', '.join(ESTIMATORS)})")  # fmt: skip
    name = ESTIMATORS[value]
    if name == "gae":
        return Mapped({"credit.estimator": "gae", "critic.enabled": True}, "approximate",
                      "OpenRLHF whitens GAE advantages (experience_maker.py)")  # fmt: skip
    eps = {"credit.std_eps": 1e-9} if name == "grpo" else {}
    note = "trap: OpenRLHF's reinforce is REINFORCE++" if value == "reinforce" else ""
    return Mapped({"credit.estimator": name, "critic.enabled": False, **eps}, note=note)


def _minibatches(value: Any, get: Lookup) -> Mapped:
    samples = get("rollout.batch_size") * get("rollout.n_samples_per_prompt")
    if not value or samples % value:
        raise ConfigError(
            f"--train.batch_size: {value} does not divide rollout.batch_size × n = {samples}"
        )
    return Mapped({"optim.minibatches_per_epoch": samples // value},
                  note=f"trap: {samples}/{value} = {samples // value} updates")  # fmt: skip


def _kl(value: Any, get: Lookup) -> Mapped:
    beta, est = get("algo.kl.init_coef"), get("algo.kl.estimator")
    if not beta:
        return Mapped({"kl.placement": "none", "kl.beta": 0.0})
    if value:
        return Mapped({"kl.placement": "loss", "kl.beta": beta, "kl.estimator": est})
    if est != "k1":
        return Mapped({}, "none", f"a {est} KL in the reward: rlmap's in-reward KL is k1")
    fields = {"kl.placement": "reward", "kl.beta": beta, "kl.estimator": "k1"}
    if get("algo.advantage.estimator") in ("gae", "reinforce"):
        return Mapped(fields, note="trap: OpenRLHF puts 0.01·k1 in the reward by default")
    return Mapped(fields, "approximate", "trap: on by default; rlmap's outcome estimators "
                  "ignore an in-reward KL")  # fmt: skip


def _correction(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"behaviour.corrections": []})
    kind, (low, high) = (
        get("algo.advantage.is_correction_type"),
        get("algo.advantage.is_correction_threshold"),
    )
    if kind == "icepop":
        return Mapped({"behaviour.corrections": ["icepop"], "behaviour.icepop_low": low,
                       "behaviour.icepop_high": high})  # fmt: skip
    if kind == "tis":
        return Mapped({"behaviour.corrections": ["tis"], "behaviour.tis_level": "token",
                       "behaviour.tis_cap": high}, "approximate",
                      f"OpenRLHF also clamps from below at {low}")  # fmt: skip
    return Mapped({}, "none", f"{kind}: no rlmap correction with its weighting")


def _loss(value: Any, get: Lookup) -> Mapped:
    if value == "ppo":
        return Mapped({"behaviour.objective": "ppo_clip"})
    if value == "gspo":
        return Mapped({"behaviour.objective": "gspo", "reduction.name": "response_mean"},
                      note="forces a per-sequence mean (models/loss.py)")  # fmt: skip
    raise ConfigError(f"--actor.policy_loss_type: {value!r} is not an OpenRLHF value (ppo, gspo)")


def _off(what: str, neutral: tuple[Any, ...]) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return (
            Mapped({}, note="off: needs nothing") if value in neutral else Mapped({}, "none", what)
        )

    return convert


def _scheduler(value: Any, get: Lookup) -> Mapped:
    if value == "constant":
        return Mapped({"optim.schedule": "constant"})
    if value.startswith("cosine"):
        return Mapped({"optim.schedule": "cosine"}, "approximate", "rlmap's cosine goes to 0 "
                      "(min_lr_ratio 0.1); warm-up is a ratio of the total steps")  # fmt: skip
    return Mapped({}, "none", f"{value}: rlmap offers constant or cosine only")


def _max_new(value: Any, get: Lookup) -> Mapped:
    if value is not None:
        return Mapped({"generation.max_new_tokens": value})
    return Mapped({"generation.max_new_tokens": get("data.max_len")}, "approximate",
                  "unset: OpenRLHF generates up to data.max_len − prompt length")  # fmt: skip


def _clip(value: Any, get: Lookup) -> Mapped:
    return Mapped({"behaviour.clip_low": value, "behaviour.clip_high": value})


def _filter(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"sampling.filter": "none"})
    return Mapped({"sampling.filter": "mixed"}, "approximate",
                  "OpenRLHF has no round cap; rlmap's max_rounds stays")  # fmt: skip


IMPLIED_FIELDS = {"reduction.name": "token_mean", "reduction.max_len": None,
                  "behaviour.mode": "decoupled", "system.mode": "sync",
                  "behaviour.positive_nll": 0.0,
                  "feedback.overlong_cache": None}  # fmt: skip


TABLE: tuple[Mapping, ...] = (
    Mapping(
        IMPLIED + "PPO loss",
        implied(
            IMPLIED_FIELDS, "token-level aggregation over the optimiser step, π_old recomputed"
        ),
        "token_mean",
        "O:openrlhf/models/loss.py",
    ),
    Mapping("algo.advantage.estimator", _estimator, "gae", f"{SRC}:478-483"),
    Mapping("algo.advantage.gamma", _field("credit.gamma"), 1.0, f"{SRC}:392"),
    Mapping(
        "algo.advantage.lambd",
        _field("credit.lam", "trap: rlmap's default is 0.95"),
        1.0,
        f"{SRC}:391",
    ),
    Mapping(
        "algo.advantage.no_std_norm", _off("mean-only whitening", (False,)), False, f"{SRC}:488"
    ),
    Mapping("rollout.n_samples_per_prompt", _field("sampling.group_size"), 1, f"{SRC}:414"),
    Mapping("rollout.batch_size", _field("sampling.prompts_per_step"), 1024, f"{SRC}:373"),
    Mapping("train.batch_size", _minibatches, 128, f"{SRC}:394"),
    Mapping("train.max_epochs", _field("optim.epochs_per_batch"), 1, f"{SRC}:378"),
    Mapping("train.micro_batch_size", _field("optim.micro_batch_size"), 1, f"{SRC}:393"),
    Mapping("actor.eps_clip", _clip, 0.2, f"{SRC}:387"),
    Mapping("actor.dual_clip", _field("behaviour.dual_clip"), NULL, f"{SRC}:389"),
    Mapping("actor.policy_loss_type", _loss, "ppo", f"{SRC}:420"),
    Mapping("algo.kl.init_coef", _read_with("algo.kl.use_loss"), 0.01, f"{SRC}:419"),
    Mapping("algo.kl.estimator", _read_with("algo.kl.use_loss"), "k1", f"{SRC}:422"),
    Mapping("algo.kl.use_loss", _kl, False, f"{SRC}:485"),
    Mapping(
        "actor.entropy_coef",
        _off("rlmap has no entropy bonus", (None, 0, 0.0)),
        NULL,
        f"{SRC}:432",
    ),
    Mapping(
        "algo.advantage.is_correction_type",
        _read_with("is_correction_enable"),
        "tis",
        f"{SRC}:266",
    ),
    Mapping(
        "algo.advantage.is_correction_threshold",
        _read_with("is_correction_enable"),
        [0.5, 5.0],
        f"{SRC}:259",
    ),
    Mapping("algo.advantage.is_correction_enable", _correction, False, f"{SRC}:257"),
    Mapping("critic.value_clip", _field("critic.value_clip"), 0.5, f"{SRC}:390"),
    Mapping("actor.adam.lr", _field("optim.lr"), 1e-6, f"{SRC}:465"),
    Mapping("critic.adam.lr", _field("optim.critic_lr"), 9e-6, f"{SRC}:465"),
    Mapping(
        "actor.adam.betas",
        _off("rlmap's AdamW betas are (0.9, 0.999)", ()),
        [0.9, 0.95],
        f"{SRC}:466",
    ),
    Mapping("actor.adam.weight_decay", _field("optim.weight_decay"), 0.0, f"{SRC}:468"),
    Mapping("actor.max_norm", _field("optim.max_grad_norm"), 1.0, f"{SRC}:474"),
    Mapping("actor.lr_scheduler", _scheduler, "cosine_with_min_lr", f"{SRC}:470"),
    Mapping("rollout.temperature", _field("generation.temperature"), 1.0, f"{SRC}:399"),
    Mapping("rollout.top_p", _field("generation.top_p"), 1.0, f"{SRC}:398"),
    Mapping("data.max_len", _read_with("rollout.max_new_tokens"), 2048, f"{SRC}:379"),
    Mapping("rollout.max_new_tokens", _max_new, NULL, f"{SRC}:381"),
    Mapping(
        "reward.normalize_enable",
        _off("running reward normalisation", (False,)),
        False,
        f"{SRC}:396",
    ),
    Mapping("algo.dynamic_filtering_enable", _filter, False, f"{SRC}:562"),
    Mapping(
        "reward.model_name_or_path",
        _off(
            "a reward model: set feedback.source=reward_model and model.reward_path by hand",
            (None,),
        ),
        None,
        SRC,
    ),
    Mapping("actor.model_name_or_path", _field("model.path", "the source's model"), None, SRC),
)
"""The rows, in the order they apply (a later row's fields win)."""


def table(world_size: int = 1) -> tuple[Mapping, ...]:
    """The table (its rows do not depend on the number of processes)."""
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


def inverse(cfg: RecipeConfig) -> tuple[str, list[str]]:
    """OpenRLHF flags that reproduce ``cfg``, and what they cannot."""
    b, k, s, c, o = cfg.behaviour, cfg.kl, cfg.sampling, cfg.credit, cfg.optim
    name = {v: key for key, v in ESTIMATORS.items()}.get(c.estimator)
    checks = [
        (name is None, f"credit.estimator={c.estimator}: no OpenRLHF estimator"),
        (c.estimator == "gae", "gae: OpenRLHF whitens the advantages"),
        (
            b.objective not in ("ppo_clip", "gspo"),
            f"behaviour.objective={b.objective}: no OpenRLHF loss",
        ),
        (
            b.clip_low != b.clip_high,
            "clip: one --actor.eps_clip here (eps_clip_low_high not written)",
        ),
        (
            cfg.reduction.name != "token_mean" and b.objective != "gspo",
            "reduction: OpenRLHF is token-level",
        ),
        (
            k.placement == "reward" and c.estimator not in ("gae", "reinforce_pp"),
            "KL in the reward: ignored by rlmap's outcome estimators",
        ),
        (bool(b.corrections) or b.mode != "decoupled", "corrections / bypass: not written"),
        (o.schedule == "cosine", "cosine: OpenRLHF keeps min_lr_ratio=0.1"),
        (cfg.feedback.overlong_cache is not None, "feedback.overlong_cache: not written"),
    ]
    flags = {
        "algo.advantage.estimator": name or "gae",
        "algo.advantage.gamma": c.gamma,
        "algo.advantage.lambd": c.lam,
        "rollout.n_samples_per_prompt": s.group_size,
        "rollout.batch_size": s.prompts_per_step,
        "train.batch_size": s.prompts_per_step * s.group_size // o.minibatches_per_epoch,
        "train.max_epochs": o.epochs_per_batch,
        "train.micro_batch_size": o.micro_batch_size,
        "actor.eps_clip": b.clip_low,
        "actor.policy_loss_type": "gspo" if b.objective == "gspo" else "ppo",
        "algo.kl.init_coef": k.beta if k.placement != "none" else 0.0,
        "algo.kl.estimator": k.estimator,
        "actor.adam.lr": o.lr,
        "critic.adam.lr": o.critic_lr,
        "actor.adam.weight_decay": o.weight_decay,
        "actor.max_norm": o.max_grad_norm,
        "actor.lr_scheduler": "constant" if o.schedule == "constant" else "cosine_with_min_lr",
        "rollout.temperature": cfg.generation.temperature,
        "rollout.top_p": cfg.generation.top_p,
        "rollout.max_new_tokens": cfg.generation.max_new_tokens,
        "critic.value_clip": cfg.critic.value_clip,
        "actor.model_name_or_path": cfg.model.path,
    }
    words = [f"--{key} {value}" for key, value in flags.items()]
    words += ["--algo.kl.use_loss"] if k.placement == "loss" else []
    words += [f"--actor.dual_clip {b.dual_clip}"] if b.dual_clip else []
    words += ["--algo.dynamic_filtering_enable"] if s.filter == "mixed" else []
    return "python -m openrlhf.cli.train_ppo_ray \\\n  " + " \\\n  ".join(words) + "\n", [
        text for failed, text in checks if failed
    ]
