"""The cluster-scale study of docs/simulate.md: sync vs async vs partial, 8 → 256 workers.

Everything quoted in docs/simulate.md comes from this script's output (deterministic:
seed 0). Time unit: one median rollout (lognormal:0,1 has median 1 s; its mean is
e^0.5 ≈ 1.65 s). Settings:

- B = 512 trajectories per learner step (e.g. 64 prompts × G = 8), learner step 2 s,
  200 learner steps per run, η = 1 for async, no budget for partial;
- durations lognormal:0,1 (p95/p50 = e^1.645 ≈ 5.2) and pareto:1.5,0.5 (mean 1.5 s,
  median 0.79 s, infinite variance: the agentic long tail);
- W = 8, 16, 32, 64, 128, 256 in every mode; then η = 0, 1, 2, 4, 8 at W = 256.

With ``--check-run DIR`` it also replays a synchronous embedded run
(:func:`rlmap.simulator.inputs.profile_from_run`) and compares the predicted
throughput with the measured one. ``--toy`` runs the same study at W = 8, 16, η = 0, 1,
B = 32 and 10 steps: a smoke run of a second, its figures not the documentation's.

    .venv/bin/python bench/simulate_scale.py [--img docs/img] [--check-run runs/<dir>] [--toy]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rlmap.simulator.inputs import Fixed, LogNormal, Pareto, profile_from_run
from rlmap.simulator.model import SimConfig, SimResult, simulate
from rlmap.simulator.report import plot_sweep, sweep_table, sweep_workers

STUDIES = {"lognormal": LogNormal(0.0, 1.0), "pareto": Pareto(1.5, 0.5)}


@dataclass(frozen=True)
class Sizes:
    """What the study sweeps, and at what size."""

    workers: tuple[int, ...] = (8, 16, 32, 64, 128, 256)
    """W of the sweep; the η rows run at the last."""
    etas: tuple[int, ...] = (0, 1, 2, 4, 8)
    """η of the async rows."""
    batch: int = 512
    """B, trajectories per learner step."""
    steps: int = 200
    """Learner steps per simulated run."""


FULL = Sizes()
TOY = Sizes(workers=(8, 16), etas=(0, 1), batch=32, steps=10)


def base(duration: LogNormal | Pareto, sizes: Sizes) -> SimConfig:
    return SimConfig(
        "sync",
        sizes.workers[0],
        sizes.batch,
        duration,
        Fixed(2.0),
        steps=sizes.steps,
        eta=1,
        seed=0,
    )


def eta_rows(cfg: SimConfig, etas: Sequence[int]) -> list[SimResult]:
    return [simulate(replace(cfg, mode="async", eta=eta)) for eta in etas]


def eta_table(sync: SimResult, rows: list[SimResult]) -> str:
    lines = [
        "| η | traj/s | × sync | stale mean | stale p95 | dropped | wasted work | selection bias "
        "| stale by d-quartile |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        quart = " / ".join(f"{q:.2f}" for q in r.staleness_by_duration_quartile)
        gain = r.trajectories_per_s / sync.trajectories_per_s
        lines.append(
            f"| {r.eta} | {r.trajectories_per_s:.4g} | {gain:.2f} "
            f"| {r.staleness_mean:.2f} | {r.staleness_p95} | {r.dropped_frac:.1%} "
            f"| {r.wasted_work_frac:.1%} | {r.selection_bias:+.1%} | {quart} |"
        )
    return "\n".join(lines) + "\n"


def plot_tradeoff(
    studies: dict[str, tuple[SimResult, list[SimResult]]], path: Path, sizes: Sizes
) -> None:
    """Against η at the largest W: the gain over sync (left) and what it costs (right)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 3.0), layout="constrained")
    gain_ax, cost_ax = fig.subplots(1, 2)
    for (name, (sync, rows)), colour in zip(
        studies.items(), ("tab:purple", "tab:orange"), strict=False
    ):
        etas = [r.eta for r in rows]
        gain_ax.plot(
            etas,
            [r.trajectories_per_s / sync.trajectories_per_s for r in rows],
            "-o",
            ms=3,
            color=colour,
            label=name,
        )
        cost_ax.plot(
            etas,
            [r.staleness_mean for r in rows],
            "-o",
            ms=3,
            color=colour,
            label=f"{name}: mean staleness (versions)",
        )
        cost_ax.plot(
            etas,
            [r.wasted_work_frac for r in rows],
            "--s",
            ms=3,
            color=colour,
            label=f"{name}: wasted worker time",
        )
        cost_ax.plot(
            etas,
            [-r.selection_bias for r in rows],
            ":^",
            ms=3,
            color=colour,
            label=f"{name}: −selection bias",
        )
    gain_ax.set_ylabel("async / sync throughput")
    gain_ax.set_yscale("log")
    cost_ax.set_ylabel("cost")
    for ax in (gain_ax, cost_ax):
        ax.set_xlabel("η (async staleness bound; 0 = sync)")
        ax.set_xticks(sizes.etas)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(
        f"W = {sizes.workers[-1]}, B = {sizes.batch}, learner 2 s: what each η buys and costs",
        fontsize=8,
    )
    fig.savefig(path, dpi=80)


def check_run(run_dir: Path) -> None:
    """Predicted (replayed) vs measured throughput of a synchronous embedded run."""
    profile = profile_from_run(run_dir)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "system/rollout_s" in r]
    assert profile.batch is not None and profile.learner_step is not None
    predicted = simulate(
        SimConfig(
            "sync",
            profile.batch,
            profile.batch,
            profile.duration,
            profile.learner_step,
            steps=len(steps),
        )
    )
    generated = sum(r["sampling/generated"] for r in steps)
    # wall-clock per step: the difference of budget/wall_clock_s; steps that also ran the
    # held-out evaluation (an eval/* key in the record) carry its time too
    previous, train_only, total = 0.0, 0.0, steps[-1]["budget/wall_clock_s"]
    for r in records:
        wall = r.get("budget/wall_clock_s", previous)
        if "system/rollout_s" in r and not any(k.startswith("eval/") for k in r):
            train_only += wall - previous
        previous = wall
    plain = [r for r in steps if not any(k.startswith("eval/") for k in r)]
    plain_rate = sum(r["sampling/generated"] for r in plain) / train_only
    print(f"## embedded run check: {run_dir}\n\nprofile: {profile.source}\n")
    print(
        f"- predicted (sync replay):            {predicted.trajectories_per_s:.1f} trajectories/s"
    )
    print(
        f"- measured, steps without evaluation: {plain_rate:.1f} trajectories/s "
        f"({predicted.trajectories_per_s / plain_rate - 1:+.1%} off)"
    )
    print(
        f"- measured, whole run incl. evaluation: {generated / total:.1f} trajectories/s "
        f"({predicted.trajectories_per_s / (generated / total) - 1:+.1%} off)\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img", default="docs/img", help="directory for the PNGs")
    parser.add_argument("--check-run", default=None, help="a synchronous run directory to replay")
    parser.add_argument("--toy", action="store_true", help="W = 8, 16, B = 32, 10 steps")
    args = parser.parse_args(argv)
    sizes = TOY if args.toy else FULL
    print(f"python {platform.python_version()} on {platform.machine()}; seed 0\n")
    started = time.perf_counter()
    tradeoff = {}
    w = sizes.workers[-1]
    for name, duration in STUDIES.items():
        cfg = base(duration, sizes)
        results = sweep_workers(cfg, sizes.workers)
        mean_d = duration.mean
        print(
            f"## {duration.spec} (mean {mean_d:.3g} s), B = {cfg.batch}, learner "
            f"{cfg.learner_step.spec} s, η = {cfg.eta}, {cfg.steps} steps\n"
        )
        print(sweep_table(results))
        for path in plot_sweep(results, Path(args.img), prefix=f"simulate_{name}_"):
            print(f"wrote {path}")
        sync_w = simulate(replace(cfg, workers=w))
        rows = eta_rows(replace(cfg, workers=w), sizes.etas)
        print(f"\n### η at W = {w} (sync: {sync_w.trajectories_per_s:.4g} traj/s)\n")
        print(eta_table(sync_w, rows))
        tradeoff[name] = (sync_w, rows)
    path = Path(args.img) / "simulate_tradeoff.png"
    plot_tradeoff(tradeoff, path, sizes)
    print(f"wrote {path}\n")
    if args.check_run:
        check_run(Path(args.check_run))
    print(f"simulated in {time.perf_counter() - started:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
