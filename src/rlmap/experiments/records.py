"""Where each step's metrics go: ``metrics.jsonl`` always, TensorBoard when asked."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError
from rlmap.experiments.rundir import MetricsLog


class StepRecords:
    """Appends one step's metrics to the run's log (and TensorBoard events)."""

    def __init__(self, run_dir: Path, *, tensorboard: bool) -> None:
        self.log = MetricsLog(run_dir / "metrics.jsonl")
        self.board: Any = _tensorboard(run_dir) if tensorboard else None

    def write(self, step: int, metrics: Mapping[str, float]) -> None:
        self.log.append(step, metrics)
        if self.board is not None:
            for name, value in metrics.items():
                if value is not None and math.isfinite(value):
                    self.board.add_scalar(name, value, step)
            self.board.flush()


def _tensorboard(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "run.tensorboard: needs the tensorboard package (pip install 'rlmap[tensorboard]')"
        ) from None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))
