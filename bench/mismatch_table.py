"""The tables and κ-tail plots of docs/mismatch.md, from a sweep of the behaviour corrections.

    python bench/mismatch_table.py runs/mismatch ppo-calc [--plot docs/img/kappa.png]

reads ``ROOT/TAG-<mode>-<correction>/seed<S>/`` for the five settings of the sweep in
docs/mismatch.md (decoupled mode with no correction, TIS, IcePop and masked IS; bypass
mode) and prints one markdown row per setting: held-out pass@1 before → after (mean
[min–max] over seeds), generated tokens, the κ tails (per-step mean, p99 and max of
|log κ|, averaged over the steps; the largest of any step), ρ's clipped fraction, the
correction's own counter (the largest of any step), the mean response length and the
actor's seconds. ``--plot`` draws the per-step p99 |log κ| of each setting (mean over
seeds) beside its held-out pass@1 against generated tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SETTINGS = (
    ("decoupled", "none"),
    ("decoupled", "tis"),
    ("decoupled", "icepop"),
    ("decoupled", "masked_is"),
    ("bypass", "none"),
)
OWN = {"tis": "capped_frac", "icepop": "masked_frac", "masked_is": "seq_masked_frac"}
"""Each correction's counter, ``ratio/kappa/<name>``."""


def seeds(root: Path, tag: str, mode: str, correction: str) -> list[Path]:
    return sorted(
        p
        for p in (root / f"{tag}-{mode}-{correction}").glob("seed*")
        if (p / "summary.json").is_file()
    )


def records(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def series(run: Path, key: str) -> list[float]:
    return [float(r[key]) for r in records(run)[1:] if r.get(key) is not None]


def mean(xs: Sequence[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def row(runs: list[Path], mode: str, correction: str) -> str:
    summary = [json.loads((r / "summary.json").read_text()) for r in runs]
    after = [s["after"]["eval/pass@1"] for s in summary]
    before = mean([s["before"]["eval/pass@1"] for s in summary])
    tokens = mean([s["generated_tokens"] for s in summary])
    actor = mean([json.loads((r / "ledger.json").read_text())["actor_s"] for r in runs])
    tails = [[series(r, f"ratio/kappa/{k}_abs_log") for r in runs] for k in ("mean", "p99", "max")]
    if all(all(t) for t in tails):  # every seed logged every tail
        largest = max(max(s) for s in tails[2])
        kappa = " | ".join(
            f"{mean([mean(s) for s in t]):.{d}f}" for t, d in zip(tails, (4, 3, 3), strict=True)
        )
        kappa += f" | {largest:.3f}"
    else:  # bypass: π_old := μ, κ ≡ 1 is not logged
        kappa = " | ".join(["κ ≡ 1"] * 4)
    clipped = mean([mean(series(r, "ratio/rho/clipped_frac")) for r in runs])
    own = "—"
    if correction in OWN:
        counts = [series(r, f"ratio/kappa/{OWN[correction]}") for r in runs]
        own = f"{OWN[correction]} max {max((max(c) for c in counts if c), default=0.0):.4f}"
    length = mean([mean(series(r, "length/mean")) for r in runs])
    return (
        f"| {mode} | {correction} | {before:.3f} → {mean(after):.3f} [{min(after):.3f}–"
        f"{max(after):.3f}] ({len(runs)} seeds) | {tokens:,.0f} | {kappa} | {clipped:.4f} | "
        f"{own} | {length:.1f} | {actor:.1f} |"
    )


def plot(root: Path, tag: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 3.4), layout="constrained")
    kappa_ax, held_ax = fig.subplots(1, 2)
    for mode, correction in SETTINGS:
        runs = seeds(root, tag, mode, correction)
        if not runs:
            continue
        label = f"{mode} {correction}"
        per_step = [series(r, "ratio/kappa/p99_abs_log") for r in runs]
        if all(per_step):
            n = min(len(s) for s in per_step)
            kappa_ax.plot(
                range(1, n + 1),
                [mean([s[i] for s in per_step]) for i in range(n)],
                lw=1,
                label=label,
            )
        points = [
            [
                (r["budget/generated_tokens"], r["eval/pass@1"])
                for r in records(run)
                if "eval/pass@1" in r and "budget/generated_tokens" in r
            ]
            for run in runs
        ]
        n = min(len(p) for p in points)
        held_ax.plot(
            [mean([p[i][0] for p in points]) for i in range(n)],
            [mean([p[i][1] for p in points]) for i in range(n)],
            "o-",
            ms=3,
            lw=1,
            label=label,
        )
    kappa_ax.set(xlabel="step", ylabel="p99 |log κ| (mean over seeds)")
    held_ax.set(xlabel="generated tokens", ylabel="held-out pass@1 (mean over seeds)")
    for ax in (kappa_ax, held_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(
        f"{tag}: κ tails beside the held-out curves (bf16 engine, fp32 learner)", fontsize=8
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("tag")
    parser.add_argument("--plot", type=Path, default=None)
    args = parser.parse_args(argv)
    print(
        "| mode | correction | held-out pass@1 before → after | generated tokens | mean "
        "\\|log κ\\| | p99 \\|log κ\\| | max \\|log κ\\| (mean of steps) | largest \\|log κ\\| "
        "| ρ clipped | correction's own counter | mean length | actor seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mode, correction in SETTINGS:
        runs = seeds(args.root, args.tag, mode, correction)
        print(row(runs, mode, correction) if runs else f"| {mode} | {correction} | (no runs) |")
    if args.plot is not None:
        plot(args.root, args.tag, args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
