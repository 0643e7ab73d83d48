"""rlmap compare: grouping by seed, unfairness flags, curves on budgets, the report."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlmap.cli import main
from rlmap.core.errors import InputError
from rlmap.experiments import train as train_module
from rlmap.experiments.compare import compare
from rlmap.experiments.compare_curves import at_equal_budget, band, interpolate
from rlmap.experiments.compare_runs import find_runs, group_runs, load_run
from rlmap.experiments.compare_table import LINES, NOT_COMPARED, flags, summarize, table
from rlmap.recipes import build_config
from rlmap.recipes.config import RecipeConfig

SETUP = {
    "base_fingerprint": "aaaa",
    "base_model": "embedded:tiny",
    "tokenizer_fingerprint": "tttt",
    "data_fingerprint": "dddd",
    "verifier": "exact_match",
    "engine": "hf",
    "precision": "train float32 / rollout float32",
}


def fake_run(
    path: Path,
    recipe: str,
    seed: int,
    evals: list[tuple[float, float, float]],
    *,
    ledger: dict[str, Any] | None = None,
    config: dict[str, Any] | None = None,
    failed: str | None = None,
) -> Path:
    """A run directory by hand: evals are (generated tokens, wall-clock s, pass@1)."""
    path.mkdir(parents=True)
    cfg = {
        "recipe": recipe,
        "seed": seed,
        "generation": {"temperature": 1.0, "top_p": 1.0, "max_new_tokens": 16, "eval_samples": 8},
        "data": {"task": "arithmetic"},
        "run": {"progress": seed % 2 == 0},
    } | (config or {})
    import yaml

    (path / "config.yaml").write_text(f"# {recipe}: composition\n" + yaml.safe_dump(cfg))
    tokens, wall, _ = evals[-1]
    full = (
        SETUP
        | {
            "generated_tokens": tokens,
            "wall_clock_s": wall,
            "actor_s": 1.0,
            "critic_s": 0.0,
            "reference_s": 1.0,
            "prompts": 100,
            "learner_steps": 10,
        }
        | (ledger or {})
    )
    (path / "ledger.json").write_text(json.dumps(full))
    records = [
        {"step": k, "budget/generated_tokens": t, "budget/wall_clock_s": w, "eval/pass@1": p}
        for k, (t, w, p) in enumerate(evals)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if failed is not None:
        (path / "FAILED").write_text(failed)
    else:
        summary = {"before": {"eval/pass@1": evals[0][2]}, "after": {"eval/pass@1": evals[-1][2]}}
        (path / "summary.json").write_text(json.dumps(summary))
    return path


def two_methods(tmp: Path, dapo_tokens: float = 2000.0) -> list[Path]:
    # grpo: 2 seeds, 1000 tokens each; dapo: 2 seeds, `dapo_tokens` each
    return [
        fake_run(tmp / "grpo" / "seed0", "grpo", 0, [(0, 0, 0.4), (1000, 10, 0.6)]),
        fake_run(tmp / "grpo" / "seed1", "grpo", 1, [(0, 0, 0.4), (1000, 10, 0.8)]),
        fake_run(tmp / "dapo" / "seed0", "dapo", 0, [(0, 0, 0.4), (dapo_tokens, 10, 0.7)]),
        fake_run(tmp / "dapo" / "seed1", "dapo", 1, [(0, 0, 0.4), (dapo_tokens, 10, 0.9)]),
    ]


def test_runs_group_by_config_up_to_the_seed(tmp_path: Path) -> None:
    two_methods(tmp_path)
    runs = [load_run(p) for p in find_runs([tmp_path / "grpo", tmp_path / "dapo"])]
    groups = group_runs(runs)
    # the run section (progress differs by seed here) does not split a group either
    assert {k: [r.seed for r in v] for k, v in groups.items()} == {"grpo": [0, 1], "dapo": [0, 1]}


def test_groups_of_one_recipe_are_named_by_their_sweep_directory(tmp_path: Path) -> None:
    evals = [(0, 0, 0.4), (1000, 10, 0.6)]
    for arm, g in (("curriculum", 8), ("direct", 4)):
        for seed in (0, 1):
            fake_run(
                tmp_path / arm / f"seed{seed}",
                "grpo",
                seed,
                evals,
                config={"sampling": {"group_size": g}},
            )
    fake_run(tmp_path / "loose" / "a", "grpo", 0, evals, config={"sampling": {"group_size": 2}})
    fake_run(tmp_path / "loose" / "b", "grpo", 0, evals, config={"sampling": {"group_size": 3}})
    runs = [
        load_run(p) for p in find_runs([tmp_path / d for d in ("curriculum", "direct", "loose")])
    ]
    # the two loose runs share a directory with another group: numbered instead
    assert sorted(group_runs(runs)) == [
        "grpo (2)",
        "grpo (curriculum)",
        "grpo (direct)",
        "grpo (loose)",
    ]


def test_a_dynamic_sampling_run_with_twice_the_tokens_is_flagged(tmp_path: Path) -> None:
    paths = two_methods(tmp_path)
    found = flags(group_runs([load_run(p) for p in paths]))
    budget = [f for f in found if f.startswith("UNFAIR budget: generated tokens")]
    assert len(budget) == 1 and "2.00x" in budget[0]
    assert not any(f.startswith("UNFAIR setup") for f in found)


def test_budgets_within_the_tolerance_are_not_flagged(tmp_path: Path) -> None:
    paths = two_methods(tmp_path, dapo_tokens=1050.0)  # 5 % apart
    found = flags(group_runs([load_run(p) for p in paths]))
    assert not any("generated tokens" in f for f in found)


@pytest.mark.parametrize(
    ("field", "value", "label"),
    [
        ("base_fingerprint", "bbbb", "base checkpoint"),
        ("tokenizer_fingerprint", "uuuu", "tokenizer + chat template"),
        ("data_fingerprint", "eeee", "prompts"),
        ("verifier", "last_number", "training verifier"),
        ("eval_verifier", "last_number", "held-out verifier"),
    ],
)
def test_setup_differences_are_unfair(tmp_path: Path, field: str, value: str, label: str) -> None:
    a = fake_run(tmp_path / "a", "grpo", 0, [(0, 0, 0.4), (1000, 10, 0.6)])
    b = fake_run(tmp_path / "b", "dapo", 0, [(0, 0, 0.4), (1000, 10, 0.6)], ledger={field: value})
    found = flags(group_runs([load_run(a), load_run(b)]))
    assert any(f.startswith(f"UNFAIR setup: {label}") for f in found), found


def test_a_sampling_temperature_difference_is_unfair(tmp_path: Path) -> None:
    a = fake_run(tmp_path / "a", "grpo", 0, [(0, 0, 0.4), (1000, 10, 0.6)])
    hot = {
        "generation": {"temperature": 1.2, "top_p": 1.0, "max_new_tokens": 16, "eval_samples": 8}
    }
    b = fake_run(tmp_path / "b", "grpo", 0, [(0, 0, 0.4), (1000, 10, 0.6)], config=hot)
    found = flags(group_runs([load_run(a), load_run(b)]))
    assert any(f.startswith("UNFAIR setup: temperature") for f in found)


def test_failed_runs_are_reported_not_hidden(tmp_path: Path) -> None:
    ok = fake_run(tmp_path / "s0", "grpo", 0, [(0, 0, 0.4), (1000, 10, 0.6)])
    bad = fake_run(tmp_path / "s1", "grpo", 1, [(0, 0, 0.4)], failed="RuntimeError: boom")
    found = flags(group_runs([load_run(ok), load_run(bad)]))
    assert any("FAILED run" in f and "boom" in f and "seed 1" in f for f in found)


def test_summaries_of_several_seeds_read_mean_min_max() -> None:
    assert summarize([0.6, 0.8]) == "0.7 [0.6–0.8]"  # (0.6 + 0.8) / 2
    assert summarize([16, 16]) == "16"
    assert summarize(["a", "b"]) == "a / b"
    assert summarize([None]) == "–"


def test_interpolation_by_hand() -> None:
    # between (0, 0) and (10, 1): 0.25 at 2.5; between (10, 1) and (20, 3): 2 at 15
    assert interpolate([0, 10, 20], [0, 1, 3], [0, 2.5, 10, 15, 20]) == [0, 0.25, 1, 2, 3]


def test_band_is_mean_min_max_over_the_range_all_seeds_reached(tmp_path: Path) -> None:
    a = load_run(fake_run(tmp_path / "a", "grpo", 0, [(0, 0, 0.0), (100, 1, 1.0)]))
    b = load_run(fake_run(tmp_path / "b", "grpo", 1, [(0, 0, 0.2), (50, 1, 0.2), (200, 2, 0.2)]))
    grid, mean, low, high = band([a, b], "budget/generated_tokens")
    assert grid[0] == 0 and grid[-1] == 100  # b went further; the band stops where a stopped
    # at x = 100: a = 1.0, b = 0.2 -> mean 0.6, min 0.2, max 1.0
    assert mean[-1] == pytest.approx(0.6) and low[-1] == 0.2 and high[-1] == 1.0


def test_compare_writes_the_report_with_both_plots(tmp_path: Path) -> None:
    two_methods(tmp_path / "runs")
    text = compare([tmp_path / "runs" / "grpo", tmp_path / "runs" / "dapo"], tmp_path / "report")
    for name in ("report.md", "heldout_vs_tokens.png", "heldout_vs_wallclock.png"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    assert "UNFAIR budget: generated tokens" in text
    assert "| result | held-out pass@1 | 0.7 [0.6–0.8] | 0.8 [0.7–0.9] |" in text


def test_scores_at_the_budget_every_run_reached(tmp_path: Path) -> None:
    paths = two_methods(tmp_path / "runs")  # grpo ends at 1000 tokens, dapo at 2000
    groups = group_runs([load_run(p) for p in paths])
    found = at_equal_budget(groups)
    assert found is not None
    budget, scores = found
    # at 1000 tokens: grpo's own ends (0.6, 0.8); dapo's halfway from 0.4 to 0.7 / 0.9
    assert budget == 1000
    assert scores["grpo"] == pytest.approx([0.6, 0.8])
    assert scores["dapo"] == pytest.approx([0.55, 0.65])
    text = compare([tmp_path / "runs" / "grpo", tmp_path / "runs" / "dapo"], tmp_path / "out")
    assert "at 1000 generated tokens" in text and "- dapo: 0.6 [0.55–0.65]" in text
    one = group_runs([load_run(paths[0])])
    assert at_equal_budget(one) is None  # nothing to compare with


# --- every config difference, and a composition that names it ------------------------------

EVALS = [(0.0, 0.0, 0.4), (1000.0, 10.0, 0.6)]
DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


def resolved_run(
    path: Path,
    overrides: list[str],
    *,
    edit: dict[str, Any] | None = None,
    ledger: dict[str, Any] | None = None,
) -> Path:
    """A run directory whose config.yaml holds a real resolved config (grpo + ``overrides``,
    then ``edit`` on top, key by key), under an older first line that names nothing."""
    config = build_config("grpo", None, overrides).model_dump(mode="json")
    for dotted, value in (edit or {}).items():
        *sections, name = dotted.split(".")
        node = config
        for section in sections:
            node = node[section]
        node[name] = value
    return fake_run(path, "grpo", config["seed"], EVALS, config=config, ledger=ledger)


def _groups(*paths: Path) -> dict[str, list[Any]]:
    return group_runs([load_run(p) for p in paths])


def _config_flags(*paths: Path) -> list[str]:
    return [f for f in flags(_groups(*paths)) if f.startswith("CONFIG differs")]


def _compositions(*paths: Path) -> dict[str, str]:
    return {label: runs[0].composition for label, runs in _groups(*paths).items()}


def test_lora_against_full_fine_tuning_is_flagged_and_named(tmp_path: Path) -> None:
    # same preset, same seed; only model.lora_rank differs (0 is full fine-tuning)
    full = resolved_run(tmp_path / "full" / "seed0", [])
    lora = resolved_run(tmp_path / "lora" / "seed0", ["model.lora_rank=8"])
    assert _config_flags(full, lora) == [
        "CONFIG differs: model.lora_rank (grpo (full): 0, grpo (lora): 8)"
    ]
    names = _compositions(full, lora)
    # α unset is 2·r = 16; the targets are the default seven projections
    assert names["grpo (lora)"].endswith(f" · LoRA r=8, α=16 on {DEFAULT_TARGETS}")
    assert "LoRA" not in names["grpo (full)"]
    text = compare([full, lora], tmp_path / "report")
    assert "- CONFIG differs: model.lora_rank (grpo (full): 0, grpo (lora): 8)" in text
    assert "LoRA r=8, α=16 on" in text  # the composition line of the side-by-side table


def test_lora_targets_and_scale_are_named(tmp_path: Path) -> None:
    a = resolved_run(tmp_path / "a" / "s", ["model.lora_rank=4", "model.lora_alpha=4"])
    b = resolved_run(
        tmp_path / "b" / "s", ["model.lora_rank=4", "model.lora_targets=q_proj,v_proj"]
    )
    assert _config_flags(a, b) == [
        "CONFIG differs: model.lora_alpha (grpo (a): 4, grpo (b): null)",
        f"CONFIG differs: model.lora_targets (grpo (a): {json.dumps(DEFAULT_TARGETS.split(','))}"
        ", grpo (b): q_proj,v_proj)",  # as written: a list, or one comma-separated string
    ]
    names = _compositions(a, b)
    assert names["grpo (a)"].endswith(f"LoRA r=4, α=4 on {DEFAULT_TARGETS}")
    assert names["grpo (b)"].endswith("LoRA r=4, α=8 on q_proj,v_proj")  # α = 2·4


def test_learners_and_sharding_are_flagged_and_named(tmp_path: Path) -> None:
    one = resolved_run(tmp_path / "one" / "s", [])
    ddp = resolved_run(tmp_path / "ddp" / "s", ["system.learners=2"])
    fsdp = resolved_run(
        tmp_path / "fsdp" / "s", ["system.learners=2", "system.learner_sharding=fsdp2"]
    )
    assert _config_flags(one, ddp, fsdp) == [
        # in the order of config.yaml's keys (fake_run's YAML sorts them)
        "CONFIG differs: system.learner_sharding (grpo (one): ddp, grpo (ddp): ddp, "
        "grpo (fsdp): fsdp2)",
        "CONFIG differs: system.learners (grpo (one): 1, grpo (ddp): 2, grpo (fsdp): 2)",
    ]
    names = _compositions(one, ddp, fsdp)
    assert names["grpo (one)"].endswith("· synchronous group barrier (hf, inprocess)")
    assert names["grpo (ddp)"].endswith("(hf, inprocess, 2 ddp learners)")
    assert names["grpo (fsdp)"].endswith("(hf, inprocess, 2 fsdp2 learners)")


def test_precision_is_named_and_flagged_once(tmp_path: Path) -> None:
    f32 = resolved_run(tmp_path / "f32" / "s", [])
    bf16 = resolved_run(tmp_path / "bf16" / "s", ["system.train_dtype=bfloat16"])
    assert _compositions(f32, bf16)["grpo (bf16)"].endswith(
        "(hf, inprocess, train bfloat16 / rollout float32)"
    )
    # a ledger that does not tell them apart: the config difference says it
    assert _config_flags(f32, bf16) == [
        "CONFIG differs: system.train_dtype (grpo (f32): float32, grpo (bf16): bfloat16)"
    ]
    # the ledger's precision line flags it: not repeated as a config difference
    precision = {"precision": "train bfloat16 autocast / rollout float32"}
    shutil.rmtree(tmp_path / "bf16")
    bf16 = resolved_run(tmp_path / "bf16" / "s", ["system.train_dtype=bfloat16"], ledger=precision)
    found = flags(_groups(f32, bf16))
    assert any(f.startswith("UNFAIR setup: precision differs") for f in found)
    assert not any(f.startswith("CONFIG differs") for f in found)


def test_bookkeeping_is_not_a_config_difference(tmp_path: Path) -> None:
    # two groups (lora_rank splits them) that also differ in everything NOT_COMPARED holds
    a = resolved_run(tmp_path / "a" / "s", [])
    other = {
        "seed": 3,
        "recipe": "renamed",
        "run.eval_every": 5,
        "run.progress": False,
        "model.path": "/elsewhere/same-weights",
        "data.eval_path": "/elsewhere/heldout.jsonl",
    }
    b = resolved_run(tmp_path / "b" / "s", ["model.lora_rank=2"], edit=other)
    assert _config_flags(a, b) == ["CONFIG differs: model.lora_rank (grpo: 0, renamed: 2)"]


def test_every_left_out_field_is_a_config_field_and_says_why() -> None:
    dumped = RecipeConfig().model_dump()
    for dotted, why in NOT_COMPARED.items():
        section, _, name = dotted.partition(".")
        assert section in dumped and (not name or name in dumped[section]), dotted
        assert len(why.split()) >= 8, dotted  # a reason, not a label
    shown = {f for line in LINES for f in line.fields}
    for dotted in shown:
        section, _, name = dotted.partition(".")
        assert name in dumped[section], dotted


def test_a_config_that_no_longer_loads_keeps_its_written_composition(tmp_path: Path) -> None:
    old = resolved_run(tmp_path / "old" / "s", [], edit={"model.retired_field": 1})
    assert load_run(old).composition == "grpo: composition"  # fake_run's first line
    new = resolved_run(tmp_path / "new" / "s", [])
    assert load_run(new).composition.startswith("verifier(exact_match) · G=8 per prompt")


def test_no_difference_reads_none(tmp_path: Path) -> None:
    a = resolved_run(tmp_path / "a" / "s", [])
    b = resolved_run(tmp_path / "b" / "s", [], edit={"seed": 1})
    assert flags(_groups(a, b)) == [] and len(_groups(a, b)) == 1
    text = compare([a, b], tmp_path / "report")
    assert "- none: same config, same setup, budgets within 10%" in text
    assert "| method | composition |" in table(_groups(a, b))


def test_not_a_run_directory_is_a_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a run directory"):
        find_runs([tmp_path])


# --- end to end: --seeds, then compare ------------------------------------------------------

Toy = Callable[..., list[str]]


def test_seeds_then_compare_from_the_command_line(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy, capsys: pytest.CaptureFixture[str]
) -> None:
    for recipe in ("grpo", "dapo"):
        extra = ["feedback.overlong_cache=2"] if recipe == "dapo" else []
        args = ["train", "--recipe", recipe, "--seeds", "2", "--out", str(tmp_path / recipe)]
        assert main([*args, *toy(tiny_model_dir), *extra]) == 0
    for recipe in ("grpo", "dapo"):
        assert sorted(p.name for p in (tmp_path / recipe).iterdir()) == ["seed0", "seed1"]
    out = tmp_path / "report"
    assert main(["compare", str(tmp_path / "grpo"), str(tmp_path / "dapo"), "--out", str(out)]) == 0
    report = (out / "report.md").read_text()
    tokens = {
        r: [
            json.loads((tmp_path / r / s / "ledger.json").read_text())["generated_tokens"]
            for s in ("seed0", "seed1")
        ]
        for r in ("grpo", "dapo")
    }
    ratio = max(sum(v) for v in tokens.values()) / min(sum(v) for v in tokens.values())
    assert ("UNFAIR budget: generated tokens" in report) == (ratio > 1.1)
    assert "seeds | 0 / 1 | 0 / 1" in report
    assert "UNFAIR setup" not in report  # same base, tokenizer, prompts, verifier, sampling
    # the presets' reductions differ (grpo: per response, dapo: per token), named by field
    assert "- CONFIG differs: reduction.name (grpo: response_mean, dapo: token_mean)" in report


def test_a_failing_seed_is_kept_and_the_sweep_goes_on(
    tiny_model_dir: Path, tmp_path: Path, toy: Toy, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = train_module.run_training

    def flaky(cfg: Any, run_dir: Path, **kw: Any) -> dict[str, Any]:
        if cfg.seed == 1:
            raise RuntimeError("disk full")
        return real(cfg, run_dir, **kw)

    monkeypatch.setattr(train_module, "run_training", flaky)
    args = ["train", "--seeds", "2", "--out", str(tmp_path / "sweep"), *toy(tiny_model_dir)]
    assert main(args) == 1
    assert (tmp_path / "sweep" / "seed0" / "summary.json").exists()
    assert "disk full" in (tmp_path / "sweep" / "seed1" / "FAILED").read_text()
