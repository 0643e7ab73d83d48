"""Held-out score against budgets (generated tokens, wall-clock), never steps: each run's
curve, a group's mean over seeds with a min–max band, the plot, and every run read at the
largest budget all of them reached."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

from rlmap.experiments.compare_runs import Run
from rlmap.experiments.compare_table import as_number, format_value, summarize

GRID_POINTS = 50
CURVES = (
    ("heldout_vs_tokens.png", "budget/generated_tokens", "generated tokens"),
    ("heldout_vs_wallclock.png", "budget/wall_clock_s", "wall-clock (s)"),
)
SCORE = "eval/pass@1"


def curve(run: Run, x_key: str, y_key: str = SCORE) -> tuple[list[float], list[float]]:
    """(x, y) of a run's evaluations: the held-out score against a budget counter."""
    points = sorted(
        (x, y)
        for r in run.records
        if (x := as_number(r.get(x_key))) is not None and (y := as_number(r.get(y_key))) is not None
    )
    return [p[0] for p in points], [p[1] for p in points]


def interpolate(xs: Sequence[float], ys: Sequence[float], grid: Sequence[float]) -> list[float]:
    """Piecewise-linear y at each grid point (``grid`` within [xs[0], xs[-1]])."""
    out, j = [], 0
    for g in grid:
        while j + 1 < len(xs) - 1 and xs[j + 1] < g:
            j += 1
        if len(xs) == 1 or xs[j + 1] == xs[j]:
            out.append(ys[j])
            continue
        t = min(max((g - xs[j]) / (xs[j + 1] - xs[j]), 0.0), 1.0)
        out.append(ys[j] + t * (ys[j + 1] - ys[j]))
    return out


def band(
    runs: Sequence[Run], x_key: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """(grid, mean, min, max) of the seeds' curves over the budget range all of them reached."""
    curves = [c for c in (curve(r, x_key) for r in runs) if len(c[0]) >= 1]
    if not curves:
        return [], [], [], []
    lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
    if hi <= lo:
        return [], [], [], []
    grid = [lo + (hi - lo) * k / (GRID_POINTS - 1) for k in range(GRID_POINTS)]
    ys = [interpolate(x, y, grid) for x, y in curves]
    mean = [sum(col) / len(col) for col in zip(*ys, strict=True)]
    return (
        grid,
        mean,
        [min(col) for col in zip(*ys, strict=True)],
        [max(col) for col in zip(*ys, strict=True)],
    )


def at_equal_budget(
    groups: Mapping[str, Sequence[Run]], x_key: str = "budget/generated_tokens"
) -> tuple[float, dict[str, list[float]]] | None:
    """(budget, each group's per-seed held-out scores there): every finished run's curve
    read (interpolated) at the largest budget every one of them reached; None when fewer
    than two runs have curves, or one starts past where another ends."""
    curves = {
        label: [c for c in (curve(r, x_key) for r in runs if r.failure is None) if c[0]]
        for label, runs in groups.items()
    }
    every = [c for cs in curves.values() for c in cs]
    if len(every) < 2:
        return None
    budget = min(x[-1] for x, _ in every)
    if any(x[0] > budget for x, _ in every):
        return None
    return budget, {
        label: [interpolate(x, y, [budget])[0] for x, y in cs] for label, cs in curves.items() if cs
    }


def equal_budget_lines(groups: Mapping[str, Sequence[Run]]) -> list[str]:
    found = at_equal_budget(groups)
    if found is None:
        return ["- fewer than two runs have evaluations on a common range of generated tokens"]
    budget, scores = found
    return [
        f"Held-out {SCORE.removeprefix('eval/')} at {format_value(budget)} generated tokens, the "
        "most every run reached (each run's curve interpolated there):",
        "",
        *[f"- {label}: {summarize(values)}" for label, values in scores.items()],
    ]


def plot(groups: Mapping[str, Sequence[Run]], x_key: str, x_label: str) -> bytes:
    """PNG: held-out pass@1 against a budget, mean over seeds with a min–max band."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.2), layout="constrained")
    ax = fig.subplots()
    for k, (label, runs) in enumerate(groups.items()):
        color = f"C{k % 10}"
        finished = [r for r in runs if r.records]
        for run in finished:
            x, y = curve(run, x_key)
            ax.plot(x, y, color=color, alpha=0.3, linewidth=0.8, marker=".", markersize=3)
        grid, mean, low, high = band(finished, x_key)
        if grid:
            ax.plot(grid, mean, color=color, linewidth=2, label=f"{label} (n={len(finished)})")
            ax.fill_between(grid, low, high, color=color, alpha=0.15, linewidth=0)
    ax.set_xlabel(x_label)
    ax.set_ylabel(f"held-out {SCORE.removeprefix('eval/')}")
    ax.set_title(f"Held-out score against {x_label}: mean over seeds, min–max band")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # runs without curves have no line to label
        ax.legend(fontsize="small")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()
