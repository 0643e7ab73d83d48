"""What ``rlmap diagnose`` reads from a run directory: metrics, ledger and config.

``metrics.jsonl`` is required (a missing or empty one is a one-line ConfigError
naming the file); ``ledger.json`` and ``config.yaml`` are read when present and
feed the interface readings (reuse epochs, the reduction's denominator, the
sampling temperature, ...). All three stay plain data: the rules are pure
functions of a :class:`RunData`, so tests build one by hand.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlmap.core.errors import ConfigError
from rlmap.experiments.rundir import METRICS_FILE, MetricsLog

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
    """Read a run directory; ConfigError (one line, naming the file) when it cannot be read."""
    run_dir = Path(run_dir)
    metrics = run_dir / METRICS_FILE
    try:
        records = MetricsLog.read(metrics)
    except (ValueError, OSError) as err:
        raise ConfigError(f"{metrics}: cannot read the metrics ({err})") from None
    if not records:
        raise ConfigError(
            f"{metrics}: no metrics (missing or empty); is {run_dir} a run directory?"
        )
    return RunData(records=records, ledger=_ledger(run_dir / LEDGER_FILE),
                   **_config(run_dir / CONFIG_FILE))  # fmt: skip


def _ledger(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:
        raise ConfigError(f"{path}: cannot read the ledger ({err})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a ledger (expected a JSON object)")
    return data


def _config(path: Path) -> dict[str, Any]:
    """``config`` and ``composition`` from ``config.yaml`` (both empty if it is absent)."""
    if not path.exists():
        return {"config": {}, "composition": ""}
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (yaml.YAMLError, OSError) as err:
        raise ConfigError(f"{path}: cannot read the config ({str(err).splitlines()[0]})") from None
    first = text.splitlines()[0] if text else ""
    return {
        "config": data if isinstance(data, dict) else {},
        "composition": first[1:].strip() if first.startswith("#") else "",
    }
