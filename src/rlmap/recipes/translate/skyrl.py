"""SkyRL's YAML (``trainer.*``, ``generator.*``) → rlmap, and the inverse.

Defaults are those the research note ``TRANSLATE.md`` §5 read at SkyRL @ a9564572
(``skyrl/train/config/config.py``, cited ``S:line``); they were not re-read for this
module. Keys the note does not pin down (the off-policy-correction sub-keys) are
reported as "not read" rather than guessed. AL: ``trainer.algorithm.``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlmap.core.errors import ConfigError
from rlmap.recipes.config import RecipeConfig, read_yaml
from rlmap.recipes.translate import IMPLIED, NULL, Lookup, Mapped, Mapping, flatten, implied

S = "SkyRL@a9564572 skyrl/train/config/config.py (TRANSLATE.md §5)"
AL = "trainer.algorithm."
GEN = "generator.sampling_params."
OPT = "trainer.policy.optimizer_config."
ESTIMATORS = {"grpo": "grpo", "rloo": "rloo", "reinforce++": "reinforce_pp", "gae": "gae"}
LOSSES = ("regular", "dual_clip", "gspo", "cispo", "sapo", "rollout_is", "dppo", "clip_cov",
          "kl_cov", "cross_entropy", "importance_sampling")  # fmt: skip
REDUCTIONS = {"token_mean": "token_mean", "sequence_mean": "response_mean",
              "seq_mean_token_sum_norm": "fixed_budget"}  # fmt: skip


def _field(name: str, note: str = "", kind: str = "exact") -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({name: value}, kind, note)

    return convert


def _read_with(other: str) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({}, note=f"read with {other}")

    return convert


def _estimator(value: Any, get: Lookup) -> Mapped:
    if value == "maxrl":
        return Mapped({}, "none", "rlmap has no maxrl; the closest preset's estimator is kept")
    if value not in ESTIMATORS:
        known = ", ".join([*ESTIMATORS, "maxrl"])
        raise ConfigError(
            f"{AL}advantage_estimator: {value!r} is not a SkyRL value (one of {known})"
        )
    name = ESTIMATORS[value]
    if name == "grpo" and not get(AL + "grpo_norm_by_std"):
        name = "dr_grpo"
    if name == "gae":
        return Mapped({"credit.estimator": "gae", "critic.enabled": True}, "approximate",
                      "SkyRL whitens GAE advantages (ppo_utils.py); rlmap does not")  # fmt: skip
    kind = "approximate" if name == "reinforce_pp" else "exact"
    return Mapped({"credit.estimator": name, "critic.enabled": False}, kind,
                  "whitening constants differ" if kind == "approximate" else "")  # fmt: skip


def _loss(value: Any, get: Lookup) -> Mapped:
    if value not in LOSSES:
        raise ConfigError(
            f"{AL}policy_loss_type: {value!r} is not a SkyRL value (one of {', '.join(LOSSES)})"
        )
    if value in ("regular", "dual_clip"):
        dual = get(AL + "clip_ratio_c") if value == "dual_clip" else None
        return Mapped({"behaviour.objective": "ppo_clip", "behaviour.dual_clip": dual})
    if value == "gspo":
        return Mapped({"behaviour.objective": "gspo", "behaviour.gspo_token": True})
    if value == "sapo":
        return Mapped({"behaviour.objective": "sapo"})
    if value == "cispo":
        return Mapped({"behaviour.objective": "cispo",
                       "behaviour.clip_low": get(AL + "cispo.cispo_eps_clip_low"),
                       "behaviour.clip_high": get(AL + "cispo.cispo_eps_clip_high")})  # fmt: skip
    return Mapped({}, "none", f"rlmap has no {value} loss; the closest preset's objective is kept")


def _clip(name: str) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        if get(AL + "policy_loss_type") == "cispo":
            return Mapped({}, note="cispo reads its own bounds")
        return Mapped({name: value})

    return convert


def _reduction(value: Any, get: Lookup) -> Mapped:
    if value not in REDUCTIONS:
        kind = "approximate" if value == "token_mean_legacy" else "none"
        fields = {"reduction.name": "token_mean"} if kind == "approximate" else {}
        return Mapped(fields, kind, f"{value}: no rlmap reduction with its denominator")
    name = REDUCTIONS[value]
    max_len = get(AL + "max_seq_len") if name == "fixed_budget" else None
    return Mapped({"reduction.name": name, "reduction.max_len": max_len})


def _kl_loss(value: Any, get: Lookup) -> Mapped:
    in_reward = get(AL + "use_kl_in_reward")
    if value and in_reward:
        return Mapped({}, "none", "KL in the loss and in the reward at once")
    if not value:
        return Mapped({} if in_reward else {"kl.placement": "none", "kl.beta": 0.0})
    est = get(AL + "kl_estimator_type")
    if est not in ("k1", "k2", "k3"):
        return Mapped({}, "none", f"kl_estimator_type={est}: rlmap has k1, k2, k3")
    fields = {"kl.placement": "loss", "kl.beta": get(AL + "kl_loss_coef"), "kl.estimator": est}
    if get(AL + "loss_reduction") == "sequence_mean":
        return Mapped(fields, note="trap: on by default")
    return Mapped(fields, "approximate", "trap: on by default; SkyRL reduces the KL per sequence, "
                  "rlmap with the policy's reduction")  # fmt: skip


def _kl_reward(value: Any, get: Lookup) -> Mapped:
    if not value or get(AL + "use_kl_loss"):
        return Mapped({})
    return Mapped({"kl.placement": "reward", "kl.estimator": "k1"}, "approximate",
                  "rlmap's outcome estimators ignore an in-reward KL")  # fmt: skip


def _dynamic(value: Any, get: Lookup) -> Mapped:
    if value is None:
        return Mapped({"sampling.filter": "none"})
    if value == "filter":
        return Mapped({"sampling.filter": "mixed",
                       "sampling.max_rounds": get(AL + "dynamic_sampling.max_sample_batches")},
                      "approximate", "rlmap drops single-trajectory groups too")  # fmt: skip
    return Mapped({}, "none", f"{value} (POLARIS replacement): no rlmap equivalent")


def _minibatches(value: Any, get: Lookup) -> Mapped:
    batch = get("trainer.train_batch_size")
    if not value or batch % value:
        raise ConfigError(
            f"trainer.policy_mini_batch_size: {value} does not divide train_batch_size {batch}"
        )
    return Mapped({"optim.minibatches_per_epoch": batch // value},
                  note=f"trap: {batch}/{value} = {batch // value} updates a batch")  # fmt: skip


def _off(what: str, neutral: tuple[Any, ...]) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return (
            Mapped({}, note="off: needs nothing") if value in neutral else Mapped({}, "none", what)
        )

    return convert


def _async(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"system.mode": "sync", "behaviour.mode": "decoupled"})
    staleness = get("trainer.fully_async.max_staleness_steps")
    return Mapped({"system.mode": "async", "behaviour.max_staleness": staleness,
                   "behaviour.corrections": ["staleness"]})  # fmt: skip


def _scheduler(value: Any, get: Lookup) -> Mapped:
    if value in ("constant", "constant_with_warmup"):
        return Mapped({"optim.schedule": "constant"})
    if value == "cosine":
        return Mapped({"optim.schedule": "cosine"}, "approximate", "SkyRL's min-LR")
    return Mapped({}, "none", f"{value}: rlmap offers constant or cosine only")


IMPLIED_FIELDS = {"behaviour.corrections": [], "behaviour.positive_nll": 0.0,
                  "feedback.overlong_cache": None}  # fmt: skip


TABLE: tuple[Mapping, ...] = (
    Mapping(
        IMPLIED + "SkyRL trainer",
        implied(
            IMPLIED_FIELDS,
            "no off-policy correction (tis_ratio_type None), no overlong shaping",
        ),
        "none",
        f"{S}:794",
    ),
    Mapping(AL + "grpo_norm_by_std", _read_with(AL + "advantage_estimator"), True, f"{S}:892"),
    Mapping(AL + "advantage_estimator", _estimator, "grpo", f"{S}:823"),
    Mapping(AL + "gamma", _field("credit.gamma"), 1.0, f"{S}:904"),
    Mapping(AL + "lambd", _field("credit.lam", "trap: rlmap's default is 0.95"), 1.0, f"{S}:902"),
    Mapping(
        AL + "value_clip",
        _field("critic.value_clip", "trap: rlmap's default is 0.5"),
        0.2,
        f"{S}:921",
    ),
    Mapping(AL + "clip_ratio_c", _read_with(AL + "policy_loss_type"), 3.0, f"{S}:910"),
    Mapping(AL + "cispo.cispo_eps_clip_low", _read_with(AL + "policy_loss_type"), 1.0, f"{S}:751"),
    Mapping(AL + "cispo.cispo_eps_clip_high", _read_with(AL + "policy_loss_type"), 4.0, f"{S}:756"),
    Mapping(AL + "eps_clip_low", _clip("behaviour.clip_low"), 0.2, f"{S}:906"),
    Mapping(AL + "eps_clip_high", _clip("behaviour.clip_high"), 0.2, f"{S}:908"),
    Mapping(AL + "policy_loss_type", _loss, "regular", f"{S}:853"),
    Mapping(AL + "max_seq_len", _read_with(AL + "loss_reduction"), None, f"{S}:933"),
    Mapping(AL + "loss_reduction", _reduction, "token_mean", f"{S}:876"),
    Mapping(AL + "kl_loss_coef", _read_with(AL + "use_kl_loss"), 0.001, f"{S}:836"),
    Mapping(AL + "kl_estimator_type", _read_with(AL + "use_kl_loss"), "k3", f"{S}:828"),
    Mapping(AL + "use_kl_loss", _kl_loss, True, f"{S}:833"),
    Mapping(AL + "use_kl_in_reward", _kl_reward, False, f"{S}:830"),
    Mapping(
        AL + "use_entropy_loss", _off("rlmap has no entropy bonus", (False,)), False, f"{S}:838"
    ),
    Mapping(
        AL + "advantage_batch_normalize",
        _off("rlmap has no batch normalisation of advantages", (False,)),
        False,
        f"{S}:849",
    ),
    Mapping(
        AL + "dynamic_sampling.max_sample_batches",
        _read_with(AL + "dynamic_sampling.type"),
        30,
        f"{S}:720",
    ),
    Mapping(AL + "dynamic_sampling.type", _dynamic, NULL, f"{S}:716"),
    Mapping(
        AL + "zero_variance_filter",
        _off("loss-masks zero-variance groups without resampling", (False,)),
        False,
        f"{S}:895",
    ),
    Mapping("generator.n_samples_per_prompt", _field("sampling.group_size"), 5, f"{S}:1225"),
    Mapping("trainer.train_batch_size", _field("sampling.prompts_per_step"), 1024, f"{S}:1390"),
    Mapping("trainer.policy_mini_batch_size", _minibatches, 256, f"{S}:1396"),
    Mapping("trainer.update_epochs_per_batch", _field("optim.epochs_per_batch"), 1, f"{S}:1387"),
    Mapping(
        "trainer.micro_train_batch_size_per_gpu",
        _field("optim.micro_batch_size"),
        1,
        f"{S}:1406",
    ),
    Mapping(GEN + "max_generate_length", _field("generation.max_new_tokens"), 1024, f"{S}:999"),
    Mapping(GEN + "temperature", _field("generation.temperature"), 1.0, f"{S}:999-1011"),
    Mapping(GEN + "top_p", _field("generation.top_p"), 1.0, f"{S}:999-1011"),
    Mapping(GEN + "top_k", _off("rlmap has no top_k", (-1, 0)), -1, f"{S}:999-1011"),
    Mapping(GEN + "min_p", _off("rlmap has no min_p", (0, 0.0)), 0.0, f"{S}:999-1011"),
    Mapping(
        "trainer.fully_async.max_staleness_steps",
        _read_with("trainer.fully_async.enabled"),
        4,
        f"{S}:951",
    ),
    Mapping("trainer.fully_async.enabled", _async, False, f"{S}:949"),
    Mapping(OPT + "lr", _field("optim.lr"), 1e-6, f"{S}:190-206"),
    Mapping(OPT + "weight_decay", _field("optim.weight_decay"), 1e-2, f"{S}:190-206"),
    Mapping(OPT + "max_grad_norm", _field("optim.max_grad_norm"), 1.0, f"{S}:190-206"),
    Mapping(OPT + "scheduler", _scheduler, "constant_with_warmup", f"{S}:190-206"),
    Mapping(OPT + "num_warmup_steps", _field("optim.warmup_steps"), 0, f"{S}:190-206"),
    Mapping("trainer.critic.optimizer_config.lr", _field("optim.critic_lr"), None, f"{S}:650"),
    Mapping("trainer.policy.model.path", _field("model.path", "the source's model"), None, S),
)
"""The rows, in the order they apply (a later row's fields win)."""


def table(world_size: int = 1) -> tuple[Mapping, ...]:
    """The table (its rows do not depend on the number of processes)."""
    return TABLE


def read(path: Path) -> dict[str, Any]:
    return flatten(read_yaml(path))


def _loss_type(cfg: RecipeConfig) -> str | None:
    b = cfg.behaviour
    regular = "dual_clip" if b.dual_clip else "regular"
    return {"ppo_clip": regular, "gspo": "gspo", "sapo": "sapo", "cispo": "cispo"}.get(b.objective)


def differences(cfg: RecipeConfig) -> list[str]:
    """What SkyRL's settings cannot reproduce of ``cfg``, one line each."""
    b, k, r, s, c = cfg.behaviour, cfg.kl, cfg.reduction, cfg.sampling, cfg.credit
    outcome = c.estimator not in ("gae", "reinforce_pp")
    checks = [
        (c.estimator not in {*ESTIMATORS.values(), "dr_grpo"},
         f"credit.estimator={c.estimator}: no SkyRL estimator"),
        (_loss_type(cfg) is None, f"behaviour.objective={b.objective}: no SkyRL policy_loss_type"),
        (b.objective == "gspo" and not b.gspo_token, "gspo: SkyRL's is token-level"),
        (r.name not in REDUCTIONS.values(), f"reduction.name={r.name}: no SkyRL loss_reduction"),
        (k.placement == "loss" and r.name != "response_mean",
         "kl: SkyRL reduces the KL per sequence"),
        (k.placement == "reward" and outcome,
         "kl in the reward: rlmap's outcome estimators ignore it"),
        ((bool(b.corrections) and cfg.system.mode == "sync") or b.mode != "decoupled",
         "corrections / bypass: not written"),
        (s.filter not in ("none", "mixed"), f"sampling.filter={s.filter}: mixed only"),
        (cfg.feedback.overlong_cache is not None, "feedback.overlong_cache: not in SkyRL"),
        (c.lam_critic is not None or c.adaptive_alpha is not None, "credit: SkyRL has one λ"),
    ]  # fmt: skip
    return [text for failed, text in checks if failed]


def _algorithm(cfg: RecipeConfig) -> dict[str, Any]:
    b, k, r, s, c = cfg.behaviour, cfg.kl, cfg.reduction, cfg.sampling, cfg.credit
    names = {v: key for key, v in ESTIMATORS.items()}
    algorithm: dict[str, Any] = {
        "advantage_estimator": names.get(c.estimator, "grpo"),
        "grpo_norm_by_std": c.estimator != "dr_grpo", "gamma": c.gamma, "lambd": c.lam,
        "value_clip": cfg.critic.value_clip, "policy_loss_type": _loss_type(cfg) or "regular",
        "eps_clip_low": b.clip_low, "eps_clip_high": b.clip_high,
        "clip_ratio_c": b.dual_clip or 3.0,
        "loss_reduction": {v: key for key, v in REDUCTIONS.items()}.get(r.name, "token_mean"),
        "max_seq_len": r.max_len, "use_kl_loss": k.placement == "loss", "kl_loss_coef": k.beta,
        "kl_estimator_type": k.estimator, "use_kl_in_reward": k.placement == "reward",
        "dynamic_sampling": {"type": "filter" if s.filter == "mixed" else None,
                             "max_sample_batches": s.max_rounds},
    }  # fmt: skip
    if b.objective == "cispo":
        algorithm["cispo"] = {"cispo_eps_clip_low": b.clip_low, "cispo_eps_clip_high": b.clip_high}
    return algorithm


def inverse(cfg: RecipeConfig) -> tuple[str, list[str]]:
    """SkyRL YAML that reproduces ``cfg``, and what it cannot (:func:`differences`)."""
    s, o, g = cfg.sampling, cfg.optim, cfg.generation
    data = {
        "trainer": {
            "algorithm": _algorithm(cfg), "train_batch_size": s.prompts_per_step,
            "policy_mini_batch_size": s.prompts_per_step // o.minibatches_per_epoch,
            "update_epochs_per_batch": o.epochs_per_batch,
            "micro_train_batch_size_per_gpu": o.micro_batch_size,
            "fully_async": {"enabled": cfg.system.mode == "async",
                            "max_staleness_steps": cfg.behaviour.max_staleness},
            "policy": {"model": {"path": cfg.model.path}, "optimizer_config": {
                "lr": o.lr, "weight_decay": o.weight_decay, "max_grad_norm": o.max_grad_norm,
                "scheduler": o.schedule, "num_warmup_steps": o.warmup_steps}},
        },
        "generator": {"n_samples_per_prompt": s.group_size, "sampling_params": {
            "max_generate_length": g.max_new_tokens, "temperature": g.temperature,
            "top_p": g.top_p}},
    }  # fmt: skip
    return yaml.safe_dump(data, sort_keys=False), differences(cfg)
