"""The `rlmap recipes`, `rlmap explain` and `rlmap config` commands."""

from __future__ import annotations

import pytest

from rlmap.cli import main
from rlmap.recipes import registry


def test_recipes_lists_every_preset_with_composition(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == list(registry.names())
    assert all(line.count(" · ") == 5 for line in lines)  # six axes, five separators


@pytest.mark.parametrize("name", ["dapo", "sao"])
def test_explain_prints_the_full_composition(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", name]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{name}: ") and "scaled for the embedded default" in out


def test_unknown_recipe_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "dappo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown recipe or component 'dappo'" in err and "dapo" in err


def test_config_prints_resolved_yaml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--recipe", "dapo", "optim.lr=3e-5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# dapo: ") and "lr: 3.0e-05" in out


def test_config_rejects_invalid_combination(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--recipe", "grpo", "sampling.group_size=1"]) == 2
    assert capsys.readouterr().err.startswith("rlmap: error: sampling.group_size:")


def test_overrides_may_follow_options() -> None:
    from rlmap.cli import parse

    args = parse(["train", "--recipe", "grpo", "optim.lr=1e-5", "--out", "x", "optim.steps=3"])
    assert args.overrides == ["optim.lr=1e-5", "optim.steps=3"] and args.out == "x"
    with pytest.raises(SystemExit):
        parse(["train", "--out", "x", "--bogus"])
    with pytest.raises(SystemExit):
        parse(["recipes", "optim.lr=1"])  # a command without overrides takes none
