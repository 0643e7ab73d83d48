"""Experiments: training, resuming, comparing and checking runs, and what they keep.

- :mod:`~rlmap.experiments.train`: ``rlmap train`` from a config to a finished run directory,
  one step at a time (:mod:`~rlmap.experiments.train_step`);
- :mod:`~rlmap.experiments.checkpoint`: atomic Hugging Face checkpoints with
  optimizer, scheduler and RNG state for an exact resume, read back by
  :mod:`~rlmap.experiments.checkpoint_load`;
- :mod:`~rlmap.experiments.resume`: where a resume goes on from, and what it leaves behind;
- :mod:`~rlmap.experiments.ledger`: ``Ledger``, the budget of a run;
- :mod:`~rlmap.experiments.plots`: ``write_plots`` (matplotlib is imported only
  when a figure is drawn);
- :mod:`~rlmap.experiments.compare`, :mod:`~rlmap.experiments.preflight`: ``rlmap compare``
  (its runs, table and curves: ``compare_runs``, ``compare_table``, ``compare_curves``)
  and ``rlmap preflight``.

The run directory's files themselves (``metrics.jsonl``, ``samples.jsonl``, trackers) are
:mod:`rlmap.runs`. Nothing is imported here: a submodule's import pulls only what it needs.
"""
