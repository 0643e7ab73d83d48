"""Where each step's metrics go: ``metrics.jsonl`` always, and the trackers of ``run.loggers``
(:mod:`rlmap.experiments.trackers`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rlmap.experiments.rundir import MetricsLog
from rlmap.experiments.trackers import RunInfo, Tracker, registry
from rlmap.recipes.config import RecipeConfig


class StepRecords:
    """Appends one step's metrics to the run's log and to every open tracker; written by
    the main rank alone. :meth:`finish` hands the trackers the summary and closes them;
    :meth:`close` ends them when training raised (no tracker run, nor a wandb process,
    is left open)."""

    def __init__(self, run_dir: Path, trackers: Sequence[Tracker] = ()) -> None:
        self.log = MetricsLog(run_dir / "metrics.jsonl")
        self.trackers = tuple(trackers)
        self.step = 0
        """The last step written."""

    @classmethod
    def of(cls, cfg: RecipeConfig, run_dir: Path) -> StepRecords:
        """The records of a run of ``cfg`` in ``run_dir``, each tracker of ``run.loggers``
        open with the resolved config (those opened are closed if a later one fails)."""
        run = RunInfo(run_dir, cfg.run.project, cfg.model_dump(mode="json"))
        records = cls(run_dir)
        try:
            for name in cfg.run.trackers:
                records.trackers += (registry.get(name).open(run),)
        except BaseException:
            records.close(failed=True)
            raise
        return records

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.log.append(step, metrics)
        finite = finite_values(metrics)
        for tracker in self.trackers:
            tracker.log(step, finite)
        self.step = step

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Give every tracker the run's summary, then close them."""
        for tracker in self.trackers:
            tracker.summary(summary, self.step)
        self.close()

    def __enter__(self) -> StepRecords:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Training raised (or the trackers were closed already): end them, as failed."""
        self.close(failed=exc_type is not None)

    def close(self, failed: bool = False) -> None:
        """Close every tracker once (each, even when another's close raises)."""
        trackers, self.trackers = self.trackers, ()
        with ExitStack() as closing:
            for tracker in trackers:
                closing.callback(tracker.close, failed)


def finite_values(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics a tracker gets: finite ones, as floats (``metrics.jsonl`` writes NaN and
    ±inf as ``null``; a tracker would plot them as gaps or reject them)."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if value is not None and math.isfinite(float(value)):
            out[name] = float(value)
    return out
