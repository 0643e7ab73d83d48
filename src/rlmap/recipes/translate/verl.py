"""verl's Hydra config → rlmap: the table (its rows in :mod:`.verl_rows` and
:mod:`.verl_loss`; its inverse for ``explain --as verl`` in :mod:`.verl_inverse`).

Defaults are those of verl 0.9.1's ``verl/trainer/config/_generated_ppo_trainer.yaml``
(written ``G:line`` below), read from the PyPI wheel ``verl-0.9.1-py3-none-any.whl``; the
losses, the rollout correction and the advantage code from the same wheel
(``verl/trainer/ppo/core_algos.py``, ``verl/trainer/ppo/rollout_corr_helper.py``,
``verl/trainer/ppo/ray_trainer.py``). ``TRANSLATE.md`` §1 has the reasoning.
A: ``actor_rollout_ref.actor.``, RO: ``actor_rollout_ref.rollout.``, ALG: ``algorithm.``,
RC: ``algorithm.rollout_correction.``, G: the generated defaults' file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlmap.recipes.translate import flatten
from rlmap.recipes.translate.rows import (
    IMPLIED,
    NO_ENTROPY,
    NO_TOP_K,
    NULL,
    Mapping,
    betas,
    field,
    implied,
    minibatches,
    off,
    read_with,
)
from rlmap.recipes.translate.verl_loss import (
    agg,
    bypass_mode,
    clip,
    clip_c,
    loss_mode,
    rollout_is,
    rollout_rs,
)
from rlmap.recipes.translate.verl_rows import (
    ALG,
    OVERLONG,
    RC,
    RO,
    A,
    G,
    estimator,
    filter_groups,
    kl_in_reward,
    kl_loss,
    overlong,
    reward_model,
    schedule,
    std_norm,
    warmup,
)
from rlmap.runs.rundir import read_yaml

BEHAVIOUR = {
    "behaviour.mode": "decoupled",
    "behaviour.corrections": [],
    "behaviour.positive_nll": 0.0,
    "system.mode": "sync",
}


TABLE: tuple[Mapping, ...] = (
    Mapping(
        IMPLIED + "behaviour policy",
        implied(BEHAVIOUR, "π_old recomputed by the actor, no rollout correction, synchronous"),
        "decoupled",
        f"{G} (rollout_correction: null)",
    ),
    Mapping(
        OVERLONG + "len",
        read_with(OVERLONG + "enable"),
        0,
        "verl-recipe dapo/config/dapo_trainer.yaml",
    ),
    Mapping(
        OVERLONG + "penalty_factor",
        read_with(OVERLONG + "enable"),
        0.0,
        "verl-recipe dapo/config/dapo_trainer.yaml",
    ),
    Mapping(OVERLONG + "enable", overlong, False, "verl-recipe dapo/config/dapo_trainer.yaml"),
    Mapping("reward.reward_model.enable", reward_model, False, f"{G}:793"),
    Mapping(ALG + "adv_estimator", estimator, "gae", f"{G}:861"),
    Mapping(ALG + "norm_adv_by_std_in_grpo", std_norm, True, f"{G}:862"),
    Mapping(ALG + "gamma", field("credit.gamma"), 1.0, f"{G}:859"),
    Mapping(ALG + "lam", field("credit.lam", "trap: rlmap's default is 0.95"), 1.0, f"{G}:860"),
    Mapping(
        RO + "n",
        field("sampling.group_size", "trap: 1 by default"),
        1,
        "verl 0.9.1 verl/trainer/config/rollout/rollout.yaml:127",
    ),
    Mapping("data.train_batch_size", field("sampling.prompts_per_step"), 1024, f"{G}:506"),
    Mapping(A + "ppo_mini_batch_size", minibatches("data.train_batch_size"), 256, f"{G}:80"),
    Mapping(A + "ppo_epochs", field("optim.epochs_per_batch"), 1, f"{G}:111"),
    Mapping(A + "ppo_micro_batch_size_per_gpu", field("optim.micro_batch_size"), None, f"{G}:82"),
    Mapping(A + "clip_ratio_low", clip("behaviour.clip_low"), 0.2, f"{G}:86"),
    Mapping(A + "clip_ratio_high", clip("behaviour.clip_high"), 0.2, f"{G}:87"),
    Mapping(A + "clip_ratio_c", clip_c, 3.0, f"{G}:100"),
    Mapping(A + "tau_pos", read_with(A + "policy_loss.loss_mode"), 1.0, f"{G}:88"),
    Mapping(A + "tau_neg", read_with(A + "policy_loss.loss_mode"), 1.05, f"{G}:89"),
    Mapping(A + "policy_loss.dro_beta", read_with(A + "policy_loss.loss_mode"), NULL, f"{G}:99"),
    Mapping(A + "loss_scale_factor", read_with(A + "loss_agg_mode"), None, f"{G}:102"),
    Mapping(A + "loss_agg_mode", agg, "token-mean", f"{G}:101"),
    Mapping(A + "policy_loss.loss_mode", loss_mode, "vanilla", f"{G}:93"),
    Mapping(A + "entropy_coeff", off(NO_ENTROPY, (0, 0.0)), 0, f"{G}:103"),
    Mapping(A + "kl_loss_coef", read_with(A + "use_kl_loss"), 0.001, f"{G}:109"),
    Mapping(A + "kl_loss_type", read_with(A + "use_kl_loss"), "low_var_kl", f"{G}:110"),
    Mapping(ALG + "kl_penalty", read_with(ALG + "use_kl_in_reward"), "kl", f"{G}:870"),
    Mapping(ALG + "kl_ctrl.type", read_with(ALG + "use_kl_in_reward"), "fixed", f"{G}:873"),
    Mapping(ALG + "kl_ctrl.kl_coef", read_with(ALG + "use_kl_in_reward"), 0.001, f"{G}:874"),
    Mapping(ALG + "kl_ctrl.horizon", read_with(ALG + "use_kl_in_reward"), 10000, f"{G}:875"),
    Mapping(ALG + "kl_ctrl.target_kl", read_with(ALG + "use_kl_in_reward"), 0.1, f"{G}:876"),
    Mapping(A + "use_kl_loss", kl_loss, False, f"{G}:106"),
    Mapping(ALG + "use_kl_in_reward", kl_in_reward, False, f"{G}:869"),
    Mapping(
        ALG + "filter_groups.metric", read_with(ALG + "filter_groups.enable"), "reward", f"{G}:866"
    ),
    Mapping(
        ALG + "filter_groups.max_num_gen_batches",
        read_with(ALG + "filter_groups.enable"),
        0,
        f"{G}:867",
    ),
    Mapping(ALG + "filter_groups.enable", filter_groups, False, f"{G}:865"),
    Mapping(RC + "rollout_is_threshold", read_with(RC + "rollout_is"), 2.0, f"{G}:852"),
    Mapping(RC + "rollout_is", rollout_is, NULL, f"{G}:851"),
    Mapping(RC + "rollout_rs_threshold", read_with(RC + "rollout_rs"), NULL, f"{G}:854"),
    Mapping(RC + "rollout_rs", rollout_rs, NULL, f"{G}:853"),
    Mapping(
        RC + "rollout_is_batch_normalize",
        off("IS weights normalised to mean 1 over the batch: no rlmap correction", (False,)),
        False,
        f"{G}:857",
    ),
    Mapping(RC + "loss_type", read_with(RC + "bypass_mode"), "ppo_clip", f"{G}:856"),
    Mapping(RC + "bypass_mode", bypass_mode, False, f"{G}:855"),
    Mapping("data.max_response_length", field("generation.max_new_tokens"), 512, f"{G}:505"),
    Mapping("data.max_prompt_length", off("a data filter, not a run setting", ()), 512, f"{G}:504"),
    Mapping(RO + "temperature", field("generation.temperature"), 1.0, f"{G}:297"),
    Mapping(RO + "top_p", field("generation.top_p"), 1.0, f"{G}:299"),
    Mapping(RO + "top_k", off(NO_TOP_K, (-1, 0)), -1, f"{G}:298"),
    Mapping(A + "optim.lr", field("optim.lr"), 1e-6, f"{G}:12"),
    Mapping(
        A + "optim.weight_decay",
        field("optim.weight_decay", "trap: rlmap's default is 0"),
        0.01,
        f"{G}:15",
    ),
    Mapping(A + "optim.betas", betas, [0.9, 0.999], f"{G}:17-19"),
    Mapping(A + "optim.lr_warmup_steps", warmup, -1, f"{G}:16"),
    Mapping(A + "optim.lr_scheduler_type", schedule, "constant", f"{G}:23"),
    Mapping(A + "optim.clip_grad", field("optim.max_grad_norm"), 1.0, f"{G}:20"),
    Mapping("critic.optim.lr", field("optim.critic_lr"), None, f"{G}:539"),
    Mapping("critic.cliprange_value", field("critic.value_clip"), None, f"{G}:617"),
    Mapping(
        "actor_rollout_ref.model.path", field("model.path", "the source's model"), None, f"{G}:436"
    ),
    Mapping("trainer.total_training_steps", field("optim.steps"), None, f"{G}:952"),
)
"""The rows, in the order they apply (a later row's fields win: loss_mode after
loss_agg_mode, because gspo and sapo force their own reduction; bypass_mode last of the
behaviour rows, because it replaces the loss)."""


def table(world_size: int = 1, flat: dict[str, Any] | None = None) -> tuple[Mapping, ...]:
    """The table (its rows depend neither on the number of processes nor on the file)."""
    return TABLE


def read(path: Path) -> dict[str, Any]:
    """A verl YAML (a run's resolved config or a recipe) as flat dotted keys."""
    return flatten(read_yaml(path))
