"""What several commands share: transformers kept quiet, ``--device`` resolved, and flag
values checked, each failure one line naming the flag.
"""

from __future__ import annotations

import argparse
from typing import Any

from rlmap.core.errors import ConfigError


def quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # rlmap's own progress bar says what matters


def resolve_device(args: argparse.Namespace) -> Any:
    """``--device`` resolved (:func:`rlmap.core.device.resolve`), or a one-line error."""
    from rlmap.core.device import resolve

    return resolve(args.device, field="--device")


def at_least(low: int, **values: int | None) -> None:
    """ConfigError naming the flag (``--batch-size``) of the first given value below ``low``."""
    for name, value in values.items():
        if value is not None and value < low:
            raise ConfigError(f"--{name.replace('_', '-')}: must be >= {low}, got {value}")
