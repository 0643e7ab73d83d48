"""``rlmap translate`` and ``rlmap explain --as``: the research note's examples (and one more
per framework) translate to the hand-derived rlmap fields, every approximation is reported,
silent defaults are rows too, and explain --as → translate gives back the composition."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlmap.cli import main
from rlmap.recipes import composition, preset, registry
from rlmap.recipes.translate import Translation, differences_as, explain_as, translate

EXAMPLES = Path(__file__).parent / "translate_examples"


def _kinds(t: Translation, kind: str) -> set[str]:
    return {row.key for row in t.rows if row.kind == kind}


def _row(t: Translation, key: str) -> tuple[str, bool]:
    (row,) = [r for r in t.rows if r.key == key]
    return row.kind, row.given


def test_verl_grpo_example() -> None:
    """TRANSLATE.md Ex. 1: verl's defaults decide half the run."""
    t = translate(EXAMPLES / "verl_grpo.yaml", "verl")
    c = t.config
    assert (c.credit.estimator, c.credit.std_eps, c.credit.lam) == ("grpo", 1e-6, 1.0)
    assert (c.sampling.group_size, c.sampling.prompts_per_step) == (5, 1024)
    # vanilla always dual-clips at clip_ratio_c, whose default is 3.0
    assert (c.behaviour.objective, c.behaviour.clip_low, c.behaviour.clip_high,
            c.behaviour.dual_clip) == ("ppo_clip", 0.2, 0.2, 3.0)  # fmt: skip
    assert (c.kl.placement, c.kl.estimator, c.kl.beta) == ("loss", "k3", 0.001)
    assert c.reduction.name == "token_mean"  # verl's default, not the grpo preset's
    assert c.generation.max_new_tokens == 2048
    # 1024 prompts / 256 per mini-batch = 4 optimiser steps per batch
    assert (c.optim.lr, c.optim.weight_decay, c.optim.minibatches_per_epoch) == (1e-6, 0.01, 4)
    assert c.model.path == "Qwen/Qwen3-8B"
    assert t.data["recipe"] == "grpo"
    assert _row(t, "actor_rollout_ref.actor.clip_ratio_c") == ("exact", False)
    assert _row(t, "actor_rollout_ref.actor.loss_agg_mode") == ("exact", False)
    assert _kinds(t, "approximate") == set()
    assert _kinds(t, "none") == {"data.max_prompt_length"}


def test_verl_dapo_example() -> None:
    """TRANSLATE.md Ex. 2: overlong shaping, the group filter and warm-up are approximate."""
    t = translate(EXAMPLES / "verl_dapo.yaml", "verl")
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
    assert c.sampling.group_size == 16 and c.generation.max_new_tokens == 20480
    assert _kinds(t, "approximate") == {
        "reward.reward_kwargs.overlong_buffer_cfg.enable",
        "algorithm.filter_groups.enable",
        "actor_rollout_ref.actor.optim.lr_warmup_steps",
    }
    assert _kinds(t, "not read") == {"data.gen_batch_size"}
    assert all(row.note for row in t.rows if row.kind in ("approximate", "none"))


def test_verl_gspo_recipe_with_interpolations() -> None:
    """Written for the tests: ``${data.train_batch_size}`` and ``${oc.select:…,2e-6}`` are
    resolved; gspo forces a per-response mean whatever loss_agg_mode says."""
    t = translate(EXAMPLES / "verl_gspo.yaml", "auto")
    c = t.config
    assert t.framework == "verl"
    assert c.optim.minibatches_per_epoch == 1  # 64 / ${data.train_batch_size}=64
    assert c.optim.lr == 2e-6  # oc.select's fallback: the key is absent
    assert (c.behaviour.objective, c.behaviour.gspo_token) == ("gspo", True)
    assert (c.behaviour.clip_low, c.behaviour.clip_high) == (0.0003, 0.0004)
    assert c.reduction.name == "response_mean"
    assert c.credit.estimator == "dr_grpo"  # norm_adv_by_std_in_grpo: false
    assert c.kl.placement == "none"  # use_kl_loss defaults to False


def test_trl_dr_grpo_example() -> None:
    """TRANSLATE.md Ex. 3 on 8 processes: dr_grpo is a reduction only in TRL."""
    t = translate(EXAMPLES / "trl_dr_grpo.yaml", "trl", world_size=8)
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
    assert _kinds(t, "approximate") == {"use_vllm"}  # sequence_mask ≈ sequence TIS
    assert _kinds(t, "none") == {"lr_scheduler_type"}  # linear decay, silently
    assert _row(t, "lr_scheduler_type") == ("none", False)
    assert _kinds(t, "not read") == {"vllm_mode"}


def test_trl_grpo_json() -> None:
    """Written for the tests (JSON): scale_rewards=none is dr_grpo's advantage; loss_type=grpo
    is the per-response mean; beta turns on a k3 loss KL."""
    t = translate(EXAMPLES / "trl_grpo.json", "auto")
    c = t.config
    assert t.framework == "trl"
    assert (c.credit.estimator, c.reduction.name) == ("dr_grpo", "response_mean")
    assert (c.kl.placement, c.kl.estimator, c.kl.beta) == ("loss", "k3", 0.04)
    assert (c.behaviour.clip_low, c.behaviour.clip_high) == (0.2, 0.28)
    assert c.sampling.prompts_per_step == 4  # 16 completions × 1 process × 1 step / G=4
    assert c.optim.schedule == "constant" and c.model.path == "Qwen/Qwen2.5-0.5B-Instruct"
    assert _kinds(t, "none") == {"top_k"}
    assert _kinds(t, "approximate") == set()


@pytest.mark.parametrize("framework", ["verl", "trl", "skyrl"])
def test_round_trip_every_expressible_preset(tmp_path: Path, framework: str) -> None:
    """explain --as X → translate --from X gives back the composition, for every preset X
    can express (std_eps is no part of the composition); the rest name their differences."""
    expressible = []
    for name in registry.names():
        differs = differences_as(name, framework)
        if any(not d.startswith("credit.std_eps") for d in differs):
            continue
        expressible.append(name)
        path = tmp_path / f"{name}.yaml"
        path.write_text(explain_as(name, framework))
        assert composition(translate(path, framework).config) == composition(preset(name)), name
    expected = {
        "verl": ["rloo", "cispo", "sapo"],
        "trl": ["grpo", "dr-grpo", "gspo", "sapo"],
        "skyrl": ["classic-rlhf", "grpo", "cispo", "sapo", "ppo"],
    }
    assert expressible == expected[framework]


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


def test_embedded_verl_grpo_trains_two_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The acceptance: the translated verl GRPO example, swapped onto the embedded model
    and sizes, trains (2 steps, small eval) and keeps its composition."""
    cfg_path = tmp_path / "rlmap.yaml"
    argv = ["translate", str(EXAMPLES / "verl_grpo.yaml"), "--from", "verl", "--embedded"]
    assert main([*argv, "--out", str(cfg_path)]) == 0
    t = translate(EXAMPLES / "verl_grpo.yaml", "verl", to_embedded=True)
    assert composition(t.config) == composition(
        translate(EXAMPLES / "verl_grpo.yaml", "verl").config
    )
    assert t.config.model.path == "embedded:tiny"
    run = tmp_path / "run"
    assert main(["train", "--config", str(cfg_path), "--out", str(run), "optim.steps=2",
                 "data.eval_size=4", "generation.eval_samples=2", "run.progress=false",
                 "sampling.prompts_per_step=4"]) == 0  # fmt: skip
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "step" in r][-1] == 2


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
    for key in ("loss_type", "beta", "scale_rewards", "lr_scheduler_type"):
        assert _row(t, key)[1] is False, key


def test_prime_rl_reverse_text_example() -> None:
    """TRANSLATE.md Ex. 5: prime-rl's grpo has no std division; it is async and bypass."""
    t = translate(EXAMPLES / "prime_rl_reverse_text.toml", "auto")
    c = t.config
    assert t.framework == "prime-rl"
    assert c.credit.estimator == "dr_grpo"
    # 128 rollouts / G=16 = 8 prompts per step
    assert (c.sampling.group_size, c.sampling.prompts_per_step, c.sampling.filter) == (
        16,
        8,
        "none",
    )
    assert (c.behaviour.objective, c.behaviour.mode) == ("direct_gate", "bypass")
    assert (c.behaviour.gate_low, c.behaviour.gate_high) == (0.2, 0.2)
    assert (c.behaviour.corrections, c.behaviour.max_staleness) == (("staleness",), 8)
    assert (c.kl.placement, c.reduction.name, c.system.mode) == ("none", "token_mean", "async")
    assert (c.generation.max_new_tokens, c.optim.steps, c.optim.lr) == (128, 20, 3e-6)
    assert c.model.path == "PrimeIntellect/Qwen3-0.6B-Reverse-Text-SFT"
    assert _kinds(t, "approximate") == {
        "trainer.loss.type",
        "orchestrator.train.sampling.max_completion_tokens",
    }
    # kl_tau=1e-3 and filter_zero_advantages=true apply silently and have no equivalent
    assert _kinds(t, "none") == {
        "trainer.loss.kl_tau",
        "orchestrator.train.filter_zero_advantages",
        "seq_len",
    }


def test_prime_rl_lora_toml() -> None:
    """Written for the tests: LoRA, 2 steps of staleness, the KL term off, cosine."""
    t = translate(EXAMPLES / "prime_rl_lora.toml", "prime-rl")
    c = t.config
    assert (c.model.lora_rank, c.model.lora_alpha) == (8, 16)
    assert c.behaviour.max_staleness == 2
    assert (c.behaviour.gate_low, c.behaviour.gate_high) == (0.1, 0.3)
    assert c.sampling.prompts_per_step == 8  # 64 / 8
    assert (c.optim.schedule, c.optim.steps) == ("cosine", 50)
    assert _kinds(t, "none") == set()
    assert _kinds(t, "approximate") == {"trainer.loss.type", "trainer.scheduler.type"}


def test_explain_as_prime_rl_translates_back(tmp_path: Path) -> None:
    """prime-rl expresses no preset exactly (DPPO is not direct_gate); its TOML still reads."""
    path = tmp_path / "dppo.toml"
    path.write_text(explain_as("dppo", "prime-rl"))
    assert "behaviour.objective=dppo_tv" in " ".join(differences_as("dppo", "prime-rl"))
    c = translate(path, "prime-rl").config
    assert (c.behaviour.objective, c.system.mode, c.behaviour.max_staleness) == (
        "direct_gate",
        "async",
        4,
    )


def test_skyrl_grpo_kl_loss_on_by_default() -> None:
    """Written for the tests: SkyRL's KL loss (0.001·k3) is on unless switched off."""
    t = translate(EXAMPLES / "skyrl_grpo.yaml", "auto")
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
    assert _kinds(t, "none") == {"generator.sampling_params.top_k"}
    assert _kinds(t, "approximate") == set()


def test_skyrl_dynamic_sampling_dual_clip() -> None:
    """Written for the tests: the filter maps (approximately), KL off, dual clip at c=3."""
    t = translate(EXAMPLES / "skyrl_dapo.yaml", "skyrl")
    c = t.config
    assert (c.sampling.filter, c.sampling.max_rounds) == ("mixed", 6)
    assert (c.kl.placement, c.behaviour.dual_clip, c.behaviour.clip_high) == ("none", 3.0, 0.28)
    assert c.reduction.name == "token_mean"  # SkyRL's default loss_reduction
    assert _kinds(t, "approximate") == {"trainer.algorithm.dynamic_sampling.type"}


def test_openrlhf_ppo_example() -> None:
    """TRANSLATE.md Ex. 4 (v0.11 dotted flags): KL in the reward by default, 8 updates."""
    t = translate(EXAMPLES / "openrlhf_ppo.sh", "auto")
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
    assert _kinds(t, "approximate") == {
        "algo.advantage.estimator",  # GAE whitening
        "algo.advantage.is_correction_enable",  # TIS lower clamp at 0.5
        "actor.lr_scheduler",
        "rollout.max_new_tokens",
    }
    assert _kinds(t, "none") == {
        "actor.adam.betas",
        "reward.normalize_enable",
        "reward.model_name_or_path",
    }
    assert _kinds(t, "not read") == {"vllm.num_engines", "ds.packing_samples"}


def test_openrlhf_flat_flags() -> None:
    """Written for the tests: ≤0.10 flat flag names read as their dotted names."""
    t = translate(EXAMPLES / "openrlhf_flat_group_norm.sh", "openrlhf")
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
    assert _kinds(t, "not read") == set()


@pytest.mark.parametrize("name", ["classic-rlhf", "ppo"])
def test_openrlhf_round_trip_critic_presets(tmp_path: Path, name: str) -> None:
    """OpenRLHF expresses the critic presets' composition; the whitening is named."""
    path = tmp_path / "run.sh"
    path.write_text(explain_as(name, "openrlhf"))
    assert differences_as(name, "openrlhf") == ["gae: OpenRLHF whitens the advantages"]
    assert composition(translate(path, "openrlhf").config) == composition(preset(name))
