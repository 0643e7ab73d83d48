"""The check that every name a run wrote to ``metrics.jsonl`` is declared in
:mod:`rlmap.core.metrics` (docs/metrics.md). The end-to-end and loop tests run it on every run
directory they leave under ``tmp_path`` (``tests/conftest.py``'s ``_declared_metrics``),
so each run kind those tests make (every critic-free preset, PPO, VAPO, the calculator and tool
tasks, classic RLHF, the asynchronous loop, resumes …) is checked without a run of its own."""

from __future__ import annotations

import json
from pathlib import Path

from rlmap.core.metrics import unregistered


def undeclared_names(root: Path) -> dict[str, list[str]]:
    """{metrics.jsonl path: its names the registry lacks} for every ``metrics.jsonl`` under
    ``root``; a line that is not a JSON object (a test's torn or hand-broken file) is skipped."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("metrics.jsonl")):
        names: set[str] = set()
        for line in path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                names |= set(row)
        missing = unregistered(names)
        if missing:
            found[str(path)] = missing
    return found


def assert_declared(root: Path) -> None:
    """Fail, naming the file and the names, when a run under ``root`` emitted an undeclared
    metric: declare it in src/rlmap/core/metrics.py and regenerate docs/metrics.md."""
    found = undeclared_names(root)
    assert not found, f"metrics not in rlmap.core.metrics (docs/metrics.md): {found}"
