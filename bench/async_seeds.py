"""The asynchronous loop's headline figures over seeds: async/sync throughput under two
latency distributions, held-out pass@1 at equal wall-clock and at equal generated tokens,
and ``rlmap simulate --from-run``'s prediction error for every run.

    python bench/async_seeds.py --train --root runs/async-seeds      # train, then report
    python bench/async_seeds.py --root runs/async-seeds              # report only

``--train`` runs ``rlmap train --recipe sao data.task=calculator`` with each tool latency
(``data.env_latency``) in both modes, ``--seeds`` seeds each, ``--steps`` steps, twice:
into ``ROOT/heldout/<dist>-<mode>/seed<S>`` with the held-out evaluation every 10 steps
(the held-out comparisons), and into ``ROOT/throughput/...`` with no evaluation or
checkpoint until the last step (the throughput figures: asynchronous workers go on
rolling out while the learner evaluates or writes a checkpoint, time the ledger's
wall-clock does not hold, so a run with intermediate evaluations overstates the
asynchronous rate). The report prints one markdown table (docs/simulate.md).

Measured throughput: trajectories the learner consumed (taken minus dropped as stale)
per second of the steps that ran no held-out evaluation (each step's wall-clock is the
difference of ``budget/wall_clock_s``). Predicted: ``rlmap simulate --from-run`` on the
same run, with the run's own mode, η and workers (an asynchronous run's worker rounds
are scaled by the trajectories per round; a synchronous run is a replay of its own step
times); it counts consumed trajectories too.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlmap.experiments.compare_curves import curve, interpolate
from rlmap.experiments.compare_runs import load_run
from rlmap.simulator.inputs import profile_from_run
from rlmap.simulator.model import simulate
from rlmap.simulator.report import SimulateArgs, build_config

LATENCIES = {"lognormal": "lognormal:-2.5,1.0", "pareto": "pareto:1.5,0.05"}
"""Seconds each tool step waits: a median of 0.08 s either way, the Pareto with a heavy tail."""
MODES = ("sync", "async")


SETS = {"heldout": [], "throughput": ["run.eval_every=1000000", "run.checkpoint_every=1000000"]}
"""The two sets of runs and what each adds to the command."""


def train(
    root: Path, seeds: int, steps: int, extra: Sequence[str] = (), sets: Sequence[str] = tuple(SETS)
) -> None:
    for group, more in ((g, SETS[g]) for g in sets):
        for name, spec in LATENCIES.items():
            for mode in MODES:
                out = root / group / f"{name}-{mode}"
                if all((out / f"seed{s}" / "summary.json").exists() for s in range(seeds)):
                    continue
                shutil.rmtree(out, ignore_errors=True)  # a cell cut short: train it again
                cmd = [
                    sys.executable,
                    "-m",
                    "rlmap.cli",
                    "train",
                    "--recipe",
                    "sao",
                    "--seeds",
                    str(seeds),
                    "--out",
                    str(out),
                    "data.task=calculator",
                    f"data.env_latency={spec}",
                    f"system.mode={mode}",
                    f"optim.steps={steps}",
                    "run.progress=false",
                    *more,
                    *extra,
                ]
                print("$", " ".join(cmd[2:]), flush=True)
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def measured_rate(run: Path) -> float:
    """Trajectories consumed per second over the steps without a held-out evaluation."""
    previous, seconds, consumed = 0.0, 0.0, 0.0
    for r in records(run):
        wall = r.get("budget/wall_clock_s", previous)
        if "sampling/generated" in r and not any(k.startswith("eval/") for k in r):
            seconds += wall - previous
            consumed += r["sampling/generated"] - r.get("system/stale_dropped", 0.0)
        previous = wall
    if seconds <= 0:
        raise SystemExit(f"{run}: every step ran an evaluation; no throughput to measure")
    return consumed / seconds


def predicted_rate(run: Path) -> float:
    """``rlmap simulate --from-run`` on the run (its own mode, η and workers)."""
    steps = sum(1 for r in records(run) if "sampling/generated" in r)
    config, _ = build_config(SimulateArgs(from_run=str(run), steps=max(steps, 50)))
    return simulate(config).trajectories_per_s * profile_from_run(run).round_size


def at_budget(runs: Sequence[Path], key: str, budget: float) -> list[float]:
    """Each run's held-out pass@1 at ``budget`` of ``key`` (piecewise linear)."""
    out = []
    for run in runs:
        xs, ys = curve(load_run(run), key)
        out.append(interpolate(xs, ys, [budget])[0])
    return out


def spread(values: Sequence[float], fmt: str = ".3f") -> str:
    return f"{statistics.mean(values):{fmt}} [{min(values):{fmt}}–{max(values):{fmt}}]"


def report(root: Path, seeds: int, throughput: str = "throughput") -> str:
    lines = [
        "| latency | async / sync throughput | measured trajectories/s, sync · async "
        "| simulator error, sync · async (each seed) | held-out pass@1 at equal wall-clock, "
        "sync · async | at equal generated tokens, sync · async |",
        "|---|---|---|---|---|---|",
    ]
    for name in LATENCIES:
        fast = {
            m: [root / throughput / f"{name}-{m}" / f"seed{s}" for s in range(seeds)] for m in MODES
        }
        runs = {
            m: [root / "heldout" / f"{name}-{m}" / f"seed{s}" for s in range(seeds)] for m in MODES
        }
        rate = {m: [measured_rate(r) for r in fast[m]] for m in MODES}
        ratio = [a / s for a, s in zip(rate["async"], rate["sync"], strict=True)]
        error = {m: [predicted_rate(r) / measured_rate(r) - 1 for r in fast[m]] for m in MODES}
        # the common budget: the least any of the six runs reached
        walls = [max(curve(load_run(r), "budget/wall_clock_s")[0]) for m in MODES for r in runs[m]]
        tokens = [
            max(curve(load_run(r), "budget/generated_tokens")[0]) for m in MODES for r in runs[m]
        ]
        wall = {m: at_budget(runs[m], "budget/wall_clock_s", min(walls)) for m in MODES}
        toks = {m: at_budget(runs[m], "budget/generated_tokens", min(tokens)) for m in MODES}
        errors = " · ".join(", ".join(f"{e:+.0%}" for e in error[m]) for m in MODES)
        lines.append(
            f"| {LATENCIES[name]} | {spread(ratio, '.2f')} | {spread(rate['sync'], '.1f')} · "
            f"{spread(rate['async'], '.1f')} | {errors} | {spread(wall['sync'])} · "
            f"{spread(wall['async'])} (at {min(walls):.0f} s) | {spread(toks['sync'])} · "
            f"{spread(toks['async'])} (at {min(tokens):,.0f}) |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("runs/async-seeds"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--train", action="store_true", help="train the runs first")
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for --train")
    quick = "a quick look: train only the held-out set, the throughput from it too (too high)"
    parser.add_argument("--one-set", action="store_true", help=quick)
    args = parser.parse_args(argv)
    sets = ("heldout",) if args.one_set else tuple(SETS)
    if args.train:
        train(args.root, args.seeds, args.steps, args.extra, sets)
    print(report(args.root, args.seeds, "heldout" if args.one_set else "throughput"))


if __name__ == "__main__":
    main()
