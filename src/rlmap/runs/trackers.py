"""Experiment trackers: where a run's config, metrics and summary go besides ``metrics.jsonl``.

``run.loggers`` names any of the registered trackers; each is an optional extra
(``pip install 'rlmap[wandb]'``), checked when the config is validated. A tracker opens
with the run's directory, project and resolved config, then gets every step's finite
metrics (NaN, ±inf and None are dropped: ``metrics.jsonl`` writes them as ``null``, and no
tracker plots them), the summary once at the end, and a close — also when training raised,
which marks the tracker's run failed where it has such a state (wandb, mlflow).

- **tensorboard**: events under ``<run>/tensorboard``; the config and summary as text, the
  summary's numbers as ``summary/...`` scalars at the last step.
- **wandb**: a run in ``<run>/wandb``, named after the run directory. Its mode is
  ``WANDB_MODE`` when set, else ``online`` with ``WANDB_API_KEY`` set and ``offline``
  without (``wandb login`` alone does not switch it on: set ``WANDB_MODE=online``); an
  offline run uploads later with ``wandb sync <run>/wandb/offline-run-*``. The summary goes
  into the wandb run's summary as it is.
- **mlflow**: ``MLFLOW_TRACKING_URI`` when set, else a SQLite store ``<run>/mlflow.db`` with
  artifacts under ``<run>/mlartifacts`` (``mlflow ui --backend-store-uri
  sqlite:///<run>/mlflow.db``, with the full mlflow package). MLflow 3 refuses its
  ``./mlruns`` file store unless told otherwise, hence SQLite (the extra installs
  mlflow-skinny, SQLAlchemy and Alembic: no server, no scikit-learn). The config becomes
  params (dotted keys, values over ``PARAM_CHARS`` characters cut); names go through
  :func:`mlflow_name`; the summary is ``summary.json`` as an artifact plus its numbers as
  ``summary/...`` metrics.
- **trackio**: ``trackio.init`` in trackio's own directory (``TRACKIO_DIR``, else its
  cache), the summary's numbers logged as ``summary/...`` at the last step.

A resumed run opens a new tracker run (the same name) that logs from its checkpoint's
step on.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from rlmap.core.errors import ConfigError
from rlmap.core.registry import Registry


class Tracker(Protocol):
    """One experiment tracker's open run."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record one step's metrics (finite floats)."""

    def summary(self, summary: Mapping[str, Any], step: int) -> None:
        """Record the run's summary (``summary.json``); ``step`` is the last one logged."""

    def close(self, failed: bool = False) -> None:
        """End the tracker's run (``failed``: training raised)."""


@dataclass(frozen=True)
class RunInfo:
    """What a tracker opens with."""

    directory: Path
    """The run directory; its name names the tracker's run."""
    project: str
    """``run.project``."""
    config: Mapping[str, Any]
    """The resolved config, as ``config.yaml`` holds it (nested sections)."""


@dataclass(frozen=True)
class TrackerKind:
    """A registered tracker: how to open it and what it imports."""

    open: Callable[[RunInfo], Tracker]
    """Open the tracker's run (logging the config)."""
    modules: tuple[str, ...]
    """Top-level modules it needs: what its extra installs."""


registry: Registry[TrackerKind] = Registry("tracker")


def missing_module(name: str) -> str | None:
    """The first module tracker ``name`` needs that is not installed (None: all are)."""
    for module in registry.get(name).modules:
        if module not in sys.modules and importlib.util.find_spec(module) is None:
            return module
    return None


def flatten(tree: Mapping[str, Any], sep: str, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(``a<sep>b``, leaf) for every leaf of nested mappings."""
    for key, value in tree.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            yield from flatten(value, sep, name)
        else:
            yield name, value


def summary_numbers(summary: Mapping[str, Any]) -> dict[str, float]:
    """The summary's numeric leaves as ``summary/<key>/<key>`` metrics (flags, text, None and
    non-finite values left out: the whole summary goes where a tracker keeps text)."""
    out: dict[str, float] = {}
    for name, value in flatten(summary, "/", "summary"):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and math.isfinite(value):
            out[name] = float(value)
    return out


def _as_text(tree: Mapping[str, Any]) -> str:
    """A mapping as indented JSON in a Markdown code block (TensorBoard's text renders it)."""
    body = json.dumps(tree, indent=2, default=str)
    return "\n".join("    " + line for line in body.splitlines())


class TensorBoard:
    """Events under ``<run>/tensorboard`` (torch's SummaryWriter)."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    @classmethod
    def open(cls, run: RunInfo) -> TensorBoard:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                not_installed("tensorboard")
                or "run.loggers: tensorboard: torch.utils.tensorboard does not import"
            ) from None
        writer = SummaryWriter(log_dir=str(run.directory / "tensorboard"))
        writer.add_text("config", _as_text(run.config), 0)
        return cls(writer)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def summary(self, summary: Mapping[str, Any], step: int) -> None:
        self.log(step, summary_numbers(summary))
        self.writer.add_text("summary", _as_text(summary), step)

    def close(self, failed: bool = False) -> None:
        self.writer.close()


def wandb_mode(env: Mapping[str, str]) -> Literal["online", "offline"] | None:
    """The mode ``wandb.init`` gets: None (wandb reads ``WANDB_MODE`` itself) when it is
    set, else online with an API key in ``WANDB_API_KEY`` and offline without."""
    if env.get("WANDB_MODE"):
        return None
    return "online" if env.get("WANDB_API_KEY") else "offline"


class WandB:
    """A Weights & Biases run in ``<run>/wandb``."""

    def __init__(self, run: Any) -> None:
        self.run = run

    @classmethod
    def open(cls, run: RunInfo) -> WandB:
        """A new wandb run (``reinit="create_new"``: its own, whatever other run this process
        has open, e.g. a notebook's), closed by :meth:`close`."""
        import wandb

        return cls(
            wandb.init(
                project=run.project,
                name=run.directory.name,
                dir=str(run.directory),
                config=dict(run.config),
                mode=wandb_mode(os.environ),
                reinit="create_new",
            )
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics), step=step)

    def summary(self, summary: Mapping[str, Any], step: int) -> None:
        self.run.summary.update(dict(summary))

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


PARAM_CHARS = 6000
"""Longest MLflow param value (MLflow 3's limit); longer config values are cut."""
PARAMS_PER_CALL, METRICS_PER_CALL = 100, 1000
"""MLflow's limits on one ``log_batch``."""


def mlflow_name(name: str) -> str:
    """A metric or param name MLflow accepts: ``@`` becomes ``_at_`` (``eval/pass@1`` ->
    ``eval/pass_at_1``), any other character outside letters, digits, ``_-. /`` becomes
    ``_``."""
    return re.sub(r"[^\w\-. /]", "_", name.replace("@", "_at_"))


def mlflow_params(config: Mapping[str, Any]) -> dict[str, str]:
    """The config as MLflow params: dotted names, strings as they are and other values as
    JSON, cut to ``PARAM_CHARS``."""
    out = {}
    for name, value in flatten(config, "."):
        text = value if isinstance(value, str) else json.dumps(value)
        out[mlflow_name(name)] = text[:PARAM_CHARS]
    return out


def _batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MLflow:
    """An MLflow run, through a client of its own (no active-run state)."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id

    @classmethod
    def open(cls, run: RunInfo) -> MLflow:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        artifacts = None if uri else (run.directory.resolve() / "mlartifacts").as_uri()
        store = f"sqlite:///{run.directory.resolve() / 'mlflow.db'}"  # absolute: as_uri needs it
        client = MlflowClient(tracking_uri=uri or store)
        experiment = client.get_experiment_by_name(run.project)  # a resume: the same store
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            experiment_id = client.create_experiment(run.project, artifact_location=artifacts)
        run_id = client.create_run(experiment_id, run_name=run.directory.name).info.run_id
        params = [Param(k, v) for k, v in mlflow_params(run.config).items()]
        for batch in _batches(params, PARAMS_PER_CALL):
            client.log_batch(run_id, params=batch)
        return cls(client, run_id)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [Metric(mlflow_name(k), v, now, step) for k, v in metrics.items()]
        for batch in _batches(rows, METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=batch)

    def summary(self, summary: Mapping[str, Any], step: int) -> None:
        self.log(step, summary_numbers(summary))
        self.client.log_dict(self.run_id, dict(summary), "summary.json")

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


class Trackio:
    """A trackio run (its module-level API: one current run per process)."""

    def __init__(self, trackio: Any) -> None:
        self.trackio = trackio

    @classmethod
    def open(cls, run: RunInfo) -> Trackio:
        import trackio

        trackio.init(project=run.project, name=run.directory.name, config=dict(run.config))
        return cls(trackio)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        self.trackio.log(dict(metrics), step=step)

    def summary(self, summary: Mapping[str, Any], step: int) -> None:
        self.trackio.log(summary_numbers(summary), step=step)

    def close(self, failed: bool = False) -> None:
        self.trackio.finish()


def not_installed(name: str, field: str = "run.loggers") -> str | None:
    """One line naming ``field`` when a module tracker ``name`` needs is not installed
    (None: all are)."""
    module = missing_module(name)
    if module is None:
        return None
    return f"{field}: {name} needs the {module} package (pip install 'rlmap[{name}]')"


registry.add("tensorboard", TrackerKind(TensorBoard.open, ("tensorboard",)))
registry.add("wandb", TrackerKind(WandB.open, ("wandb",)))
registry.add("mlflow", TrackerKind(MLflow.open, ("mlflow", "sqlalchemy", "alembic")))
registry.add("trackio", TrackerKind(Trackio.open, ("trackio",)))
