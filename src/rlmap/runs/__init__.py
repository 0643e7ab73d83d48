"""The run directory and where a run's rows go: the bottom of the run stack.

- :mod:`~rlmap.runs.rundir`: ``create_run_dir``, atomic JSON/text writes, ``MetricsLog``
  (``metrics.jsonl``, tolerant of a torn last line), and reading a YAML or JSON file with an
  error that names it;
- :mod:`~rlmap.runs.samples`: ``samples.jsonl`` and the error classes of a rollout;
- :mod:`~rlmap.runs.trackers`: experiment trackers (TensorBoard, W&B, MLflow, Trackio).

They import only :mod:`rlmap.core`, so the loops, the map's readers (``diagnose``, ``compare``,
``simulate``) and the config checks can all write and read runs. What builds and resumes a run
(checkpoints, the budget ledger, plots, ``train``) is :mod:`rlmap.experiments`.
"""
