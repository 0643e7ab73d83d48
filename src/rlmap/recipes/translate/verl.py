"""verl's Hydra config → rlmap: the table, and its inverse for ``explain --as verl``.

Defaults are those of verl 0.9.1's ``verl/trainer/config/_generated_ppo_trainer.yaml``
(written ``G:line`` below); the research note ``TRANSLATE.md`` §1 has the reasoning.
A: ``actor_rollout_ref.actor.``, RO: ``actor_rollout_ref.rollout.``, ALG: ``algorithm.``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlmap.core.errors import ConfigError
from rlmap.recipes.config import RecipeConfig, read_yaml
from rlmap.recipes.translate import IMPLIED, Lookup, Mapped, Mapping, flatten, implied

A = "actor_rollout_ref.actor."
RO = "actor_rollout_ref.rollout."
ALG = "algorithm."
G = "verl 0.9.1 verl/trainer/config/_generated_ppo_trainer.yaml"

ESTIMATORS = {"gae": "gae", "grpo": "grpo", "grpo_vectorized": "grpo", "rloo": "rloo",
              "rloo_vectorized": "rloo", "reinforce_plus_plus": "reinforce_pp",
              "reinforce_plus_plus_baseline": "reinforce_pp_baseline"}  # fmt: skip
NO_ESTIMATOR = {"remax": "needs a greedy baseline rollout", "opo": "a length-weighted baseline",
                "grpo_passk": "credit to the top-1 only", "gpg": "scales by B/#nonzero",
                "optimal_token_baseline": "no such baseline in rlmap",
                "tir_optimal_token_baseline": "no such baseline in rlmap",
                "gdpo": "no such estimator in rlmap"}  # fmt: skip
LOSS_MODES = ("vanilla", "gspo", "sapo", "cispo", "gpg", "clip_cov", "kl_cov", "geo_mean", "dro",
              "dppo_tv", "dppo_kl")  # fmt: skip
KL_TYPES = {"kl": "k1", "k1": "k1", "mse": "k2", "k2": "k2", "low_var_kl": "k3", "k3": "k3"}


def _one_of(key: str, value: Any, known: Any) -> None:
    if value not in known:
        raise ConfigError(f"{key}: {value!r} is not a verl value (one of {', '.join(known)})")


def _estimator(value: Any, get: Lookup) -> Mapped:
    _one_of(ALG + "adv_estimator", value, [*ESTIMATORS, *NO_ESTIMATOR])
    if value in NO_ESTIMATOR:
        return Mapped({}, "none", f"{NO_ESTIMATOR[value]}; the closest preset's estimator is kept")
    name = ESTIMATORS[value]
    if name == "grpo" and not get(ALG + "norm_adv_by_std_in_grpo"):
        return Mapped({"credit.estimator": "dr_grpo"}, note="norm_adv_by_std_in_grpo=False")
    if name == "gae":
        return Mapped({"credit.estimator": "gae", "critic.enabled": True}, "approximate",
                      "verl whitens GAE advantages over the batch (core_algos.py "
                      "compute_gae_advantage_return); rlmap does not. Trap: verl's default "
                      "estimator is gae, i.e. critic PPO")  # fmt: skip
    if name.startswith("reinforce_pp"):
        return Mapped({"credit.estimator": name}, "approximate",
                      "verl whitens with the unbiased variance + 1e-8, rlmap the biased std + "
                      "1e-6: a factor N/(N-1) over the batch's tokens")  # fmt: skip
    std = {"credit.std_eps": 1e-6} if name == "grpo" else {}
    return Mapped({"credit.estimator": name, **std},
                  note="a singleton group gets A=R in verl, 0 in rlmap" if std else "")  # fmt: skip


def _std_norm(value: Any, get: Lookup) -> Mapped:
    return Mapped({}, note="read with adv_estimator (False with grpo: dr_grpo)")


def _field(name: str, note: str = "", kind: str = "exact") -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({name: value}, kind, note)

    return convert


def _loss_mode(value: Any, get: Lookup) -> Mapped:
    _one_of(A + "policy_loss.loss_mode", value, LOSS_MODES)
    if value == "vanilla":
        dual = get(A + "clip_ratio_c")
        return Mapped({"behaviour.objective": "ppo_clip", "behaviour.dual_clip": dual},
                      note="trap: vanilla always dual-clips A<0 at clip_ratio_c "
                      "(core_algos.py compute_policy_loss_vanilla)")  # fmt: skip
    forced = {"reduction.name": "response_mean", "reduction.max_len": None}
    if value == "gspo":
        return Mapped({"behaviour.objective": "gspo", "behaviour.gspo_token": True, **forced},
                      note="forces seq-mean-token-mean whatever loss_agg_mode says")  # fmt: skip
    if value == "sapo":
        return Mapped({"behaviour.objective": "sapo", **forced},
                      note="forces seq-mean-token-mean whatever loss_agg_mode says")  # fmt: skip
    if value in ("cispo", "gpg"):
        objective = "cispo" if value == "cispo" else "pg"
        return Mapped({"behaviour.objective": objective, "behaviour.dual_clip": None},
                      note="gpg: the objective only" if value == "gpg" else "")  # fmt: skip
    return Mapped({}, "none", f"rlmap has no {value} loss; the closest preset's objective is kept")


def _clip_c(value: Any, get: Lookup) -> Mapped:
    vanilla = get(A + "policy_loss.loss_mode") == "vanilla"
    return Mapped({}, note="behaviour.dual_clip (read with loss_mode)" if vanilla
                  else "unused by this loss_mode")  # fmt: skip


def _agg(value: Any, get: Lookup) -> Mapped:
    key = A + "loss_agg_mode"
    _one_of(key, value, ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm",
                         "seq-mean-token-sum", "token-sum"))  # fmt: skip
    if value == "token-mean":
        return Mapped({"reduction.name": "token_mean", "reduction.max_len": None},
                      note="trap: rlmap's grpo preset is response_mean")  # fmt: skip
    if value == "seq-mean-token-mean":
        return Mapped({"reduction.name": "response_mean", "reduction.max_len": None})
    if value == "seq-mean-token-sum-norm":
        scale = get(A + "loss_scale_factor")
        fields = {"reduction.name": "fixed_budget",
                  "reduction.max_len": scale or get("data.max_response_length")}  # fmt: skip
        if scale:
            return Mapped(fields)
        return Mapped(fields, "approximate", "loss_scale_factor unset: verl divides by the "
                      "micro-batch's padded width, which changes with packing")  # fmt: skip
    return Mapped({}, "none", "no length normalisation: rlmap has no token-sum reduction")


def _kl_loss(value: Any, get: Lookup) -> Mapped:
    in_reward = get(ALG + "use_kl_in_reward")
    if value and in_reward:
        return Mapped(
            {}, "none", "KL in the loss and in the reward at once: rlmap has one placement"
        )
    if not value:
        return Mapped({} if in_reward else {"kl.placement": "none", "kl.beta": 0.0},
                      note="trap: verl's default is no KL loss")  # fmt: skip
    kl_type = get(A + "kl_loss_type")
    if kl_type not in KL_TYPES:
        return Mapped({}, "none", f"kl_loss_type={kl_type}: rlmap has k1, k2, k3 only")
    return Mapped({"kl.placement": "loss", "kl.beta": get(A + "kl_loss_coef"),
                   "kl.estimator": KL_TYPES[kl_type]})  # fmt: skip


def _kl_in_reward(value: Any, get: Lookup) -> Mapped:
    if not value or get(A + "use_kl_loss"):
        return Mapped({}, note="" if not value else "see use_kl_loss")
    beta = get(ALG + "kl_ctrl.kl_coef")
    return Mapped({"kl.placement": "reward", "kl.estimator": "k1", "kl.beta": beta},
                  "approximate", "rlmap's outcome estimators (grpo, rloo) ignore an in-reward KL; "
                  "exact with gae or reinforce_pp")  # fmt: skip


def _read_with(other: str) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        return Mapped({}, note=f"read with {other}")

    return convert


def _minibatches(value: Any, get: Lookup) -> Mapped:
    batch = get("data.train_batch_size")
    if not value or batch % value:
        raise ConfigError(
            f"{A}ppo_mini_batch_size: {value} does not divide data.train_batch_size {batch}"
        )
    return Mapped({"optim.minibatches_per_epoch": batch // value},
                  note=f"trap: {batch}/{value} = {batch // value} updates a batch")  # fmt: skip


def _warmup(value: Any, get: Lookup) -> Mapped:
    per_step = get(A + "ppo_epochs") * (
        get("data.train_batch_size") // get(A + "ppo_mini_batch_size")
    )
    steps = max(int(value), 0) * per_step
    if steps == 0:
        return Mapped({"optim.warmup_steps": 0}, note="no warm-up")
    return Mapped({"optim.warmup_steps": steps}, "approximate",
                  f"verl steps its scheduler once per training step, rlmap once per optimiser "
                  f"step: {value} × {per_step}")  # fmt: skip


def _schedule(value: Any, get: Lookup) -> Mapped:
    _one_of(A + "optim.lr_scheduler_type", value, ("constant", "cosine"))
    if value == "constant":
        return Mapped({"optim.schedule": "constant"})
    return Mapped({"optim.schedule": "cosine"}, "approximate", "verl's min_lr_ratio and num_cycles")


def _zero_or_none(what: str, neutral: tuple[Any, ...]) -> Any:
    def convert(value: Any, get: Lookup) -> Mapped:
        if value in neutral:
            return Mapped({}, note="off: needs nothing")
        return Mapped({}, "none", what)

    return convert


def _filter(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"sampling.filter": "none"})
    metric = get(ALG + "filter_groups.metric")
    rounds = get(ALG + "filter_groups.max_num_gen_batches")
    fields = {"sampling.filter": "mixed", **({"sampling.max_rounds": rounds} if rounds > 0 else {})}
    why = "" if metric == "acc" else f"metric={metric} includes shaping; "
    return Mapped(fields, "approximate", why + "verl keeps single-trajectory groups, rlmap drops "
                  "them; max_num_gen_batches ≤ 0 (unbounded) keeps rlmap's finite cap")  # fmt: skip


OVERLONG = "reward.reward_kwargs.overlong_buffer_cfg."


def _overlong(value: Any, get: Lookup) -> Mapped:
    if not value:
        return Mapped({"feedback.overlong_cache": None})
    factor = get(OVERLONG + "penalty_factor")
    if factor != 1.0:
        return Mapped({}, "none", f"penalty_factor={factor}: rlmap's overlong term has factor 1")
    return Mapped({"feedback.overlong_cache": get(OVERLONG + "len")}, "approximate",
                  "verl's DAPO reward is ±1, rlmap's exact_match 0/1: the overlong penalty "
                  "weighs 2× more in rlmap")  # fmt: skip


BEHAVIOUR = {"behaviour.mode": "decoupled", "behaviour.corrections": [],
             "behaviour.positive_nll": 0.0, "system.mode": "sync"}  # fmt: skip


TABLE: tuple[Mapping, ...] = (
    Mapping(
        IMPLIED + "behaviour policy",
        implied(BEHAVIOUR, "π_old recomputed by the actor, no rollout correction, synchronous"),
        "decoupled",
        f"{G} (rollout_correction: null)",
    ),
    Mapping(
        OVERLONG + "len",
        _read_with(OVERLONG + "enable"),
        0,
        "verl-recipe dapo/config/dapo_trainer.yaml",
    ),
    Mapping(
        OVERLONG + "penalty_factor",
        _read_with(OVERLONG + "enable"),
        0.0,
        "verl-recipe dapo/config/dapo_trainer.yaml",
    ),
    Mapping(OVERLONG + "enable", _overlong, False, "verl-recipe dapo/config/dapo_trainer.yaml"),
    Mapping(ALG + "adv_estimator", _estimator, "gae", f"{G}:861"),
    Mapping(ALG + "norm_adv_by_std_in_grpo", _std_norm, True, f"{G}:862"),
    Mapping(ALG + "gamma", _field("credit.gamma"), 1.0, f"{G}:859"),
    Mapping(ALG + "lam", _field("credit.lam", "trap: rlmap's default is 0.95"), 1.0, f"{G}:860"),
    Mapping(
        RO + "n",
        _field("sampling.group_size", "trap: 1 by default"),
        1,
        "verl 0.9.1 verl/trainer/config/rollout/rollout.yaml (n)",
    ),
    Mapping("data.train_batch_size", _field("sampling.prompts_per_step"), 1024, f"{G}:506"),
    Mapping(A + "ppo_mini_batch_size", _minibatches, 256, f"{G}:80"),
    Mapping(A + "ppo_epochs", _field("optim.epochs_per_batch"), 1, f"{G}:111"),
    Mapping(A + "ppo_micro_batch_size_per_gpu", _field("optim.micro_batch_size"), None, f"{G}"),
    Mapping(A + "clip_ratio_low", _field("behaviour.clip_low"), 0.2, f"{G}:86"),
    Mapping(A + "clip_ratio_high", _field("behaviour.clip_high"), 0.2, f"{G}:87"),
    Mapping(A + "clip_ratio_c", _clip_c, 3.0, f"{G}:100"),
    Mapping(A + "loss_scale_factor", _read_with(A + "loss_agg_mode"), None, f"{G}"),
    Mapping(A + "loss_agg_mode", _agg, "token-mean", f"{G}:101"),
    Mapping(A + "policy_loss.loss_mode", _loss_mode, "vanilla", f"{G}:93"),
    Mapping(
        A + "entropy_coeff",
        _zero_or_none("rlmap has no entropy bonus", (0, 0.0)),
        0,
        f"{G}:103",
    ),
    Mapping(A + "kl_loss_coef", _read_with(A + "use_kl_loss"), 0.001, f"{G}:109"),
    Mapping(A + "kl_loss_type", _read_with(A + "use_kl_loss"), "low_var_kl", f"{G}:110"),
    Mapping(ALG + "kl_ctrl.kl_coef", _read_with(ALG + "use_kl_in_reward"), 0.001, f"{G} (kl_ctrl)"),
    Mapping(A + "use_kl_loss", _kl_loss, False, f"{G}:106"),
    Mapping(ALG + "use_kl_in_reward", _kl_in_reward, False, f"{G}:869"),
    Mapping(
        ALG + "filter_groups.metric",
        _read_with(ALG + "filter_groups.enable"),
        "reward",
        f"{G}:866",
    ),
    Mapping(
        ALG + "filter_groups.max_num_gen_batches",
        _read_with(ALG + "filter_groups.enable"),
        0,
        f"{G}:867",
    ),
    Mapping(ALG + "filter_groups.enable", _filter, False, f"{G}:865"),
    Mapping("data.max_response_length", _field("generation.max_new_tokens"), 512, f"{G}:505"),
    Mapping(
        "data.max_prompt_length",
        _zero_or_none("a data filter, not a run setting", ()),
        512,
        f"{G}:504",
    ),
    Mapping(RO + "temperature", _field("generation.temperature"), 1.0, f"{G}:297"),
    Mapping(RO + "top_p", _field("generation.top_p"), 1.0, f"{G}:299"),
    Mapping(RO + "top_k", _zero_or_none("rlmap has no top_k", (-1, 0)), -1, f"{G}:298"),
    Mapping(A + "optim.lr", _field("optim.lr"), 1e-6, f"{G}:12"),
    Mapping(
        A + "optim.weight_decay",
        _field("optim.weight_decay", "trap: rlmap's default is 0"),
        0.01,
        f"{G}:15",
    ),
    Mapping(A + "optim.lr_warmup_steps", _warmup, -1, f"{G}:16"),
    Mapping(A + "optim.lr_scheduler_type", _schedule, "constant", f"{G}:23"),
    Mapping(A + "optim.clip_grad", _field("optim.max_grad_norm"), 1.0, f"{G}:20"),
    Mapping("critic.optim.lr", _field("optim.critic_lr"), None, f"{G}:539"),
    Mapping("critic.cliprange_value", _field("critic.value_clip"), None, f"{G}:617"),
    Mapping(
        "actor_rollout_ref.model.path",
        _field("model.path", "the source's model"),
        None,
        f"{G}:436",
    ),
    Mapping("trainer.total_training_steps", _field("optim.steps"), None, f"{G}:541"),
)
"""The rows, in the order they apply (a later row's fields win: loss_mode after
loss_agg_mode, because gspo and sapo force their own reduction)."""


def table(world_size: int = 1) -> tuple[Mapping, ...]:
    """The table (its rows do not depend on the number of processes)."""
    return TABLE


def read(path: Path) -> dict[str, Any]:
    """A verl YAML (a run's resolved config or a recipe) as flat dotted keys."""
    return flatten(read_yaml(path))


LOSS_MODE = {"ppo_clip": "vanilla", "gspo": "gspo", "sapo": "sapo", "cispo": "cispo", "pg": "gpg"}
AGG = {"token_mean": "token-mean", "response_mean": "seq-mean-token-mean",
       "fixed_budget": "seq-mean-token-sum-norm"}  # fmt: skip


def differences(cfg: RecipeConfig) -> list[str]:
    """What verl's settings cannot reproduce of ``cfg``, one line each."""
    b, r, s, c = cfg.behaviour, cfg.reduction, cfg.sampling, cfg.credit
    checks = [
        (c.estimator not in {*ESTIMATORS.values(), "dr_grpo"},
         f"credit.estimator={c.estimator}: no verl estimator"),
        (b.objective not in LOSS_MODE, f"behaviour.objective={b.objective}: no verl loss_mode"),
        (b.objective == "ppo_clip" and b.dual_clip is None,
         "behaviour.dual_clip=None: verl's vanilla loss always dual-clips (c=3)"),
        ((b.objective == "gspo" and not b.gspo_token)
         or (b.objective in ("gspo", "sapo") and r.name != "response_mean"),
         f"{b.objective}: verl forces seq-mean-token-mean (and token-level GSPO)"),
        (r.name not in AGG, f"reduction.name={r.name}: no verl loss_agg_mode"),
        (bool(b.corrections) or b.mode != "decoupled",
         "behaviour.corrections / mode: not written (see TRANSLATE.md §1)"),
        (s.filter not in ("none", "mixed"), f"sampling.filter={s.filter}: verl filters mixed only"),
        (cfg.feedback.overlong_cache is not None,
         "feedback.overlong_cache: verl's DAPO reward is ±1, rlmap's 0/1 (penalty weighs 2×)"),
        (c.lam_critic is not None or c.adaptive_alpha is not None, "credit: verl has one λ"),
        (cfg.optim.warmup_steps > 0, "optim.warmup_steps: verl counts training steps"),
    ]  # fmt: skip
    return [text for failed, text in checks if failed]


def _actor(cfg: RecipeConfig) -> dict[str, Any]:
    b, k, r, o = cfg.behaviour, cfg.kl, cfg.reduction, cfg.optim
    actor: dict[str, Any] = {
        "clip_ratio_low": b.clip_low, "clip_ratio_high": b.clip_high,
        "clip_ratio_c": b.dual_clip or 3.0, "loss_agg_mode": AGG.get(r.name, "token-mean"),
        "policy_loss": {"loss_mode": LOSS_MODE.get(b.objective, "vanilla")},
        "use_kl_loss": k.placement == "loss", "kl_loss_coef": k.beta,
        "kl_loss_type": {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}[k.estimator],
        "ppo_mini_batch_size": cfg.sampling.prompts_per_step // o.minibatches_per_epoch,
        "ppo_epochs": o.epochs_per_batch,
        "optim": {"lr": o.lr, "weight_decay": o.weight_decay, "clip_grad": o.max_grad_norm,
                  "lr_scheduler_type": o.schedule, "lr_warmup_steps": o.warmup_steps},
    }  # fmt: skip
    if r.max_len is not None:
        actor["loss_scale_factor"] = r.max_len
    return actor


def inverse(cfg: RecipeConfig) -> tuple[str, list[str]]:
    """verl YAML that reproduces ``cfg``, and what it cannot (:func:`differences`)."""
    k, s, c, g = cfg.kl, cfg.sampling, cfg.credit, cfg.generation
    adv = {v: key for key, v in reversed(ESTIMATORS.items())}.get(c.estimator, "grpo")
    overlong = cfg.feedback.overlong_cache
    data: dict[str, Any] = {
        "data": {"train_batch_size": s.prompts_per_step, "max_response_length": g.max_new_tokens},
        "actor_rollout_ref": {
            "model": {"path": cfg.model.path}, "actor": _actor(cfg),
            "rollout": {"n": s.group_size, "temperature": g.temperature, "top_p": g.top_p}},
        "algorithm": {
            "adv_estimator": adv, "norm_adv_by_std_in_grpo": c.estimator != "dr_grpo",
            "gamma": c.gamma, "lam": c.lam, "use_kl_in_reward": k.placement == "reward",
            "kl_ctrl": {"kl_coef": k.beta},
            "filter_groups": {"enable": s.filter == "mixed", "metric": "acc",
                              "max_num_gen_batches": s.max_rounds}},
        "reward": {"reward_kwargs": {"overlong_buffer_cfg": {
            "enable": overlong is not None, "len": overlong or 0, "penalty_factor": 1.0}}},
        "trainer": {"total_training_steps": cfg.optim.steps},
    }  # fmt: skip
    if cfg.critic.enabled:
        data["critic"] = {"optim": {"lr": cfg.optim.critic_lr},
                          "cliprange_value": cfg.critic.value_clip}  # fmt: skip
    return yaml.safe_dump(data, sort_keys=False), differences(cfg)
