"""PNG curves of a run from its ``metrics.jsonl`` records.

Each figure is data (:data:`PLOTS`): a file name, an x metric and panels of metric
patterns. A figure whose metrics never appear with a number is skipped; ``None``
values (NaN/inf in the log) and records without the x metric are left out point by
point. Held-out scores are drawn against generated tokens, not steps, because
steps of different recipes cost different amounts (see the ledger).

Figures are built with ``matplotlib.figure.Figure`` directly, never ``pyplot``:
no backend is switched and no figure registry outlives the call.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmap.runs.rundir import write_bytes_atomic

TOKENS = "budget/generated_tokens"


@dataclass(frozen=True)
class Panel:
    """One set of axes: every metric whose name fully matches one of ``patterns``."""

    ylabel: str
    """Label of the y axis."""
    patterns: tuple[str, ...]
    """Regular expressions matched against the whole metric name."""


@dataclass(frozen=True)
class PlotSpec:
    """One PNG file."""

    filename: str
    """File name inside the plots directory."""
    title: str
    """Figure title."""
    x_key: str
    """Metric on the x axis (``step`` or a ``budget/*`` counter)."""
    x_label: str
    """Label of the x axis."""
    panels: tuple[Panel, ...]
    """Stacked panels sharing the x axis; empty ones are dropped."""
    panel_per_key: bool = False
    """Split every panel into one per matching metric (metrics of unrelated scales)."""
    shade_key: str | None = None
    """Shade, on every panel, the x ranges of records where this metric is 1 (a phase)."""


PLOTS: tuple[PlotSpec, ...] = (
    PlotSpec(
        "reward.png",
        "Training reward vs held-out score (reward hacking shows as a gap)",
        "step",
        "step",
        (
            Panel(
                "training reward", ("reward/mean", "reward/outcome_mean", "reward/verifier_mean")
            ),
            Panel("held-out pass@1", ("eval/pass@1", "eval/train_verifier_pass@1")),
            Panel("failed rewards (fraction)", (r"errors/(unparseable|infra_error|timeout)_frac",)),
        ),
    ),
    PlotSpec(
        "heldout.png",
        "Held-out score vs generated tokens",
        TOKENS,
        "generated tokens",
        (Panel("pass rate", (r"eval/pass@(\d+|k)",)),),
    ),
    PlotSpec(
        "length.png",
        "Response length",
        "step",
        "step",
        (
            Panel("tokens", ("length/mean", "length/p95")),
            Panel("truncated fraction", ("length/truncated_frac",)),
        ),
    ),
    PlotSpec("entropy.png", "Policy entropy", "step", "step", (Panel("entropy", ("entropy",)),)),
    PlotSpec(
        "ratios.png",
        "Ratio tails (|log ratio|)",
        "step",
        "step",
        tuple(
            Panel(f"{name} |log|", (f"ratio/{name}/(max|p99)_abs_log",))
            for name in ("rho", "kappa", "d")
        ),
    ),
    PlotSpec(
        "critic.png",
        "Value critic (shaded: warm-up / value pre-training, no policy update)",
        "step",
        "step",
        (
            Panel("explained variance", ("critic/explained_variance",)),
            Panel("value loss", ("critic/value_loss",)),
            Panel("|V − return|", (r"critic/value_error_(first|last)",)),
        ),
        shade_key="critic/pretraining",
    ),
    PlotSpec(
        "tools.png",
        "Multi-turn episodes: training rollouts (env/*) and held-out (eval/*)",
        "step",
        "step",
        (
            Panel("tool-call rate", (r"(env|eval)/tool_call_rate",)),
            Panel("turns per episode", (r"(env|eval)/turns",)),
            Panel("fraction", (r"(env|eval)/(tool_error_frac|turn_budget_frac)",)),
        ),
    ),
    PlotSpec(
        "errors.png",
        "Failures by class (a class shift shows a parser bug or a loophole)",
        "step",
        "step",
        (
            Panel("fraction of rollouts", (r"errors/.+_frac",)),
            Panel("fraction of held-out samples", (r"eval/errors/.+_frac",)),
        ),
    ),
    PlotSpec(
        "system.png", "System", "step", "step", (Panel("", (r"system/.+",)),), panel_per_key=True
    ),
)


def _number(value: Any) -> float | None:
    """A finite plottable number, or None (missing, null, NaN, bool, text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _x_values(metrics: Sequence[Mapping[str, Any]], x_key: str) -> list[float | None]:
    """The x of each record; a record without it borrows the value logged at its step."""
    by_step: dict[Any, float] = {}
    for record in metrics:
        x = _number(record.get(x_key))
        if x is not None:
            by_step.setdefault(record.get("step"), x)
    own = [_number(record.get(x_key)) for record in metrics]
    return [
        x if x is not None else by_step.get(r.get("step"))
        for x, r in zip(own, metrics, strict=True)
    ]


def _series(
    metrics: Sequence[Mapping[str, Any]], xs: Sequence[float | None], key: str
) -> tuple[list[float], list[float]]:
    """Points (x, y) of one metric, sorted by x, where both are numbers."""
    points = sorted(
        (x, y)
        for x, record in zip(xs, metrics, strict=True)
        if x is not None and (y := _number(record.get(key))) is not None
    )
    return [x for x, _ in points], [y for _, y in points]


def _panels(
    spec: PlotSpec, metrics: Sequence[Mapping[str, Any]], xs: Sequence[float | None]
) -> list[tuple[str, list[str]]]:
    """(ylabel, metric names) of each non-empty panel, names in order of first appearance."""
    names = list(dict.fromkeys(name for record in metrics for name in record))
    plottable = [name for name in names if _series(metrics, xs, name)[0]]
    panels: list[tuple[str, list[str]]] = []
    for panel in spec.panels:
        keys = [n for n in plottable if any(re.fullmatch(p, n) for p in panel.patterns)]
        if spec.panel_per_key:
            panels.extend((key, [key]) for key in keys)
        elif keys:
            panels.append((panel.ylabel, keys))
    return panels


def phase_spans(
    metrics: Sequence[Mapping[str, Any]], xs: Sequence[float | None], key: str
) -> list[tuple[float, float]]:
    """Maximal runs of consecutive points where ``key`` is 1, as (first x − ½, last x + ½).

    The half-step margins make a one-point phase visible and adjacent steps join up.
    """
    x, y = _series(metrics, xs, key)
    spans: list[tuple[float, float]] = []
    for xi, yi in zip(x, y, strict=True):
        if yi != 1:
            continue
        if spans and xi - 0.5 <= spans[-1][1]:
            spans[-1] = (spans[-1][0], xi + 0.5)
        else:
            spans.append((xi - 0.5, xi + 0.5))
    return spans


def _render(spec: PlotSpec, metrics: Sequence[Mapping[str, Any]]) -> bytes | None:
    """The PNG bytes of one figure, or None when none of its metrics has a point."""
    xs = _x_values(metrics, spec.x_key)
    panels = _panels(spec, metrics, xs)
    if not panels:
        return None
    from matplotlib.figure import Figure  # imported here: only plotting pays for matplotlib

    ncols = 1 if len(panels) <= 3 else 2
    nrows = math.ceil(len(panels) / ncols)
    fig = Figure(figsize=(6.5 * ncols, 1.0 + 2.4 * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).flatten()
    fig.suptitle(spec.title)
    shaded = [] if spec.shade_key is None else phase_spans(metrics, xs, spec.shade_key)
    for ax, (ylabel, keys) in zip(axes, panels, strict=False):  # spare axes are hidden below
        for key in keys:
            x, y = _series(metrics, xs, key)
            ax.plot(x, y, marker="o" if len(x) <= 40 else None, markersize=3, label=key)
        for lo, hi in shaded:
            ax.axvspan(lo, hi, color="tab:gray", alpha=0.2, linewidth=0)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    for ax in axes[: len(panels)][-ncols:]:  # the lowest visible panel of each column
        ax.set_xlabel(spec.x_label)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def write_plots(metrics: Sequence[Mapping[str, Any]], out_dir: Path) -> list[Path]:
    """Write every figure of :data:`PLOTS` that has data into ``out_dir``; return the paths.

    ``metrics`` are records as read by ``MetricsLog.read``. Missing metrics, ``None``
    values and an empty list are not errors: the figure or point is skipped.
    """
    out_dir = Path(out_dir)
    written = []
    for spec in PLOTS:
        png = _render(spec, metrics)
        if png is None:
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(out_dir / spec.filename, png)
        written.append(out_dir / spec.filename)
    return written
