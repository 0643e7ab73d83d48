"""The small shared core every axis may import: the batch record, registries, errors."""

from rlmap.core.batch import Batch, End, RewardStatus
from rlmap.core.errors import ConfigError, UnknownComponentError
from rlmap.core.registry import Registry

__all__ = ["Batch", "ConfigError", "End", "Registry", "RewardStatus", "UnknownComponentError"]
