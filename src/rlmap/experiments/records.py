"""Where each step's metrics go: ``metrics.jsonl`` always, and the trackers of ``run.loggers``
(:mod:`rlmap.runs.trackers`)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rlmap.core.errors import first_line
from rlmap.recipes.config import RecipeConfig
from rlmap.runs.rundir import MetricsLog
from rlmap.runs.trackers import RunInfo, Tracker, registry


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
        self._each(lambda tracker: tracker.log(step, finite))
        self.step = step

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Give every tracker the run's summary, then close them."""
        self._each(lambda tracker: tracker.summary(summary, self.step))
        self.close()

    def _each(self, call: Callable[[Tracker], None]) -> None:
        """``call`` on every tracker; one that raises (a tracking server gone) is closed and
        dropped with a one-line warning: training and ``metrics.jsonl`` go on without it."""
        for tracker in self.trackers:
            try:
                call(tracker)
            except Exception as exc:
                self.trackers = tuple(t for t in self.trackers if t is not tracker)
                _quietly_close(tracker, failed=True)
                warnings.warn(
                    f"run.loggers: {type(tracker).__name__} failed and is dropped "
                    f"(metrics.jsonl goes on): {type(exc).__name__}: {first_line(exc)}",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def __enter__(self) -> StepRecords:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Training raised (or the trackers were closed already): end them, as failed."""
        self.close(failed=exc_type is not None)

    def close(self, failed: bool = False) -> None:
        """Close every tracker once; a close that raises is a warning, never an error that
        would hide why training stopped."""
        trackers, self.trackers = self.trackers, ()
        for tracker in trackers:
            _quietly_close(tracker, failed)


def _quietly_close(tracker: Tracker, failed: bool) -> None:
    try:
        tracker.close(failed)
    except Exception as exc:
        warnings.warn(
            f"run.loggers: closing {type(tracker).__name__} failed: "
            f"{type(exc).__name__}: {first_line(exc)}",
            RuntimeWarning,
            stacklevel=3,
        )


def finite_values(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics a tracker gets: finite ones, as floats (``metrics.jsonl`` writes NaN and
    ±inf as ``null``; a tracker would plot them as gaps or reject them)."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if value is not None and math.isfinite(float(value)):
            out[name] = float(value)
    return out
