"""Small Hugging Face helpers shared by the models rlmap builds on a trunk (critic, RM)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


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
