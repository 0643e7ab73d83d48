"""The typed run config: one section per axis plus model, data, generation, optimiser.

Each axis owns the frozen dataclass of its hyper-parameters; this model only
composes them, so the math never sees a config object. Loading goes YAML →
(preset named by ``recipe``) → dotted overrides → type validation → combination
checks (:mod:`rlmap.recipes.validate`), and every failure is a one-line
:class:`~rlmap.core.errors.ConfigError` that names the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic
import yaml

from rlmap.core.errors import ConfigError, InputError
from rlmap.correction.params import BehaviourParams, KLParams
from rlmap.estimators.params import CreditParams, CriticParams
from rlmap.feedback.params import FeedbackParams
from rlmap.recipes.sections import (
    DataConfig,
    GenerationConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
)
from rlmap.reduction.params import ReductionParams
from rlmap.sampling.params import SamplingParams
from rlmap.system.params import SystemParams
from rlmap.tasks.registry import kind_of


class RecipeConfig(pydantic.BaseModel):
    """A full run: one component per axis, with every hyper-parameter written out."""

    model_config = pydantic.ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    recipe: str = "grpo"
    """The preset this config was built from (informational once resolved)."""
    seed: int = 0
    """Seed of every random stream of the run (data, sampling, initialisation)."""
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    generation: GenerationConfig = GenerationConfig()
    feedback: FeedbackParams = FeedbackParams()
    """Axis 1: is the reward reliable?"""
    sampling: SamplingParams = SamplingParams()
    """Axis 2: how many trajectories per state?"""
    credit: CreditParams = CreditParams()
    """Axis 3: how far must credit travel?"""
    critic: CriticParams = CriticParams()
    """The value critic used by critic-based credit (GAE, V-trace)."""
    behaviour: BehaviourParams = BehaviourParams()
    """Axis 4: which distribution produced the data, and how is the update corrected?"""
    kl: KLParams = KLParams()
    """KL to the reference policy (in the reward or in the loss)."""
    reduction: ReductionParams = ReductionParams()
    """Axis 5: in what unit is the loss averaged?"""
    system: SystemParams = SystemParams()
    """Axis 6: wait at a barrier, or drift asynchronously?"""
    optim: OptimConfig = OptimConfig()
    run: RunConfig = RunConfig()

    def to_yaml(self) -> str:
        """The config as YAML; ``load_config`` reads it back to an equal config."""
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)


def from_mapping(data: Mapping[str, Any]) -> RecipeConfig:
    """Type-checked config from plain data; a type error names its dotted field."""
    try:
        return RecipeConfig.model_validate(dict(data))
    except pydantic.ValidationError as exc:
        raise ConfigError(_one_line(exc)) from None


def _one_line(exc: pydantic.ValidationError) -> str:
    err = exc.errors()[0]
    field = ".".join(str(part) for part in err["loc"])
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        return f"{field}: unknown config field{more}"
    got = err.get("input")
    shown = f", got {got!r}" if isinstance(got, str | int | float | bool) else ""
    return f"{field}: {err['msg']}{shown}{more}"


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` overrides to nested plain data (a new dict).

    Values are parsed as YAML scalars/lists (``0.5``, ``true``, ``[tis]``); type
    coercion and unknown-key errors come from validation afterwards.
    """
    out = _deep_copy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override '{item}': expected dotted.key=value")
        node = out
        *parents, leaf = key.split(".")
        for i, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{'.'.join(parents[: i + 1])}: is a value, not a section")
            node = child
        node[leaf] = _parse_scalar(raw)
    return out


def _parse_scalar(raw: str) -> Any:
    try:
        return yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        return raw


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = _deep_copy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from a file; InputError naming the file (and line) when it is not one.

    A missing path, a directory, a file that is not UTF-8 or not YAML, and a YAML value
    other than a mapping are each one line that starts with the path.
    """
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{p}: no such config file") from None
    except IsADirectoryError:
        raise InputError(f"{p}: is a directory, not a config file") from None
    except OSError as exc:
        raise InputError(f"{p}: cannot read the config file ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        line = p.read_bytes()[: exc.start].count(b"\n") + 1
        byte = exc.object[exc.start]
        raise InputError(f"{p}:{line}: not UTF-8 text (byte {byte:#04x})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise InputError(f"{p}{where}: not valid YAML") from None
    except RecursionError:
        raise InputError(f"{p}: not valid YAML (nested too deeply)") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{p}: expected a mapping of config sections at the top level")
    return data


def build_config(
    recipe: str | None = None,
    file_data: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
) -> RecipeConfig:
    """Preset (``recipe`` or the file's ``recipe:``) ← file ← overrides, validated.

    The preset supplies every field the file and overrides leave out, so a YAML
    file may say only ``recipe: dapo`` and the three values it changes.
    """
    from rlmap.recipes.catalog import preset
    from rlmap.recipes.validate import validate

    file_data = dict(file_data or {})
    name = recipe or str(file_data.get("recipe", "grpo"))
    base = preset(name).model_dump(mode="json")
    merged = apply_overrides(_merge(base, file_data), overrides)
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
