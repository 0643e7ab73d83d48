"""Fair comparison of runs: ledgers side by side, unfair differences flagged, curves on budgets.

``rlmap compare RUN...`` takes run directories, or directories of runs (a ``--seeds``
sweep). Runs whose configs are equal up to the seed form one *group* (one method,
several seeds). Every line of the comparison is one of four kinds:

- **setup** — what must be equal for the comparison to mean anything: base weights,
  tokenizer and chat template, prompts, verifier, sampling settings, evaluation,
  engine and precision. Any difference is flagged *unfair*.
- **budget** — what the runs spent: generated tokens, wall-clock, learner compute,
  prompts. Runs that differ by more than ``BUDGET_TOLERANCE`` are flagged: at equal
  steps they are not at equal cost, so compare them on the plots, which put the
  held-out score against generated tokens and against wall-clock, never steps.
- **method** — what the recipes choose (estimator, reduction and its denominator,
  epochs per batch, optimiser steps, …): expected to differ, listed so that a reader
  sees what a step means in each run.
- **result** — held-out pass@1 / pass@k / diversity after training, peak memory.

Beyond these lines, every field of the resolved ``config.yaml`` whose value differs
between groups is flagged (``CONFIG differs``), but for the few in ``NOT_COMPARED`` and
those a setup line already flags: a difference no line names (LoRA against full
fine-tuning, two learners against one) is still a difference in what a step does. The
composition line is recomputed from each run's config, so that runs written by older
versions of rlmap read alike and it names LoRA, learners and precision when set.

A group with several seeds shows the mean and the spread (min–max) of each number;
its curves are the mean over seeds with a min–max band, each seed interpolated onto
a common grid over the budget range all its seeds reached. Failed runs (no
``summary.json``, or a ``FAILED`` file) are listed, never dropped silently.

This module writes the report; reading and grouping the runs is
:mod:`~rlmap.experiments.compare_runs`, the lines, flags and table (``BUDGET_TOLERANCE``,
``NOT_COMPARED``) :mod:`~rlmap.experiments.compare_table`, the curves and plots
:mod:`~rlmap.experiments.compare_curves`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rlmap.experiments.compare_curves import CURVES, equal_budget_lines, plot
from rlmap.experiments.compare_runs import Run, group_runs, load_runs
from rlmap.experiments.compare_table import BUDGET_TOLERANCE, flags, table
from rlmap.runs.rundir import write_bytes_atomic, write_text_atomic


def compare(paths: Sequence[Path], out: Path) -> str:
    """Write ``report.md`` and the plots into ``out``; return the report's text."""
    return write_report(load_runs(paths), out)


def write_report(runs: Sequence[Run], out: Path) -> str:
    """Write ``report.md`` and the plots of ``runs`` into ``out``; return the report's text.

    The CLI reads every run first (:func:`~rlmap.experiments.compare_runs.load_runs`) and
    only then creates ``out``, so bad input leaves no empty report directory behind.
    """
    groups = group_runs(runs)
    found = flags(groups)
    out.mkdir(parents=True, exist_ok=True)
    for filename, x_key, x_label in CURVES:
        write_bytes_atomic(out / filename, plot(groups, x_key, x_label))
    lines = [
        "# rlmap compare",
        "",
        "Runs: " + ", ".join(f"`{r.path}`" for r in runs),
        "",
        "## Flags",
        "",
        *(
            [f"- {f}" for f in found]
            or [f"- none: same config, same setup, budgets within {BUDGET_TOLERANCE:.0%}"]
        ),
        "",
        "## Side by side",
        "",
        "Groups are runs with the same config up to the seed; numbers over seeds read "
        "mean [min–max].",
        "",
        table(groups),
        "",
        "## At equal generated tokens",
        "",
        *equal_budget_lines(groups),
        "",
        "## Held-out score against budget (not steps)",
        "",
        *[f"![{x_label}]({filename})" for filename, _, x_label in CURVES],
        "",
    ]
    text = "\n".join(lines)
    write_text_atomic(out / "report.md", text)
    return text
