"""The anchors' own functions, for the tests that compare rlmap's with them.

``make test`` installs them (``ANCHORS`` in the Makefile) into a folder of their own,
``.venv/anchors`` (``RLMAP_ANCHORS`` names another), never into the virtualenv: verl's wheel
ships a top-level ``tests`` package. :func:`anchor` imports a module from there with that
folder at the *end* of ``sys.path`` (nothing of the environment's is shadowed), and puts the
process's environment variables and warning filters back afterwards (importing verl sets
four variables and fifteen filters). A test whose anchor is not installed skips, saying so.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

ANCHORS = Path(os.environ.get("RLMAP_ANCHORS", Path(__file__).parents[1] / ".venv" / "anchors"))


def anchor(module: str) -> ModuleType:
    """``module`` imported from the anchors' folder, or the calling test skipped."""
    if ANCHORS.is_dir() and str(ANCHORS) not in sys.path:
        sys.path.append(str(ANCHORS))
    environ = dict(os.environ)
    try:
        with warnings.catch_warnings():
            return importlib.import_module(module)
    except ImportError as exc:
        pytest.skip(
            f"{module} is not installed ({exc}); make test installs it into {ANCHORS}",
            allow_module_level=True,
        )
    finally:
        os.environ.clear()
        os.environ.update(environ)
