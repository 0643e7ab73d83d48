"""Recipes as data: a typed config naming one component per axis, presets, validation."""

from rlmap.recipes.build import build_config, load_config
from rlmap.recipes.catalog import preset, registry
from rlmap.recipes.config import RecipeConfig
from rlmap.recipes.explain import composition, explain
from rlmap.recipes.validate import validate

__all__ = [
    "RecipeConfig",
    "build_config",
    "composition",
    "explain",
    "load_config",
    "preset",
    "registry",
    "validate",
]
