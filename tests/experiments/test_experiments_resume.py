"""Which config changes a resume sees: fields added to rlmap after the checkpoint are not."""

from __future__ import annotations

from rlmap.experiments.resume import config_changes
from rlmap.recipes.build import build_config


def _saved_without(fields: list[tuple[str, str]]) -> dict:
    saved = build_config("grpo", None, ["optim.steps=5"]).model_dump(mode="json")
    for section, name in fields:
        del saved[section][name]  # as a checkpoint written before the field existed
    return saved


def test_a_field_added_since_the_checkpoint_is_no_change() -> None:
    saved = _saved_without([("run", "loggers"), ("run", "project"), ("sampling", "group_scope")])
    cfg = build_config("grpo", None, ["optim.steps=5"])
    assert config_changes(saved, cfg) == []


def test_a_new_field_set_to_something_else_is_a_change() -> None:
    # the old run trained without a tracker project of its own: asking for one is a change
    saved = _saved_without([("run", "project")])
    cfg = build_config("grpo", None, ["optim.steps=5", "run.project=mine"])
    assert config_changes(saved, cfg) == [("run.project", "rlmap", "mine")]


def test_a_changed_old_field_is_still_named() -> None:
    saved = _saved_without([("run", "loggers")])
    cfg = build_config("grpo", None, ["optim.steps=5", "optim.lr=0.5"])
    assert config_changes(saved, cfg) == [("optim.lr", saved["optim"]["lr"], 0.5)]
