"""The runs of a comparison: run directories read (failed ones kept, with why), then grouped
by config up to the seed (:mod:`rlmap.experiments.compare`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError, InputError
from rlmap.core.metrics import upgrade_row
from rlmap.recipes.config import from_mapping
from rlmap.recipes.explain import composition
from rlmap.runs.rundir import MetricsLog, read_json_object, read_yaml

FAILED_FILE = "FAILED"
"""Written into a run directory by ``rlmap train --seeds`` when that run raised."""


@dataclass(frozen=True)
class Run:
    """One run directory, read."""

    path: Path
    config: dict[str, Any]
    """``config.yaml`` as a mapping (the resolved config)."""
    composition: str
    """The first line of ``config.yaml``: the recipe's full composition."""
    ledger: dict[str, Any]
    summary: dict[str, Any] | None
    records: list[dict[str, Any]]
    failure: str | None
    """Why the run has no result (the ``FAILED`` file, or a missing ``summary.json``)."""

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def recipe(self) -> str:
        return str(self.config.get("recipe", "?"))


def find_runs(paths: Sequence[Path]) -> list[Path]:
    """Run directories among ``paths``: each one itself, or the runs directly inside it."""
    found: list[Path] = []
    for path in map(Path, paths):
        if (path / "config.yaml").is_file():
            found.append(path)
            continue
        if not path.exists():
            raise InputError(f"{path}: no such run directory")
        inner = (
            sorted(p for p in path.iterdir() if (p / "config.yaml").is_file())
            if path.is_dir()
            else []
        )
        if not inner:
            raise InputError(
                f"{path}: not a run directory (no config.yaml), nor a directory of runs"
            )
        found += inner
    return found


def load_run(path: Path) -> Run:
    """Read a run directory; a run that did not finish is returned with its ``failure``.

    A file of the run that exists but cannot be read (not UTF-8, not JSON, a torn line
    before the last in ``metrics.jsonl``, a ledger that is not a JSON object) is an
    :class:`InputError` naming the file: a report from half a run would mislead.
    """
    config = read_yaml(path / "config.yaml")
    if isinstance(config.get("seed", 0), bool) or not isinstance(config.get("seed", 0), int):
        raise InputError(f"{path / 'config.yaml'}: seed: expected an integer")
    first = (path / "config.yaml").read_bytes().decode("utf-8-sig").partition("\n")[0]
    written = first.removeprefix("# ").strip()
    ledger = read_json_object(path / "ledger.json", "ledger") or {}
    summary = read_json_object(path / "summary.json", "run summary")
    records = [upgrade_row(r) for r in MetricsLog.read(path / "metrics.jsonl")]  # old names
    failure = None
    if (path / FAILED_FILE).exists():
        failure = (path / FAILED_FILE).read_text(errors="replace").strip() or "failed"
    elif summary is None:
        failure = "no summary.json: the run did not finish"
    return Run(path, config, _composition(config, written), ledger, summary, records, failure)


def _composition(config: Mapping[str, Any], written: str) -> str:
    """The composition of ``config`` as rlmap writes it today (runs of older versions then
    read alike); ``written``, the run's own first line, when the config no longer loads."""
    try:
        return composition(from_mapping(config))
    except ConfigError:
        return written


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Every run among ``paths`` (see :func:`find_runs`), read; InputError on a bad one."""
    return [load_run(p) for p in find_runs(paths)]


def group_key(config: Mapping[str, Any]) -> str:
    """The config without what does not define the method: the seed and the ``run`` section."""
    rest = {k: v for k, v in config.items() if k not in ("seed", "run")}
    return json.dumps(rest, sort_keys=True, default=str)


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs grouped by config up to the seed, labelled by recipe; groups of one recipe are
    told apart by the directory that holds each group's runs (a ``--seeds`` sweep's), else
    numbered."""
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        by_key.setdefault(group_key(run.config), []).append(run)
    recipes = [members[0].recipe for members in by_key.values()]
    labels: dict[str, list[Run]] = {}
    for members in by_key.values():
        recipe = members[0].recipe
        parents = {r.path.parent for r in members}
        label = recipe
        if recipes.count(recipe) > 1 and len(parents) == 1:
            label = f"{recipe} ({parents.pop().name})"
        n = 2
        while label in labels:
            label, n = f"{recipe} ({n})", n + 1
        labels[label] = sorted(members, key=lambda r: r.seed)
    return labels
