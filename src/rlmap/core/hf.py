"""Small Hugging Face helpers: models built on a trunk (critic, RM), a model's context, and
the installed companions of torch that transformers imports."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import logging
from collections.abc import Iterator
from typing import Any

from rlmap.core.errors import first_line

CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
"""The config fields that give a model's context, first found wins."""


def context_length(config: Any) -> int | None:
    """The model's context in positions, from its config (None when it does not say)."""
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def head_dim(config: Any) -> int:
    """The attention head dimension of a model config (or anything with its fields): its
    ``head_dim``, else ``hidden_size / num_attention_heads``."""
    return int(
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )


def loading_onto(device: Any) -> dict[str, Any]:
    """``from_pretrained`` keywords that load a model's weights straight onto a GPU
    ``device`` (``device_map``), never through a whole host copy; none for the CPU (or
    None), where ``from_pretrained`` loads anyway."""
    if device is None or device.type != "cuda":
        return {}
    return {"device_map": {"": device}}


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


TORCH_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
"""Packages built against one torch build, which transformers imports when present; rlmap
needs none of them (vLLM's CPU wheel pulls them in)."""


def companion_problem() -> str | None:
    """One line saying what to run when an installed torch companion cannot be imported
    (None when none is installed, or all import): a torchvision built for another torch
    fails at import, and transformers then reports every model class as missing (``Could
    not import module 'PreTrainedModel'``), naming neither the package nor the cure. Its
    metadata cannot tell (``torch>=2.13`` is met by a CPU build the wheel was not built
    for), so the check imports it: nothing to pay when none is installed."""
    for name in TORCH_COMPANIONS:
        if importlib.util.find_spec(name) is None:
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:  # RuntimeError (a missing operator), ImportError, OSError
            return (
                f"{name} cannot be imported with the installed torch ({first_line(exc)}); "
                "vLLM's CPU build brings it and rlmap needs none of it: run "
                f"pip uninstall -y {' '.join(TORCH_COMPANIONS)}"
            )
    return None
