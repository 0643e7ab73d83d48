"""The map's commands answer without loading the training stack: no transformers import.

`rlmap recipes`, `explain`, `config` and `advise` read configs and tables; transformers
costs ~1 s to import (and a package __init__ that re-exports an engine pulls it in through
any submodule). Each command runs in a fresh interpreter, since this test process has
long imported everything.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import importlib, os, sys
from rlmap.cli import main
if os.environ.get("PRELOAD"):
    importlib.import_module(os.environ["PRELOAD"])
code = main(sys.argv[1:])
heavy = sorted(m for m in ("transformers", "peft", "vllm", "ray") if m in sys.modules)
print("HEAVY=" + ",".join(heavy))
sys.exit(code or 0)
"""


def _heavy_modules(args: list[str], preload: str = "") -> str:
    env = {**os.environ, "PRELOAD": preload}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env=env,
    )
    return out.stdout.rsplit("HEAVY=", 1)[1].strip()


@pytest.mark.parametrize(
    "args",
    [
        ["recipes"],
        ["explain", "grpo"],
        ["explain", "behaviour.objective=dro"],
        ["config", "--recipe", "ppo", "data.task=gym:FrozenLake-v1"],
        ["config", "--recipe", "grpo", "data.task=calculator"],
        ["advise", "--multi-turn", "--barrier", "severe"],
    ],
    ids=" ".join,
)
def test_map_commands_do_not_import_the_training_stack(args: list[str]) -> None:
    assert _heavy_modules(args) == ""


def test_the_probe_sees_a_heavy_import() -> None:
    # The negative control: with the engine module imported first (as the package __init__
    # once did), the probe must see transformers; were it blind (wrong module names, output
    # lost), the test above would pass whatever the commands import.
    assert "transformers" in _heavy_modules(["recipes"], "rlmap.engines.hf").split(",")
