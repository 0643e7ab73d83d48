"""Small Hugging Face helpers: models built on a trunk (critic, RM), a model's context."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""The config fields that give a model's context, first found wins."""


def context_length(config: Any) -> int | None:
    """The model's context in positions, from its config (None when it does not say)."""
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _errors_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.ERROR


@contextlib.contextmanager
def quiet_new_head() -> Iterator[None]:
    """Silence the load report of a checkpoint that gets a new head (expected, not a fault).

    A causal-LM checkpoint has no ``score`` head, so transformers reports it as newly
    initialised; the caller checks what is missing itself. A filter, not a level:
    transformers runs extra checks when its logger's level is set. Errors still show.
    """
    logger = logging.getLogger("transformers.modeling_utils")
    logger.addFilter(_errors_only)
    try:
        yield
    finally:
        logger.removeFilter(_errors_only)
