"""What ``rlmap diagnose`` reads from a run directory: metrics, ledger and config.

``metrics.jsonl`` is required (a missing or empty one is a one-line InputError
naming the file); ``ledger.json`` and ``config.yaml`` are read when present and
feed the interface readings (reuse epochs, the reduction's denominator, the
sampling temperature, ...). All three stay plain data: the rules are pure
functions of a :class:`RunData`, so tests build one by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlmap.core.errors import InputError
from rlmap.core.metrics import upgrade_row
from rlmap.runs.rundir import METRICS_FILE, MetricsLog, read_json_object, read_yaml

LEDGER_FILE = "ledger.json"
CONFIG_FILE = "config.yaml"


@dataclass(frozen=True)
class RunData:
    """One run as plain data."""

    records: Sequence[Mapping[str, Any]]
    """``metrics.jsonl``: one ``{"step": N, metric: value, ...}`` per step, in file order;
    step 0 holds the evaluation before training."""
    ledger: Mapping[str, Any] = field(default_factory=dict)
    """``ledger.json`` (see :class:`rlmap.experiments.ledger.Ledger`); empty if absent."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """``config.yaml``, the resolved config; empty if absent."""
    composition: str = ""
    """The config file's first comment line: the recipe's full composition."""

    @property
    def steps(self) -> tuple[int, int]:
        """First and last step logged."""
        steps = [int(r["step"]) for r in self.records]
        return (min(steps), max(steps)) if steps else (0, 0)

    def setting(self, dotted: str) -> Any:
        """A config value by dotted name (``generation.temperature``); None if absent."""
        node: Any = self.config
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node


def load_run(run_dir: Path) -> RunData:
    """Read a run directory; InputError (one line, naming the file) when it cannot be read."""
    run_dir = Path(run_dir)
    metrics = run_dir / METRICS_FILE
    if not run_dir.is_dir():
        what = "no such directory" if not run_dir.exists() else "not a directory"
        raise InputError(f"{run_dir}: {what}; diagnose reads a run directory")
    if not metrics.exists():
        raise InputError(f"{metrics}: no metrics (no such file); is {run_dir} a run directory?")
    # InputError naming path:lineno; an old run's names as today's (docs/metrics.md)
    records = [upgrade_row(r) for r in MetricsLog.read(metrics)]
    if not records:
        raise InputError(f"{metrics}: no metrics (the file is empty)")
    return RunData(
        records=records,
        ledger=read_json_object(run_dir / LEDGER_FILE, "ledger") or {},
        **_config(run_dir / CONFIG_FILE),
    )


def _config(path: Path) -> dict[str, Any]:
    """``config`` and ``composition`` from ``config.yaml`` (both empty if it is absent)."""
    if not path.exists():
        return {"config": {}, "composition": ""}
    data = read_yaml(path)  # InputError naming the file (and line)
    first = path.read_bytes().decode("utf-8-sig").partition("\n")[0]
    return {
        "config": data,
        "composition": first[1:].strip() if first.startswith("#") else "",
    }
