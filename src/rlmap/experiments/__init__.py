"""Experiment records: run directories, metrics log, checkpoints, budget ledger, plots.

- :mod:`~rlmap.experiments.rundir`: ``create_run_dir``, atomic JSON/text writes,
  ``MetricsLog`` (``metrics.jsonl``, tolerant of a torn last line);
- :mod:`~rlmap.experiments.checkpoint`: atomic Hugging Face checkpoints with
  optimizer, scheduler and RNG state for an exact resume;
- :mod:`~rlmap.experiments.resume`: where a resume goes on from, and what it leaves behind;
- :mod:`~rlmap.experiments.ledger`: ``Ledger``, the budget of a run;
- :mod:`~rlmap.experiments.plots`: ``write_plots`` (matplotlib is imported only
  when a figure is drawn).
"""

from __future__ import annotations

from rlmap.experiments.checkpoint import (
    latest_checkpoint,
    list_checkpoints,
    load_trainer_state,
    restore_optimizers,
    restore_rng,
    save_checkpoint,
)
from rlmap.experiments.ledger import Ledger, measure_peak_memory
from rlmap.experiments.plots import write_plots
from rlmap.experiments.rundir import (
    MetricsLog,
    create_run_dir,
    write_json_atomic,
    write_text_atomic,
)

__all__ = [
    "Ledger",
    "MetricsLog",
    "create_run_dir",
    "latest_checkpoint",
    "list_checkpoints",
    "load_trainer_state",
    "measure_peak_memory",
    "restore_optimizers",
    "restore_rng",
    "save_checkpoint",
    "write_json_atomic",
    "write_plots",
    "write_text_atomic",
]
