"""Presets: all of FORMULAS.md §9 exist, validate, round-trip YAML, and explain all axes."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmap.recipes import composition, explain, load_config, preset, registry, validate
from rlmap.recipes.catalog import paper_index_markdown
from rlmap.recipes.explain import scaled

# FORMULAS.md §9, written out here independently of the registry.
SECTION_9 = {
    "classic-rlhf",
    "grpo",
    "dr-grpo",
    "rloo",
    "reinforce",
    "dapo",
    "vapo",
    "gspo",
    "cispo",
    "sapo",
    "sao",
    "ppo",
    "dppo",
    "dro",
    "gmpo",
}


def test_every_section_9_preset_is_registered() -> None:
    assert set(registry.names()) == SECTION_9


@pytest.mark.parametrize("name", sorted(SECTION_9))
def test_preset_validates_and_round_trips_yaml(name: str, tmp_path: Path) -> None:
    cfg = preset(name)
    validate(cfg)
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    assert load_config(path) == cfg


@pytest.mark.parametrize("name", sorted(SECTION_9))
def test_explain_prints_all_six_axes_and_the_paper(name: str) -> None:
    text = explain(name)
    for axis in ("1 feedback", "2 sampling", "3 credit", "4 behaviour", "5 reduction", "6 system"):
        assert axis in text
    assert registry.get(name).paper in text


# Each 2026 component, the field that chooses it and what its card must show, written out
# here from docs/formulas.md §3–§6 (the defaults are the ones the doc quotes).
CARDS_2026 = {
    "dppo_tv": ("behaviour.objective=dppo_tv", "behaviour.dppo_tv_high=0.2", "verl"),
    "dppo_kl": ("behaviour.objective=dppo_kl", "behaviour.dppo_kl_low=0.05", "SkyRL"),
    "m2po": ("behaviour.corrections=[m2po]", "behaviour.m2po_threshold=0.04", "AReaL"),
    "opsm": ("behaviour.corrections=[opsm]", "behaviour.opsm_delta=0.0001", "DeepSeek"),
    "k3_iw": ("kl.estimator=k3_iw", "ρ", "unbiased"),
    "prompt_mean": ("reduction.name=prompt_mean", "group", "SkyRL"),
    "token_sum": ("reduction.name=token_sum", "sum", "verl"),
    "seq_mean_token_sum": ("reduction.name=seq_mean_token_sum", "sum", "verl"),
}


@pytest.mark.parametrize("name", sorted(CARDS_2026))
def test_explain_gives_a_component_its_card(name: str) -> None:
    text = explain(name)
    for part in CARDS_2026[name]:
        assert part in text, part
    assert text.startswith(f"{name}: ")
    assert "1 feedback" not in text  # a card, not a preset's six axes


def test_a_name_both_preset_and_component_explains_the_preset_and_points_at_the_card() -> None:
    text = explain("dro")
    assert "6 system" in text  # the preset
    assert "rlmap explain behaviour.objective=dro" in text
    card = explain("behaviour.objective=dro")
    assert "behaviour.dro_beta=0.05" in card and "6 system" not in card


def test_every_registered_component_has_a_card() -> None:
    from rlmap.recipes.explain import COMPONENTS

    for _, field, reg in COMPONENTS:
        for name in reg.names():
            card = explain(f"{field}={name}")
            assert reg.get(name).summary in card and f"chosen by {field}" in card, name


def _axes(line: str) -> list[list[str]]:
    """A composition line read back: one list per axis (joined with ' · '), each of its
    components (joined with ' + ')."""
    return [axis.split(" + ") for axis in line.split(" · ")]


def test_dapo_composition_is_written_out() -> None:
    # DAPO (FORMULAS.md §9) on the embedded scale: each axis's components exactly, in order
    assert _axes(composition(preset("dapo"))) == [
        ["verifier(exact_match)", "soft overlong punishment (L_c=4)"],  # 1 feedback
        ["G=8 per prompt", "mixed-group dynamic sampling (≤4 rounds)"],  # 2 sampling
        ["grpo advantage"],  # 3 credit
        ["ppo_clip(clip_low=0.2, clip_high=0.28, decoupled)", "no KL"],  # 4 behaviour, KL
        ["token_mean"],  # 5 reduction
        ["synchronous group barrier (hf, inprocess)"],  # 6 system
    ]


def test_sao_composition_is_written_out() -> None:
    # SAO: one rollout, a critic with GAE (λ_policy adaptive, α = 1.5), the direct gate
    # in bypass mode plus a staleness bound, on the asynchronous queue
    assert _axes(composition(preset("sao"))) == [
        ["verifier(exact_match)"],  # 1 feedback
        ["single rollout per prompt"],  # 2 sampling
        ["value critic", "gae(γ=1.0, λ_critic=1.0, λ_policy=1-1/(1.5·l_token), per token)"],
        [
            "direct_gate(gate_low=0.3, gate_high=5.0, bypass)",
            "staleness(max_staleness=4)",
            "no KL",
        ],  # 4 behaviour, KL
        ["token_mean"],  # 5 reduction
        ["asynchronous queue (hf, inprocess)"],  # 6 system
    ]


def test_grpo_is_the_papers_composition() -> None:
    cfg = preset("grpo")
    assert (cfg.credit.estimator, cfg.behaviour.objective, cfg.reduction.name) == (
        "grpo",
        "ppo_clip",
        "response_mean",
    )
    assert (cfg.kl.placement, cfg.kl.estimator, cfg.kl.beta) == ("loss", "k3", 0.04)
    assert cfg.system.mode == "sync"


def test_variants_differ_from_grpo_only_in_what_the_table_says() -> None:
    base = preset("grpo").model_dump()
    for name, changed in {
        "gspo": {"behaviour"},
        "cispo": {"behaviour"},
        "sapo": {"behaviour"},
        "gmpo": {"behaviour"},
        "dppo": {"behaviour"},  # the objective, δ, and bypass mode
        "dro": {"behaviour", "credit"},  # the objective, β, and the mean baseline
        "dr-grpo": {"credit", "reduction"},
    }.items():
        other = preset(name).model_dump()
        differing = {k for k in base if k != "recipe" and base[k] != other[k]}
        assert differing == changed, name


def test_the_2026_objectives_are_their_papers_compositions() -> None:
    dppo, dro, gmpo = preset("dppo").behaviour, preset("dro"), preset("gmpo").behaviour
    # DPPO anchors its trust region on the rollout policy: bypass mode, binary TV at 0.15
    assert (dppo.objective, dppo.mode, dppo.dppo_tv_low, dppo.dppo_tv_high) == (
        "dppo_tv",
        "bypass",
        0.15,
        0.15,
    )
    # DRO: Kimi k1.5's mean baseline (no std) and β = 0.05
    assert (dro.behaviour.objective, dro.behaviour.dro_beta, dro.credit.estimator) == (
        "dro",
        0.05,
        "dr_grpo",
    )
    # GMPO: the log-space band (e^−0.4, e^0.4)
    assert (gmpo.objective, gmpo.gmpo_clip_low, gmpo.gmpo_clip_high) == ("gmpo", 0.4, 0.4)


def test_scaling_is_reported_against_the_quoted_values() -> None:
    # The grpo paper samples 64 outputs per question; the embedded preset uses 8.
    rows = {field: (paper, ours) for field, paper, ours in scaled("grpo")}
    assert rows["sampling.group_size"] == (64, 8)
    assert "kl.beta" not in rows  # β = 0.04 is kept as the paper has it
    assert "sampling.group_size: 64 → 8" in explain("grpo")


def test_paper_index_in_docs_is_up_to_date() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs" / "papers.md"
    assert docs.read_text() == paper_index_markdown(), "regenerate: rlmap papers > docs/papers.md"


def test_vapo_alpha_is_scaled_so_that_lambda_policy_is_never_clamped_on_embedded_lengths() -> None:
    import torch

    from rlmap.estimators.gae import adaptive_lambda
    from rlmap.recipes import preset

    cfg = preset("vapo")
    alpha = cfg.credit.adaptive_alpha
    assert alpha is not None
    lengths = torch.arange(1, cfg.generation.max_new_tokens + 1)
    lam = adaptive_lambda(lengths, alpha=alpha)
    # With the paper's α = 0.05: 1 − 1/(0.05·l) < 0 for every l ≤ 16, clamped to 0 (pure TD).
    assert float(lam.min()) >= 0.98
    # α·l at the length limit equals the paper's: 0.05 · 20480 = 1024 = α · 16.
    assert alpha * cfg.generation.max_new_tokens == pytest.approx(0.05 * 20480)
