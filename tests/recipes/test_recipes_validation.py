"""Invalid values and combinations fail before any work, in one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlmap.core.errors import ConfigError, InputError
from rlmap.recipes import build_config, load_config


def _error(recipe: str, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        build_config(recipe, None, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("recipe", "overrides", "field", "words"),
    [
        ("grpo", ["sampling.group_size=1"], "sampling.group_size:", "G >= 2"),
        ("rloo", ["sampling.group_size=1"], "sampling.group_size:", "G >= 2"),
        (
            "vapo",
            ["credit.time_unit=turn", "credit.length_unit=token"],
            "credit.length_unit:",
            "'token'",
        ),
        ("ppo", ["critic.enabled=false"], "critic.enabled:", "needs a value critic"),
        ("grpo", ["critic.enabled=true"], "critic.enabled:", "no targets"),
        ("vapo", ["critic.warmup_steps=0"], "critic.pretrain_mc:", "warmup_steps >= 1"),
        (
            "grpo",
            ["behaviour.mode=bypass", "behaviour.corrections=[tis]"],
            "behaviour.corrections:",
            "bypass",
        ),
        (
            "grpo",
            ["behaviour.mode=bypass", "behaviour.corrections=[icepop]"],
            "behaviour.corrections:",
            "bypass",
        ),
        (
            "dapo",
            ["sampling.group_size=1", "credit.estimator=reinforce"],
            "sampling.filter:",
            "G >= 2",
        ),
        ("grpo", ["reduction.name=fixed_budget"], "reduction.max_len:", "L_max"),
        ("grpo", ["credit.estimator=grpoo"], "credit.estimator:", "known: "),
        ("grpo", ["behaviour.objective=ppo"], "behaviour.objective:", "ppo_clip"),
        ("grpo", ["behaviour.corrections=[tiss]"], "behaviour.corrections:", "tis"),
        ("grpo", ["reduction.name=mean"], "reduction.name:", "token_mean"),
        ("grpo", ["sampling.filter=dynamic"], "sampling.filter:", "mixed"),
        ("grpo", ["feedback.verifier=no_such_verifier"], "feedback.verifier:", "exact_match"),
        ("rloo", ["optim.epochs_per_batch=2"], "behaviour.objective:", "off-policy"),
        ("grpo", ["behaviour.dual_clip=0.5"], "behaviour.dual_clip:", "> 1"),
        ("grpo", ["kl.beta=0"], "kl.beta:", "> 0"),
        ("grpo", ["credit.gamma=1.5"], "credit.gamma:", "[0, 1]"),
    ],
)
def test_invalid_combination_names_its_field(
    recipe: str, overrides: list[str], field: str, words: str
) -> None:
    message = _error(recipe, *overrides)
    assert message.startswith(field), message
    assert words in message, message


def test_explicit_override_allows_a_length_unit_mismatch() -> None:
    cfg = build_config(
        "vapo",
        None,
        [
            "credit.time_unit=turn",
            "credit.length_unit=token",
            "credit.allow_length_unit_mismatch=true",
        ],
    )
    assert cfg.credit.length_unit == "token"


def test_the_same_unit_is_accepted_for_turn_level_gae() -> None:
    cfg = build_config("vapo", None, ["credit.time_unit=turn"])  # length unit follows time unit
    assert cfg.credit.time_unit == "turn"


def test_unknown_and_ill_typed_overrides() -> None:
    assert _error("grpo", "optim.lrr=1").startswith("optim.lrr: unknown config field")
    assert _error("grpo", "optim.lr=fast").startswith("optim.lr: ")
    assert "fast" in _error("grpo", "optim.lr=fast")
    assert _error("grpo", "credit.time_unit=step").startswith("credit.time_unit: ")
    assert _error("grpo", "nonsense").startswith("override 'nonsense'")


def test_unknown_recipe_lists_the_known_ones() -> None:
    message = _error("grpo-v2")
    assert "unknown recipe 'grpo-v2'" in message and "dapo" in message


def test_overrides_coerce_types() -> None:
    cfg = build_config("grpo", None, ["optim.lr=1e-5", "sampling.group_size=4"])
    assert cfg.optim.lr == 1e-5 and cfg.sampling.group_size == 4


def test_yaml_file_starts_from_its_recipe(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("recipe: dapo\nbehaviour:\n  clip_high: 0.3\n")
    cfg = load_config(path, ["seed=3"])
    assert cfg.recipe == "dapo" and cfg.sampling.filter == "mixed"
    assert cfg.behaviour.clip_high == 0.3 and cfg.behaviour.clip_low == 0.2 and cfg.seed == 3


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("recipe: grpo\noptim:\n  lr: [1e-5\n")
    with pytest.raises(InputError, match=r"bad\.yaml:\d+: not valid YAML"):
        load_config(path)


def test_yaml_with_a_wrong_field_names_it(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("recipe: grpo\ncredit:\n  lambda: 0.9\n")
    with pytest.raises(ConfigError, match=r"^credit\.lambda: unknown config field"):
        load_config(path)


def test_vllm_temperature_advice_names_values_validation_accepts() -> None:
    # issue 27: the advice was "use 0 (greedy)", which generation.temperature's own bound
    # (> 0: the learner scores under softmax(z/T)) refuses. Both ends of the advised range
    # must pass; 0 must not be advised.
    for t in (0.005, 2.5):
        message = _error("grpo", "system.engine=vllm", f"generation.temperature={t}")
        assert message.startswith("generation.temperature:") and "[0.01, 2]" in message
        assert "greedy" not in message and "use 0 " not in message, message
    assert _error("grpo", "generation.temperature=0").startswith("generation.temperature: must")
    for t in (0.01, 2):
        build_config("grpo", None, ["system.engine=vllm", f"generation.temperature={t}"])


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["model.lora_alpha=16"], "model.lora_alpha:"),
        (["model.lora_rank=0", "model.lora_alpha=4"], "model.lora_alpha:"),
        (["data.eval_path=held.jsonl"], "data.eval_path:"),
        (["data.task=calculator", "data.eval_path=held.jsonl"], "data.eval_path:"),
    ],
)
def test_settings_that_change_nothing_are_refused(overrides: list[str], field: str) -> None:
    # issue 27: accepted without a word before, each changing nothing
    message = _error("grpo", *overrides)
    assert message.startswith(field), message


def test_lora_alpha_left_unset_or_with_adapters_is_accepted() -> None:
    assert build_config("grpo", None, []).model.lora_alpha is None  # the default: no refusal
    assert build_config("grpo", None, ["model.lora_rank=4", "model.lora_alpha=16"])
