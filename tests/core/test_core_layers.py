"""The import contracts of pyproject.toml hold, and each one can fail.

`make lint` runs `lint-imports` on the tree; here a copy of the package gets one planted
import and the linter must refuse the copy, naming the broken contract: an axis importing a
task or another axis, and one upward (or sideways, between independent packages) import
across each boundary of the layers, bottom to top; and an import cycle inside a package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(src: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}  # the copy before the installed tree
    return subprocess.run(
        [str(LINT), "--no-cache", str(ROOT / "pyproject.toml")],
        cwd=src,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    if not LINT.exists():
        pytest.skip("import-linter is not installed (the dev extra has it)")
    shutil.copytree(
        ROOT / "src" / "rlmap", tmp_path / "rlmap", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    out = _lint(tree)
    assert out.returncode == 0, out.stdout[-2000:]
    assert "0 broken" in out.stdout


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("estimators/gae.py", "from rlmap.tasks import arithmetic", "import only rlmap.core"),
        ("feedback/reward.py", "import rlmap.tasks.env", "import only rlmap.core"),
        ("core/ops.py", "from rlmap.sampling import filters", "Layers:"),  # core at the bottom
        ("reduction/apply.py", "import rlmap.correction.kl", "Layers:"),  # axes are siblings
        ("runs/rundir.py", "import rlmap.engines.engine", "Layers:"),  # runs below the engines
        ("runs/samples.py", "import rlmap.experiments.train", "Layers:"),
        ("models/lora.py", "import rlmap.learner.policy", "Layers:"),  # models below learner
        ("engines/hf.py", "from rlmap.learner import logprobs", "Layers:"),  # independent
        ("tasks/env.py", "import rlmap.recipes.config", "Layers:"),  # tasks below recipes
        ("simulator/model.py", "import rlmap.recipes.config", "Layers:"),
        ("diagnostics/stats.py", "import rlmap.rollout.evaluate", "Layers:"),
        ("recipes/config.py", "import rlmap.system.sync", "Layers:"),  # a config, not its loop
        ("embedded/tiny.py", "import rlmap.recipes.config", "Layers:"),  # independent
        ("learned/reward_model.py", "import rlmap.rollout.scoring", "Layers:"),  # independent
        ("rollout/episodes.py", "import rlmap.assembly.parts", "Layers:"),
        ("assembly/parts.py", "import rlmap.system.sync", "Layers:"),
        ("system/sync.py", "import rlmap.experiments.train", "Layers:"),
        ("experiments/train.py", "import rlmap.advise.advice", "Layers:"),  # independent
        ("advise/advice.py", "import rlmap.cli", "Layers:"),
        ("recipes/config.py", "import rlmap.recipes.build", "No import cycle"),  # build → config
        ("tasks/kind.py", "import rlmap.tasks.registry", "No import cycle"),  # → sources → kind
    ],
)
def test_a_planted_import_breaks_its_contract(
    tree: Path, module: str, planted: str, contract: str
) -> None:
    path = tree / "rlmap" / module
    text = path.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    assert sep, module  # every module starts with it: the plant goes after it
    path.write_text(f"{head}{sep}{planted}  # noqa\n{rest}")
    out = _lint(tree)
    assert out.returncode != 0
    said = " ".join(out.stdout.split())  # the linter wraps long contract names
    assert f"{contract}" in said and "BROKEN" in said, out.stdout[-2000:]
