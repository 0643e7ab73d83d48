"""``rlmap translate`` and ``rlmap explain --as``: the research note's five examples and more
files per framework translate to hand-derived rlmap fields; the approximate and "none"
rows of each are exactly the expected ones, each with its reason; silent defaults are rows
too; explain --as → translate gives back the composition of every preset a framework can
express (the others name why not); and every example trains on the embedded default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmap.cli import main
from rlmap.core.errors import ConfigError
from rlmap.recipes import composition, preset, registry
from rlmap.recipes.translate import (
    FRAMEWORKS,
    Translation,
    detect,
    differences_as,
    explain_as,
    inverse_of,
    translate,
)

EXAMPLES = Path(__file__).parent / "translate_examples"
WORLD = {"trl_dr_grpo.yaml": 8}
"""Processes a TRL example ran on (its batch sizes count per device)."""
NOTE_EXAMPLES = (
    "verl_grpo.yaml",
    "verl_dapo.yaml",
    "trl_dr_grpo.yaml",
    "openrlhf_ppo.sh",
    "prime_rl_reverse_text.toml",
)
"""TRANSLATE.md's Ex. 1–5."""
ALL = sorted(p.name for p in EXAMPLES.iterdir())


def _kinds(t: Translation, kind: str) -> set[str]:
    return {row.key for row in t.rows if row.kind == kind}


def _row(t: Translation, key: str) -> tuple[str, bool]:
    (row,) = [r for r in t.rows if r.key == key]
    return row.kind, row.given


def _load(name: str, to_embedded: bool = False) -> Translation:
    return translate(
        EXAMPLES / name, "auto", to_embedded=to_embedded, world_size=WORLD.get(name, 1)
    )


def test_every_framework_has_the_note_example_and_one_more() -> None:
    assert set(NOTE_EXAMPLES) <= set(ALL)
    frameworks = [detect(EXAMPLES / name) for name in ALL]
    assert {fw: frameworks.count(fw) >= 2 for fw in FRAMEWORKS} == dict.fromkeys(FRAMEWORKS, True)


@pytest.mark.parametrize("name", ALL)
def test_every_approximation_and_gap_names_its_reason(name: str) -> None:
    t = _load(name)
    for row in t.rows:
        if row.kind in ("approximate", "none"):
            assert row.note.strip(), f"{name}: {row.key} has no reason"


# ---- verl --------------------------------------------------------------------------------


def test_verl_grpo_example() -> None:
    """TRANSLATE.md Ex. 1: verl's defaults decide half the run."""
    t = _load("verl_grpo.yaml")
    c = t.config
    assert t.framework == "verl" and t.data["recipe"] == "grpo"
    assert (c.credit.estimator, c.credit.std_eps, c.credit.lam) == ("grpo", 1e-6, 1.0)
    assert (c.sampling.group_size, c.sampling.prompts_per_step) == (5, 1024)
    # vanilla always dual-clips at clip_ratio_c, whose default is 3.0
    assert (
        c.behaviour.objective,
        c.behaviour.clip_low,
        c.behaviour.clip_high,
        c.behaviour.dual_clip,
    ) == ("ppo_clip", 0.2, 0.2, 3.0)
    assert (c.behaviour.mode, c.behaviour.corrections) == ("decoupled", ())
    assert (c.kl.placement, c.kl.estimator, c.kl.beta) == ("loss", "k3", 0.001)
    assert c.reduction.name == "token_mean"  # verl's default, not the grpo preset's
    assert (c.feedback.source, c.generation.max_new_tokens) == ("verifier", 2048)
    # 1024 prompts / 256 per mini-batch = 4 optimiser steps per batch
    assert (c.optim.lr, c.optim.weight_decay, c.optim.minibatches_per_epoch) == (1e-6, 0.01, 4)
    assert (c.optim.adam_betas, c.optim.schedule) == ((0.9, 0.999), "constant")
    assert c.model.path == "Qwen/Qwen3-8B"
    assert _row(t, "actor_rollout_ref.actor.clip_ratio_c") == ("exact", False)
    assert _row(t, "actor_rollout_ref.actor.loss_agg_mode") == ("exact", False)
    assert _kinds(t, "approximate") == set()
    assert _kinds(t, "none") == {"data.max_prompt_length"}


def test_verl_dapo_example() -> None:
    """TRANSLATE.md Ex. 2: overlong shaping, the group filter and warm-up are approximate."""
    t = _load("verl_dapo.yaml")
    c = t.config
    assert t.data["recipe"] == "dapo"
    assert (c.feedback.overlong_cache, c.sampling.filter, c.sampling.max_rounds) == (
        4096,
        "mixed",
        10,
    )
    assert (c.behaviour.clip_high, c.behaviour.dual_clip) == (0.28, 10.0)
    assert (c.kl.placement, c.kl.beta) == ("none", 0.0)
    # 512 / 32 = 16 optimiser steps per batch; 10 warm-up training steps × 16 = 160
    assert (c.optim.minibatches_per_epoch, c.optim.warmup_steps) == (16, 160)
    assert (c.optim.weight_decay, c.reduction.name) == (0.1, "token_mean")
    assert c.sampling.group_size == 16 and c.generation.max_new_tokens == 20480
    assert _kinds(t, "approximate") == {
        "reward.reward_kwargs.overlong_buffer_cfg.enable",
        "algorithm.filter_groups.enable",
        "actor_rollout_ref.actor.optim.lr_warmup_steps",
    }
    assert _kinds(t, "none") == {"data.max_prompt_length"}
    assert _kinds(t, "not read") == {"data.gen_batch_size"}


def test_verl_gspo_recipe_with_interpolations() -> None:
    """Written for the tests: ``${data.train_batch_size}`` and ``${oc.select:…,2e-6}`` are
    resolved; gspo forces a per-response mean whatever loss_agg_mode says."""
    t = _load("verl_gspo.yaml")
    c = t.config
    assert t.framework == "verl"
    assert c.optim.minibatches_per_epoch == 1  # 64 / ${data.train_batch_size}=64
    assert c.optim.lr == 2e-6  # oc.select's fallback: the key is absent
    assert (c.behaviour.objective, c.behaviour.gspo_token) == ("gspo", True)
    assert (c.behaviour.clip_low, c.behaviour.clip_high) == (0.0003, 0.0004)
    assert c.reduction.name == "response_mean"
    assert c.credit.estimator == "dr_grpo"  # norm_adv_by_std_in_grpo: false
    assert c.kl.placement == "none"  # use_kl_loss defaults to False
    assert _kinds(t, "approximate") == set()
    assert _kinds(t, "none") == {"data.max_prompt_length"}


def test_verl_rollout_correction_kl_in_reward_dro() -> None:
    """Written for the tests: rollout_is token → TIS at 3; rollout_rs seq_mean_k1 "0.5_4.0"
    → masked_is; the adaptive in-reward KL; dro; seq-mean-token-sum; Adam betas."""
    t = _load("verl_rollout_correction.yaml")
    c, b = t.config, t.config.behaviour
    assert (c.credit.estimator, c.critic.enabled) == ("rloo", False)
    assert (c.kl.placement, c.kl.estimator, c.kl.beta, c.kl.target, c.kl.horizon) == (
        "reward",
        "k1",
        0.002,
        0.05,
        5000,
    )
    assert (b.corrections, b.tis_level, b.tis_cap) == (("tis", "masked_is"), "token", 3.0)
    # verl keeps −mean log κ in [log 0.5, log 4], i.e. the geometric-mean κ in [1/4, 1/0.5]
    assert (b.masked_is_low, b.masked_is_high) == (0.25, 2.0)
    assert (b.objective, b.dro_beta, b.mode) == ("dro", 0.1, "decoupled")
    assert c.reduction.name == "seq_mean_token_sum"
    # 32 prompts / 16 per mini-batch = 2 optimiser steps per batch
    assert (c.sampling.group_size, c.sampling.prompts_per_step) == (4, 32)
    assert (c.optim.minibatches_per_epoch, c.optim.lr, c.optim.adam_betas) == (2, 5e-7, (0.9, 0.95))
    assert (c.generation.top_p, c.generation.max_new_tokens) == (0.9, 256)
    assert _row(t, "algorithm.rollout_correction.rollout_is") == ("exact", True)
    assert _kinds(t, "approximate") == {"algorithm.rollout_correction.rollout_rs"}
    assert _kinds(t, "none") == {"data.max_prompt_length"}


def test_verl_bypass_replaces_the_loss_and_a_bad_threshold_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bypass.yaml"
    path.write_text(
        "actor_rollout_ref:\n  actor:\n    policy_loss: {loss_mode: gspo}\n"
        "  rollout: {n: 4}\n"
        "algorithm:\n  adv_estimator: grpo\n"
        "  rollout_correction: {bypass_mode: true}\n"
    )
    b = translate(path, "verl").config.behaviour
    # bypass_mode sets loss_mode=bypass_mode: vanilla PPO on π_θ/μ, dual-clipped at 3
    assert (b.mode, b.objective, b.dual_clip) == ("bypass", "ppo_clip", 3.0)
    path.write_text(
        "actor_rollout_ref: {rollout: {n: 4}}\nalgorithm:\n  adv_estimator: grpo\n"
        "  rollout_correction:\n"
        "    rollout_is: token\n    rollout_is_threshold: two\n"
    )
    with pytest.raises(ConfigError, match=r"rollout_correction\.rollout_is_threshold: 'two'"):
        translate(path, "verl")


# ---- TRL ---------------------------------------------------------------------------------


def test_trl_dr_grpo_example() -> None:
    """TRANSLATE.md Ex. 3 on 8 processes: dr_grpo is a reduction only in TRL."""
    t = _load("trl_dr_grpo.yaml")
    c = t.config
    # 8 completions per device × 8 processes × 4 accumulation steps / G=8 = 32 prompts
    assert (c.sampling.group_size, c.sampling.prompts_per_step) == (8, 32)
    assert (c.reduction.name, c.reduction.max_len) == ("fixed_budget", 1024)
    assert (c.credit.estimator, c.credit.std_eps) == ("grpo", 1e-4)  # scale_rewards="group"
    assert (c.kl.placement, c.kl.beta) == ("none", 0.0)  # beta defaults to 0
    assert (c.behaviour.clip_high, c.behaviour.dual_clip) == (0.2, None)
    assert (c.behaviour.corrections, c.behaviour.tis_level, c.behaviour.tis_cap) == (
        ("tis",),
        "sequence",
        3.0,
    )
    assert (c.optim.micro_batch_size, c.optim.minibatches_per_epoch) == (8, 1)
    assert c.optim.schedule == "linear"  # transformers' default, decaying to 0
    # sequence_mask ≈ sequence TIS; linear decays over the data's epochs (max_steps unset)
    assert _kinds(t, "approximate") == {"use_vllm", "lr_scheduler_type"}
    assert _row(t, "lr_scheduler_type") == ("approximate", False)
    assert _kinds(t, "none") == set()
    assert _kinds(t, "not read") == {"vllm_mode"}


def test_trl_grpo_json() -> None:
    """Written for the tests (JSON): scale_rewards=none is dr_grpo's advantage; loss_type=grpo
    is the per-response mean; beta turns on TRL's bias-corrected k3 (k3 × π_θ/π_old)."""
    t = _load("trl_grpo.json")
    c = t.config
    assert t.framework == "trl"
    assert (c.credit.estimator, c.reduction.name) == ("dr_grpo", "response_mean")
    assert (c.kl.placement, c.kl.estimator, c.kl.beta) == ("loss", "k3_iw", 0.04)
    assert (c.behaviour.clip_low, c.behaviour.clip_high) == (0.2, 0.28)
    assert c.sampling.prompts_per_step == 4  # 16 completions × 1 process × 1 step / G=4
    assert c.optim.schedule == "constant" and c.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert _kinds(t, "none") == {"top_k"}
    assert _kinds(t, "approximate") == set()


def test_trl_rloo_config() -> None:
    """Written for the tests: normalize_advantages says RLOOConfig. Its defaults: G=2 (here
    4), β=0.05 in the reward; its loss clips the product ratio per sequence."""
    t = _load("trl_rloo.yaml")
    c = t.config
    assert t.framework == "trl"
    assert (c.credit.estimator, c.critic.enabled) == ("rloo", False)
    assert (c.kl.placement, c.kl.estimator, c.kl.beta) == ("reward", "k1", 0.05)
    assert (c.behaviour.objective, c.behaviour.gspo_token) == ("gspo", False)
    assert (c.behaviour.clip_low, c.behaviour.clip_high) == (0.2, 0.2)
    assert c.reduction.name == "seq_mean_token_sum"
    # 8 per device × 1 process × 2 steps_per_generation = 16 completions / G=4 = 4 prompts;
    # 2 steps / 1 accumulation = 2 mini-batches; max_steps 100 optimiser steps / 2 = 50
    assert (c.sampling.group_size, c.sampling.prompts_per_step) == (4, 4)
    assert (c.optim.minibatches_per_epoch, c.optim.steps) == (2, 50)
    assert (c.optim.schedule, c.optim.adam_betas) == ("linear", (0.9, 0.95))
    assert _row(t, "beta") == ("exact", False)
    assert _row(t, "max_steps") == ("exact", True)
    # two updates a batch: the product ratio's clip is not the geometric mean's
    assert _kinds(t, "approximate") == {"(no key) RLOOTrainer"}
    assert _kinds(t, "none") == set()


def test_trl_rloo_one_update_is_exact_and_trainers_are_told_apart(tmp_path: Path) -> None:
    path = tmp_path / "rloo.yaml"
    path.write_text("trainer: rloo\nnum_generations: 4\n")
    t = translate(path, "trl")
    assert _row(t, "(no key) RLOOTrainer") == ("exact", False)  # one update: ratio ≡ 1
    assert t.config.sampling.prompts_per_step == 2  # 8 per device / G=4
    path.write_text("trainer: rloo\nloss_type: grpo\n")
    with pytest.raises(ConfigError, match="loss_type: not a field of TRL's RLOOConfig"):
        translate(path, "trl")
    path.write_text("loss_type: grpo\nnormalize_advantages: true\n")
    with pytest.raises(ConfigError, match=r"loss_type: a GRPOConfig field .* trainer: grpo\|rloo"):
        translate(path, "auto")


def test_trl_silent_defaults_are_rows(tmp_path: Path) -> None:
    """A GRPOConfig that names only G: TRL's defaults decide the rest, and each is a row."""
    path = tmp_path / "grpo.yaml"
    path.write_text("num_generations: 4\n")
    t = translate(path, "auto")
    c = t.config
    assert c.reduction.name == "token_mean"  # loss_type defaults to dapo, not grpo
    assert (c.kl.placement, c.kl.beta) == ("none", 0.0)  # beta defaults to 0
    assert (c.credit.estimator, c.credit.std_eps) == ("grpo", 1e-4)
    assert c.sampling.prompts_per_step == 2  # 8 completions per device × 1 process / G=4
    for key in ("loss_type", "beta", "scale_rewards", "lr_scheduler_type", "adam_beta2"):
        assert _row(t, key)[1] is False, key


# ---- OpenRLHF ----------------------------------------------------------------------------


def test_openrlhf_ppo_example() -> None:
    """TRANSLATE.md Ex. 4 (v0.11 dotted flags): KL in the reward by default, 8 updates."""
    t = _load("openrlhf_ppo.sh")
    c = t.config
    assert t.framework == "openrlhf" and t.data["recipe"] == "classic-rlhf"
    assert (c.credit.estimator, c.critic.enabled, c.credit.gamma, c.credit.lam) == (
        "gae",
        True,
        1.0,
        1.0,
    )
    assert (c.kl.placement, c.kl.estimator, c.kl.beta) == ("reward", "k1", 0.01)
    # 1024 prompts × 1 sample / 128 per train batch = 8 optimiser steps per rollout
    assert (c.sampling.group_size, c.sampling.prompts_per_step, c.optim.minibatches_per_epoch) == (
        1,
        1024,
        8,
    )
    assert (c.optim.lr, c.optim.critic_lr, c.optim.schedule) == (5e-7, 9e-6, "cosine")
    assert c.optim.adam_betas == (0.9, 0.95)  # OpenRLHF's default, silently
    assert (c.behaviour.corrections, c.behaviour.tis_level, c.behaviour.tis_cap) == (
        ("tis",),
        "token",
        5.0,
    )
    assert (c.behaviour.dual_clip, c.critic.value_clip, c.generation.max_new_tokens) == (
        None,
        0.5,
        2048,
    )
    assert c.feedback.source == "reward_model"
    assert _row(t, "actor.adam.betas") == ("exact", False)
    assert _kinds(t, "approximate") == {
        "algo.advantage.estimator",  # GAE whitening
        "algo.advantage.is_correction_enable",  # TIS lower clamp at 0.5
        "actor.lr_scheduler",  # min_lr_ratio 0.1
        "rollout.max_new_tokens",
        "reward.model_name_or_path",
    }
    assert _kinds(t, "none") == {
        "actor.lr_warmup_ratio",  # 3% of a run counted from the dataset
        "reward.normalize_enable",
        "reward.clip_range",
    }
    assert _kinds(t, "not read") == {"vllm.num_engines", "ds.packing_samples"}


def test_openrlhf_flat_flags() -> None:
    """Written for the tests: ≤0.10 flat flag names read as their dotted names."""
    t = _load("openrlhf_flat_group_norm.sh")
    c = t.config
    assert (c.credit.estimator, c.credit.std_eps) == ("grpo", 1e-9)
    assert (c.kl.placement, c.kl.estimator, c.kl.beta) == ("loss", "k3", 0.001)
    # 128 prompts × 8 samples / 256 = 4 updates
    assert (c.sampling.group_size, c.sampling.prompts_per_step, c.optim.minibatches_per_epoch) == (
        8,
        128,
        4,
    )
    assert (c.sampling.filter, c.reduction.name, c.model.path) == (
        "mixed",
        "token_mean",
        "Qwen/Qwen2.5-Math-1.5B",
    )
    assert (c.behaviour.corrections, c.behaviour.icepop_low, c.behaviour.icepop_high) == (
        ("icepop",),
        0.5,
        5.0,
    )
    assert (c.optim.adam_betas, c.optim.schedule, c.optim.warmup_steps) == (
        (0.9, 0.98),
        "constant",
        0,
    )
    assert _kinds(t, "approximate") == {"algo.dynamic_filtering_enable"}
    assert _kinds(t, "none") == set()
    assert _kinds(t, "not read") == set()


# ---- prime-rl ----------------------------------------------------------------------------


def test_prime_rl_reverse_text_example() -> None:
    """TRANSLATE.md Ex. 5: prime-rl's grpo has no std division; its loss is DPPO-TV against
    the inference log-probs with a kl_tau term; it is asynchronous."""
    t = _load("prime_rl_reverse_text.toml")
    c = t.config
    assert t.framework == "prime-rl"
    assert c.credit.estimator == "dr_grpo"
    # 128 rollouts / G=16 = 8 prompts per step
    assert (c.sampling.group_size, c.sampling.prompts_per_step, c.sampling.filter) == (
        16,
        8,
        "none",
    )
    assert (c.behaviour.objective, c.behaviour.mode) == ("dppo_tv", "bypass")
    assert (c.behaviour.dppo_tv_low, c.behaviour.dppo_tv_high, c.behaviour.dppo_tau) == (
        0.2,
        0.2,
        1e-3,
    )
    assert (c.behaviour.corrections, c.behaviour.max_staleness) == (("staleness",), 8)
    assert (c.kl.placement, c.reduction.name, c.system.mode) == ("none", "token_mean", "async")
    assert (c.generation.max_new_tokens, c.optim.steps, c.optim.lr) == (128, 20, 3e-6)
    assert c.model.path == "PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT"
    assert _row(t, "trainer.loss.type") == ("exact", False)
    assert _kinds(t, "approximate") == {"orchestrator.train.sampling.max_completion_tokens"}
    # filter_zero_advantages=true applies silently and has no equivalent
    assert _kinds(t, "none") == {"orchestrator.train.filter_zero_advantages", "seq_len"}


def test_prime_rl_lora_toml() -> None:
    """Written for the tests: LoRA, 2 steps of staleness, the kl_tau term off, cosine (whose
    warm-up defaults to 10 steps in prime-rl)."""
    t = _load("prime_rl_lora.toml")
    c = t.config
    assert (c.model.lora_rank, c.model.lora_alpha) == (8, 16)
    assert c.behaviour.max_staleness == 2
    assert (c.behaviour.dppo_tv_low, c.behaviour.dppo_tv_high, c.behaviour.dppo_tau) == (
        0.1,
        0.3,
        0.0,
    )
    assert c.sampling.prompts_per_step == 8  # 64 / 8
    assert (c.optim.schedule, c.optim.warmup_steps, c.optim.steps) == ("cosine", 10, 50)
    assert _kinds(t, "none") == set()
    assert _kinds(t, "approximate") == {"trainer.scheduler.type"}  # s/W vs (s+1)/W warm-up


def test_prime_rl_lora_table_alone_takes_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "lora.toml"
    path.write_text("[orchestrator]\ngroup_size = 4\n[trainer.model.lora]\n")
    assert (
        translate(path, "prime-rl").config.model.lora_rank,
        translate(path, "prime-rl").config.model.lora_alpha,
    ) == (16, 32.0)


# ---- SkyRL -------------------------------------------------------------------------------


def test_skyrl_grpo_kl_loss_on_by_default() -> None:
    """Written for the tests: SkyRL's KL loss (0.001·k3) is on unless switched off."""
    t = _load("skyrl_grpo.yaml")
    c = t.config
    assert t.framework == "skyrl"
    assert (c.kl.placement, c.kl.estimator, c.kl.beta) == ("loss", "k3", 0.001)
    assert _row(t, "trainer.algorithm.use_kl_loss") == ("exact", False)  # per-sequence KL = ours
    assert (c.credit.estimator, c.reduction.name) == ("grpo", "response_mean")
    assert (c.behaviour.clip_low, c.behaviour.clip_high, c.behaviour.dual_clip) == (0.2, 0.2, None)
    # 64 prompts / 16 per mini-batch = 4 optimiser steps per batch
    assert (c.sampling.group_size, c.sampling.prompts_per_step, c.optim.minibatches_per_epoch) == (
        5,
        64,
        4,
    )
    assert (c.optim.micro_batch_size, c.optim.weight_decay, c.generation.max_new_tokens) == (
        8,
        0.01,
        1024,
    )
    assert (c.critic.value_clip, c.credit.lam, c.model.lora_rank) == (0.2, 1.0, 0)
    assert _kinds(t, "none") == {"generator.sampling_params.top_k"}
    assert _kinds(t, "approximate") == set()


def test_skyrl_dynamic_sampling_dual_clip_off_policy_correction() -> None:
    """Written for the tests: the filter maps (approximately), KL off, dual clip at c=3,
    token TIS at 2.5 and the geometric sequence mask at SkyRL's 0.99–1.01."""
    t = _load("skyrl_dapo.yaml")
    c, b = t.config, t.config.behaviour
    assert (c.sampling.filter, c.sampling.max_rounds) == ("mixed", 6)
    assert (c.kl.placement, b.dual_clip, b.clip_high) == ("none", 3.0, 0.28)
    assert c.reduction.name == "token_mean"  # SkyRL's default loss_reduction
    assert (b.corrections, b.tis_level, b.tis_cap) == (("tis", "masked_is"), "token", 2.5)
    assert (b.masked_is_low, b.masked_is_high) == (0.99, 1.01)
    assert _kinds(t, "approximate") == {"trainer.algorithm.dynamic_sampling.type"}
    assert _kinds(t, "none") == set()


def test_a_malformed_pair_names_its_key(tmp_path: Path) -> None:
    path = tmp_path / "skyrl.yaml"
    path.write_text("trainer:\n  policy:\n    optimizer_config:\n      adam_betas: 0.9\n")
    with pytest.raises(ConfigError, match=r"optimizer_config\.adam_betas: expected two numbers"):
        translate(path, "skyrl")


# ---- explain --as and round trips --------------------------------------------------------

EXPRESSIBLE = {
    "verl": ["rloo", "cispo", "sapo", "dro", "gmpo"],
    "trl": ["grpo", "dr-grpo", "gspo", "sapo"],
    "openrlhf": [],
    "prime-rl": [],
    "skyrl": ["grpo", "cispo", "sapo", "dppo"],
}
"""Presets whose every axis the framework reproduces (the std's ε aside)."""


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_round_trip_every_expressible_preset(tmp_path: Path, framework: str) -> None:
    """explain --as X → translate --from X gives back the composition, for every preset X
    can express (std_eps is no part of the composition); every other preset names at least
    one reason."""
    expressible = []
    for name in registry.names():
        differs = [d for d in differences_as(name, framework) if not d.startswith("credit.std_eps")]
        if differs:
            assert all(d.strip() for d in differs), name
            continue
        expressible.append(name)
        path = tmp_path / f"{name}.{'toml' if framework == 'prime-rl' else 'yaml'}"
        path.write_text(explain_as(name, framework))
        assert composition(translate(path, framework).config) == composition(preset(name)), name
    assert expressible == EXPRESSIBLE[framework]


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("classic-rlhf", "gae: OpenRLHF whitens the advantages"),
        ("grpo", "reduction: OpenRLHF's ppo is token-level, its gspo per sequence"),
        ("gspo", "kl: OpenRLHF reduces the KL loss per token"),
        ("dapo", "sampling.max_rounds: OpenRLHF's filter has no cap"),
    ],
)
def test_openrlhf_names_why_a_preset_is_out_of_reach(name: str, reason: str) -> None:
    assert reason in differences_as(name, "openrlhf")


def test_prime_rl_names_why_no_preset_is_in_reach() -> None:
    """Every preset is synchronous or std-normalised or not DPPO: each says which."""
    assert "credit.estimator=grpo: prime-rl's grpo is mean-only (dr_grpo)" in differences_as(
        "dppo", "prime-rl"
    )
    assert "critic: prime-rl has none" in differences_as("sao", "prime-rl")
    assert any(d.startswith("system.mode") for d in differences_as("grpo", "prime-rl"))


ROUND_TRIPS = [
    "openrlhf_flat_group_norm.sh",
    "prime_rl_lora.toml",
    "prime_rl_reverse_text.toml",
    "skyrl_dapo.yaml",
    "skyrl_grpo.yaml",
    "trl_dr_grpo.yaml",
    "trl_grpo.json",
    "verl_grpo.yaml",
    "verl_gspo.yaml",
]
"""The examples whose translation the framework's own settings reproduce, composition-wise.
The others name what blocks it: OpenRLHF's PPO (GAE whitening, TIS's lower clamp, cosine's
floor), RLOO (no RLOOConfig is written), verl's DAPO (its ±1 reward) and rollout
correction (masked_is's denominators)."""
OUTSIDE_COMPOSITION = ("credit.std_eps", "sampling.max_rounds", "optim.warmup_steps")
"""Differences in fields the composition does not show."""


@pytest.mark.parametrize("name", ALL)
def test_round_trip_of_each_translated_example(tmp_path: Path, name: str) -> None:
    """translate → explain the result --as the same framework → translate: the composition
    comes back whenever the inverse names no difference in it."""
    t = _load(name)
    text, differs = inverse_of(t.config, t.framework)
    blocking = [d for d in differs if not d.startswith(OUTSIDE_COMPOSITION)]
    assert (not blocking) == (name in ROUND_TRIPS), blocking
    if blocking:
        return
    path = tmp_path / name.replace(".json", ".yaml")  # the inverse writes YAML
    path.write_text(text)
    back = translate(path, t.framework)
    assert composition(back.config) == composition(t.config)


def test_explain_as_names_the_dual_clip_difference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "grpo", "--as", "verl"]) == 0
    out = capsys.readouterr().out
    assert "# differs: behaviour.dual_clip=None" in out and "clip_ratio_c: 3.0" in out


def test_cli_translate_writes_a_loadable_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "rlmap.yaml"
    assert (
        main(["translate", str(EXAMPLES / "verl_dapo.yaml"), "--from", "verl", "--out", str(out)])
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    assert main(["config", "--config", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "overlong_cache: 4096" in shown and "dual_clip: 10.0" in shown


# ---- the embedded default trains every example -------------------------------------------

AXES = (
    "feedback.source",
    "credit.estimator",
    "critic.enabled",
    "behaviour.objective",
    "behaviour.mode",
    "behaviour.corrections",
    "kl.placement",
    "kl.estimator",
    "reduction.name",
    "sampling.filter",
    "system.mode",
)


def _axes(t: Translation) -> tuple[object, ...]:
    dump = t.config.model_dump()
    out = []
    for dotted in AXES:
        node = dump
        for part in dotted.split("."):
            node = node[part]
        out.append(node)
    return tuple(out)


@pytest.mark.parametrize("name", ALL)
def test_embedded_translation_trains_one_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """The acceptance: each example, swapped onto the embedded model and sizes, keeps every
    component and trains (one step, two prompts per step, a two-row eval; the group size is
    the algorithm's and stays)."""
    cfg_path = tmp_path / "rlmap.yaml"
    world = ["--world-size", str(WORLD[name])] if name in WORLD else []
    argv = ["translate", str(EXAMPLES / name), "--from", "auto", "--embedded", *world]
    assert main([*argv, "--out", str(cfg_path)]) == 0
    embedded = _load(name, to_embedded=True)
    assert _axes(embedded) == _axes(_load(name))
    assert embedded.config.model.path.startswith("embedded:")
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--config",
                str(cfg_path),
                "--out",
                str(run),
                "optim.steps=1",
                "sampling.prompts_per_step=2",
                "data.eval_size=2",
                "generation.eval_samples=1",
                "run.progress=false",
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "step" in r][-1] == 1
