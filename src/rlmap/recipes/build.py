"""A recipe's config built: preset ← file ← overrides, the task's own defaults filled in
(verifier, model, curriculum level), then validated.

The config's schema is :mod:`rlmap.recipes.config`; the presets :mod:`rlmap.recipes.catalog`;
the checks :mod:`rlmap.recipes.validate`. This module is the one that uses all three.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlmap.recipes.catalog import preset
from rlmap.recipes.config import RecipeConfig, apply_overrides, deep_merge, from_mapping
from rlmap.recipes.validate import validate
from rlmap.runs.rundir import read_yaml
from rlmap.tasks.registry import kind_of


def build_config(
    recipe: str | None = None,
    file_data: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
) -> RecipeConfig:
    """Preset (``recipe`` or the file's ``recipe:``) ← file ← overrides, validated.

    The preset supplies every field the file and overrides leave out, so a YAML
    file may say only ``recipe: dapo`` and the three values it changes.
    """
    file_data = dict(file_data or {})
    name = recipe or str(file_data.get("recipe", "grpo"))
    base = preset(name).model_dump(mode="json")
    merged = apply_overrides(deep_merge(base, file_data), overrides)
    merged["recipe"] = merged.get("recipe", name) if recipe is None else recipe
    _task_verifier(merged, overrides)
    _task_model(merged, file_data, overrides)
    config = from_mapping(merged)
    if _curriculum_target(config, merged):
        config = from_mapping(merged)
    validate(config)
    return config


def _curriculum_target(config: RecipeConfig, merged: dict[str, Any]) -> bool:
    """With ``sampling.curriculum`` on a task with a curriculum of levels (reasoning-gym's),
    ``data.task_args`` gets the curriculum's settings at ``sampling.curriculum_top`` (None:
    the highest level, which is then named): the held-out set, the tokenizer and the warm
    start are then those of training at the top level directly, and a saved config says
    which task it was evaluated on. Settings given that disagree with the top level are a
    ConfigError naming the field; True when ``merged`` changed. Anything else the
    curriculum cannot be used with is :func:`rlmap.recipes.validate.validate`'s to say."""
    s, d = config.sampling, config.data
    curriculum = kind_of(d.task).curriculum
    if not s.curriculum or curriculum is None:
        return False
    found = curriculum.target(d.task, d.task_args, s.curriculum_top)
    if found is None:
        return False
    target, top = found
    merged["data"]["task_args"] = target
    merged["sampling"]["curriculum_top"] = top
    return dict(d.task_args or {}) != target or s.curriculum_top != top


ITEM_VERIFIERS = ("reasoning_gym", "reasoning_gym_partial")
"""The verifiers that read reasoning-gym items (:mod:`rlmap.feedback.reasoning_gym`)."""


def _task_verifier(merged: dict[str, Any], overrides: Sequence[str]) -> None:
    """The verifier follows the task unless an override names one: a reasoning-gym task is
    scored by its own ``score_answer`` (``reasoning_gym``, in place of the default
    ``exact_match``), any other task by ``exact_match`` in place of an item verifier (a
    reasoning-gym run's saved config reused for another task). Rows whose answers are
    GSM8K or MATH solutions (``data.answer_format``) get ``math_equiv`` in place of
    ``exact_match``: their references are numbers and LaTeX, seldom a response verbatim.
    ``reasoning_gym_partial`` trains on partial credit; its held-out pass@k counts full
    scores (``eval_verifier`` ``reasoning_gym``) unless an override says otherwise."""
    feedback = merged.setdefault("feedback", {})
    data = merged.get("data") if isinstance(merged.get("data"), Mapping) else {}
    task = data.get("task") if isinstance(data, Mapping) else None
    own = kind_of(task).default_verifier if isinstance(task, str) else None
    items = isinstance(task, str) and kind_of(task).items
    solutions = isinstance(data, Mapping) and data.get("answer_format") in ("gsm8k", "math")
    if not _overridden(overrides, "feedback.verifier"):
        verifier = feedback.get("verifier", "exact_match")
        if own is not None and verifier == "exact_match":
            feedback["verifier"] = own
        elif solutions and verifier == "exact_match":
            feedback["verifier"] = "math_equiv"
        elif not items and verifier in ITEM_VERIFIERS:
            feedback["verifier"] = "exact_match"
    if not _overridden(overrides, "feedback.eval_verifier"):
        if feedback.get("verifier") == "reasoning_gym_partial" and not feedback.get(
            "eval_verifier"
        ):
            feedback["eval_verifier"] = "reasoning_gym"
        elif not items and feedback.get("eval_verifier") in ITEM_VERIFIERS:
            feedback["eval_verifier"] = None


def _task_model(
    merged: dict[str, Any], file_data: Mapping[str, Any], overrides: Sequence[str]
) -> None:
    """The model follows the task unless the file or an override names one: a task whose
    kind names an embedded model (reasoning-gym's, or a mixture of them: the chat model,
    :data:`rlmap.tasks.sources.reasoning_gym.PROSE_MODEL`) gets it in place of the preset's
    embedded default."""
    model, data = merged.get("model"), merged.get("data")
    if not isinstance(model, dict) or not isinstance(data, Mapping):
        return
    named = isinstance(file_data.get("model"), Mapping) and "path" in file_data["model"]
    task = data.get("task")
    if named or _overridden(overrides, "model.path") or not isinstance(task, str):
        return
    wanted = kind_of(task).embedded_model
    if wanted is not None and model.get("path") == "embedded:tiny":
        model["path"] = wanted


def embedded_task_note(config: RecipeConfig) -> str | None:
    """One line to say before training the task on its model (None when there is nothing
    to say): the task kind's own note (reasoning-gym's on an embedded model)."""
    d = config.data
    return kind_of(d.task).note(d.task, config.model.path, d.task_args)


def _overridden(overrides: Sequence[str], dotted: str) -> bool:
    return any(o.partition("=")[0].strip() == dotted for o in overrides)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RecipeConfig:
    """A validated config from a YAML file plus dotted overrides."""
    return build_config(None, read_yaml(path), overrides)
