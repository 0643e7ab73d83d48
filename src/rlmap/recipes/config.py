"""The typed run config: one section per axis plus model, data, generation, optimiser.

Each axis owns the frozen dataclass of its hyper-parameters; this model only
composes them, so the math never sees a config object. Loading goes YAML →
(preset named by ``recipe``) → dotted overrides → type validation → combination
checks (:mod:`rlmap.recipes.validate`), and every failure is a one-line
:class:`~rlmap.core.errors.ConfigError` that names the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pydantic
import yaml

from rlmap.core.errors import ConfigError
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
from rlmap.recipes.system_params import SystemParams
from rlmap.reduction.params import ReductionParams
from rlmap.sampling.params import SamplingParams


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


def deep_merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = _deep_copy(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
