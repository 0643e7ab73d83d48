"""``rlmap simulate``'s outputs: a text summary, JSON, a sweep over worker counts, plots.

The model is :mod:`rlmap.simulator.model`; this module only runs it and shows it.
Plots use ``matplotlib.figure.Figure`` directly, never ``pyplot``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rlmap.core.errors import ConfigError, InputError
from rlmap.runs.rundir import (
    check_new_file,
    create_run_dir,
    removed_on_failure,
    write_bytes_atomic,
)
from rlmap.simulator.inputs import (
    Duration,
    RunProfile,
    parse_duration,
    parse_learner_step,
    profile_from_run,
)
from rlmap.simulator.model import MODES, SimConfig, SimResult, simulate

DEFAULT_WORKERS, DEFAULT_BATCH, DEFAULT_LEARNER_S = 8, 64, "1"
DEFAULT_DURATION = "lognormal:0,1"


@dataclass(frozen=True)
class SimulateArgs:
    """The ``rlmap simulate`` flags, as given (``None``: not given)."""

    mode: str | None = None
    """``--mode``; None: the run's (``--from-run``), else ``sync``."""
    workers: int | None = None
    batch: int | None = None
    learner_step_s: str | None = None
    duration: str | None = None
    eta: int | None = None
    """``--eta``; None: the run's η (``--from-run`` of an asynchronous run), else 1."""
    budget_s: float | None = None
    steps: int = 200
    seed: int = 0
    from_run: str | None = None
    json: bool = False
    sweep_workers: str | None = None
    plot: str | None = None
    force: bool = False
    """``--force``: replace plots that already exist in ``--plot``."""


def simulate_args(flags: Mapping[str, object]) -> SimulateArgs:
    """The :class:`SimulateArgs` fields picked from parsed flags (``vars(namespace)``)."""
    names = {f.name for f in dataclasses.fields(SimulateArgs)}
    return SimulateArgs(**{k: v for k, v in flags.items() if k in names})  # type: ignore[arg-type]


def build_config(a: SimulateArgs) -> tuple[SimConfig, str | None]:
    """The config the flags describe, and where its times came from (``--from-run``)."""
    source = None
    duration: Duration = parse_duration(a.duration or DEFAULT_DURATION)
    learner = parse_learner_step(a.learner_step_s or DEFAULT_LEARNER_S)
    workers = a.workers if a.workers is not None else DEFAULT_WORKERS
    batch = a.batch if a.batch is not None else DEFAULT_BATCH
    if a.from_run is not None:
        if a.duration is not None:
            raise ConfigError("--duration: give either --duration or --from-run, not both")
        profile = profile_from_run(Path(a.from_run))
        duration, source = profile.duration, profile.source
        if a.learner_step_s is None and profile.learner_step is not None:
            learner = profile.learner_step
        if a.batch is None and profile.batch is not None:
            batch = profile.batch
        if a.workers is None and profile.source.startswith("batched"):
            workers = batch  # one batched generate call: B trajectories in parallel
        if profile.workers is not None:  # an asynchronous run: one round = one trajectory
            workers = profile.workers if a.workers is None else workers
            source = (
                f"{source}; each simulated trajectory is one worker round of "
                f"{profile.round_size} trajectories: multiply throughput by "
                f"{profile.round_size}"
            )
        mode, eta, said = _run_system(a, profile)
        source = f"{source}; {said}"
    else:
        mode, eta = a.mode or "sync", 1 if a.eta is None else a.eta
    config = SimConfig(
        mode=mode,
        workers=workers,
        batch=batch,
        duration=duration,
        learner_step=learner,
        steps=a.steps,
        eta=eta,
        budget_s=a.budget_s,
        seed=a.seed,
    )
    return config, source


def _run_system(a: SimulateArgs, profile: RunProfile) -> tuple[str, int, str]:
    """Mode and η for ``--from-run``: the run's own unless a flag overrides (and says so)."""
    run_mode, run_eta = profile.mode or "sync", profile.eta
    mode = a.mode or run_mode
    eta = a.eta if a.eta is not None else run_eta if run_eta is not None else 1
    said = [f"mode {mode}" + (f", η = {eta}" if mode == "async" else "")]
    said[0] += " (the run's)" if a.mode is None and (a.eta is None or run_eta is None) else ""
    if a.mode is not None and a.mode != run_mode:
        said.append(f"--mode {a.mode} overrides the run's {run_mode}")
    if a.eta is not None and run_eta is not None and a.eta != run_eta:
        said.append(f"--eta {a.eta} overrides the run's η = {run_eta}")
    if profile.partial_rollout:
        said.append(
            "the run used partial rollout, simulated as async (new weights between "
            "turns change no duration)"
        )
    return mode, eta, "; ".join(said)


def command(a: SimulateArgs) -> str:
    """Everything ``rlmap simulate`` prints, given its flags."""
    config, source = build_config(a)
    if a.plot is not None and a.sweep_workers is None:
        raise ConfigError("--plot: needs --sweep-workers (the plots are against worker count)")
    if a.sweep_workers is None:
        result = simulate(config)
        if a.json:
            return json.dumps(result_dict(result), indent=2) + "\n"
        return (f"times from {source}\n" if source else "") + render_text(result)
    counts = parse_workers(a.sweep_workers)
    if a.plot is not None:
        check_plot_dir(Path(a.plot), force=a.force)  # before the sweep: fail fast, write nothing
    results = sweep_workers(config, counts)
    written = []
    if a.plot is not None:
        existed = Path(a.plot).exists()
        with removed_on_failure(Path(a.plot), existed=existed):  # a full disk leaves nothing
            written = plot_sweep(results, Path(a.plot))
    if a.json:
        return json.dumps([result_dict(r) for r in results], indent=2) + "\n"
    return sweep_table(results) + "".join(f"wrote {p}\n" for p in written)


def parse_workers(text: str) -> list[int]:
    """``8,16,32`` → ``[8, 16, 32]``; errors name ``--sweep-workers``."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(
            f"--sweep-workers: expected integers like 8,16,32, got {text!r}"
        ) from None
    if not counts or min(counts) < 1:
        raise ConfigError(f"--sweep-workers: expected integers >= 1, got {text!r}")
    return counts


def result_dict(r: SimResult) -> dict[str, object]:
    """The result as JSON-ready data (with ``selection_bias``; NaN and ∞ become ``null``)."""
    data = dataclasses.asdict(r) | {"selection_bias": r.selection_bias}
    return {k: _json_safe(v) for k, v in data.items()}


def _json_safe(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, tuple):
        return [_json_safe(v) for v in value]
    return value


def render_text(r: SimResult) -> str:
    """A one-screen summary of one run."""
    knob = {"async": f", η={r.eta}", "partial": f", budget={r.budget_s or '∞'} s"}.get(r.mode, "")
    hist = " ".join(f"{s}:{c}" for s, c in enumerate(r.staleness_hist) if c)
    quart = " ".join(f"{q:.2f}" for q in r.staleness_by_duration_quartile)
    lines = [
        f"rlmap simulate: {r.mode}, W={r.workers} workers, B={r.batch}{knob}, {r.steps} steps",
        f"  duration {r.duration}, learner step {r.learner_step}",
        f"throughput      {r.trajectories_per_s:.4g} trajectories/s, "
        f"{r.learner_steps_per_s:.4g} learner steps/s (simulated {r.sim_time_s:.4g} s)",
        f"utilisation     learner {r.learner_util:.3f}, workers {r.worker_util:.3f}, "
        f"group idle (barrier) {r.group_idle_frac:.3f}",
        f"staleness       mean {r.staleness_mean:.3f}, p95 {r.staleness_p95}, "
        f"max {r.staleness_max} versions; histogram {hist}",
        f"  mean by duration quartile, short → long: {quart}",
        f"dropped (stale) {r.dropped} ({r.dropped_frac:.1%}); "
        f"{r.wasted_work_frac:.1%} of worker time wasted on them",
        f"selection bias  consumed mean d {r.consumed_mean_duration:.4g} s vs generated "
        f"{r.generated_mean_duration:.4g} s ({r.selection_bias:+.1%})",
        f"queue           mean {r.queue_mean:.4g}, max {r.queue_max} finished trajectories",
        f"trajectories    started {r.started} = consumed {r.consumed} + dropped {r.dropped} "
        f"+ queued {r.queued_at_end} + in flight {r.in_flight_at_end}",
    ]
    if r.mode == "partial":
        lines.append(f"segments        {r.segments_mean:.3f} versions per consumed trajectory")
    return "\n".join(lines) + "\n"


def sweep_workers(
    base: SimConfig, workers: Sequence[int], modes: Sequence[str] = MODES
) -> list[SimResult]:
    """``base`` at every worker count, in every mode (same seed: same durations)."""
    return [simulate(replace(base, mode=m, workers=w)) for w in workers for m in modes]


SWEEP_COLUMNS = (
    ("W", lambda r: f"{r.workers}"),
    ("mode", lambda r: r.mode),
    ("traj/s", lambda r: f"{r.trajectories_per_s:.4g}"),
    ("learner util", lambda r: f"{r.learner_util:.2f}"),
    ("worker util", lambda r: f"{r.worker_util:.2f}"),
    ("group idle", lambda r: f"{r.group_idle_frac:.2f}"),
    ("stale mean", lambda r: f"{r.staleness_mean:.2f}"),
    ("stale p95", lambda r: f"{r.staleness_p95}"),
    ("stale max", lambda r: f"{r.staleness_max}"),
    ("dropped", lambda r: f"{r.dropped_frac:.1%}"),
    ("wasted work", lambda r: f"{r.wasted_work_frac:.1%}"),
    ("selection bias", lambda r: f"{r.selection_bias:+.1%}"),
)
"""Columns of :func:`sweep_table`: header and formatter."""


def sweep_table(results: Sequence[SimResult]) -> str:
    """A Markdown table, one row per (W, mode), with the gain over sync at the same W."""
    sync = {r.workers: r.trajectories_per_s for r in results if r.mode == "sync"}
    head = [name for name, _ in SWEEP_COLUMNS] + ["× sync"]
    rows = [
        [fmt(r) for _, fmt in SWEEP_COLUMNS]
        + [f"{r.trajectories_per_s / sync[r.workers]:.2f}" if r.workers in sync else "—"]
        for r in results
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


PLOTS = ("throughput", "idle", "staleness", "cost")
"""The panels of :func:`plot_sweep`, each written as ``<prefix><name>.png``."""


def check_plot_dir(out_dir: Path, prefix: str = "", *, force: bool = False) -> None:
    """InputError unless the plots can go into ``out_dir``: a directory or a path to create,
    with none of the PNGs already there (``force``: existing PNG files are replaced)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a directory; --plot takes a directory")
    if out_dir.is_dir():
        for name in PLOTS:
            check_new_file(out_dir / f"{prefix}{name}.png", force=force)


def plot_sweep(results: Sequence[SimResult], out_dir: Path, prefix: str = "") -> list[Path]:
    """Four PNGs against worker count: throughput, idle, staleness, and the cost of asynchrony.

    ``out_dir`` is created if absent and the PNGs in it are replaced, each whole or not
    at all (``bench/simulate_scale.py`` regenerates the documentation's figures this
    way); ``rlmap simulate --plot`` refuses existing files first (:func:`check_plot_dir`).
    """
    create_run_dir(out=out_dir, kind="plot directory", force=True)
    modes = [m for m in MODES if any(r.mode == m for r in results)]
    series = {
        m: sorted((r for r in results if r.mode == m), key=lambda r: r.workers) for m in modes
    }
    title = f"{results[0].duration}, B={results[0].batch}, learner {results[0].learner_step}"
    written = []
    for name, ylabel, yscale, curves in _PANELS:
        path = out_dir / f"{prefix}{name}.png"
        write_bytes_atomic(path, _panel_png(series, title, ylabel, yscale, curves))
        written.append(path)
    return written


Curve = tuple[str, Callable[[SimResult], float]]
"""A line of a panel: its label's suffix after the mode, and its value for one result."""

_PANELS: tuple[tuple[str, str, str, tuple[Curve, ...]], ...] = (
    ("throughput", "consumed trajectories / s", "log", (("", lambda r: r.trajectories_per_s),)),
    (
        "idle",
        "fraction of worker time idle",
        "linear",
        (("", lambda r: 1 - r.worker_util), (" (barrier)", lambda r: r.group_idle_frac)),
    ),
    (
        "staleness",
        "staleness (versions)",
        "symlog",
        (
            (" mean", lambda r: r.staleness_mean),
            (" p95", lambda r: r.staleness_p95),
            (" max", lambda r: r.staleness_max),
        ),
    ),
    (
        "cost",
        "fraction",
        "linear",
        (
            (" wasted work", lambda r: r.wasted_work_frac),
            (" |selection bias|", lambda r: abs(r.selection_bias)),
        ),
    ),
)
"""The sweep's figures: file name, y label, y scale, curves."""


def _panel_png(
    series: Mapping[str, Sequence[SimResult]],
    title: str,
    ylabel: str,
    yscale: str,
    curves: Sequence[Curve],
) -> bytes:
    """One figure of :func:`plot_sweep` as PNG bytes: each curve for each mode, against W."""
    from matplotlib.figure import Figure  # imported here: only plotting pays for matplotlib
    from matplotlib.ticker import FuncFormatter, NullFormatter

    # log-axis ticks as plain numbers: matplotlib's default labels them with mathtext, whose
    # fonts a font cache built from the system fonts lacks (a warning per missing family)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    fig = Figure(figsize=(5.0, 3.2), layout="constrained")
    ax = fig.add_subplot()
    for mode, results in series.items():
        for (label, value), style in zip(curves, ("-o", "--s", ":^"), strict=False):
            xs = [r.workers for r in results]
            ax.plot(
                xs,
                [value(r) for r in results],
                style,
                ms=3,
                label=mode + label,
                color=_COLOURS[mode],
            )
    ax.set_xscale("log", base=2)
    ax.set_yscale(yscale)
    for axis in (ax.xaxis, ax.yaxis) if yscale != "linear" else (ax.xaxis,):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(NullFormatter())
    if yscale != "log":
        ax.set_ylim(bottom=0)  # every quantity here is >= 0
    ax.set_xlabel("rollout workers W")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80)
    return buffer.getvalue()


_COLOURS = {"sync": "tab:blue", "async": "tab:red", "partial": "tab:green"}
