"""The measured table of docs/judges.md: runs trained on an AI judge, beside one on the verifier.

    python bench/judge_table.py RUN [RUN ...]

prints one markdown row per run directory: its feedback source, held-out pass@1 by the
exact verifier before → after, the mean training reward against what the verifier says
of the same rollouts (first and last 10 steps), the judge's requests and tokens (the
ledger's), and the bias probes averaged over the steps that logged them. Nothing here
trains; docs/judges.md has the commands that made the runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from rlmap.core.metrics import upgrade_row

PROBES = (
    "judge/position_agreement",
    "judge/first_preferred_frac",
    "judge/length_corr",
    "judge/self_consistency",
)


def _records(run: Path) -> list[dict[str, Any]]:
    """The run's rows under today's metric names (an older run's too)."""
    rows = (run / "metrics.jsonl").read_text().splitlines()
    return [upgrade_row(json.loads(x)) for x in rows]


def _mean(records: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in records if key in r and r[key] == r[key]]
    return statistics.fmean(values) if values else None


def _fmt(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def row(run: Path) -> str:
    records = _records(run)
    config = (run / "config.yaml").read_text()
    source = next(
        (
            line.split(":", 1)[1].strip()
            for line in config.splitlines()
            if line.strip().startswith("source:")
        ),
        "?",
    )
    evals = [r for r in records if "eval/pass@1" in r]
    steps = records[1:]
    first, last = steps[:10], steps[-10:]
    ledger = json.loads((run / "ledger.json").read_text())
    reward = f"{_fmt(_mean(first, 'reward/mean'))} → {_fmt(_mean(last, 'reward/mean'))}"
    verifier = (
        f"{_fmt(_mean(first, 'reward/verifier_mean'))} → "
        f"{_fmt(_mean(last, 'reward/verifier_mean'))}"
    )
    probes = " / ".join(_fmt(_mean(steps, k), 2) for k in PROBES)
    failed = sum(
        round(
            (r.get("errors/infra_error_frac", 0) + r.get("errors/timeout_frac", 0))
            * r.get("sampling/generated", 0)
        )
        for r in steps
    )
    invalid = sum(r.get("judge/invalid", 0) for r in steps)
    return (
        f"| {run.name} | {source} | {evals[0]['eval/pass@1']:.3f} → "
        f"{evals[-1]['eval/pass@1']:.3f} | {reward} | {verifier} | "
        f"{ledger.get('judge_calls', 0):,} | {ledger.get('judge_tokens', 0):,} | "
        f"{int(invalid)} / {int(failed)} | {probes} | {ledger['wall_clock_s']:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    print(
        "| run | source | held-out pass@1 (exact) | reward (first → last 10 steps) | "
        "verifier on the same rollouts | judge calls | judge tokens | invalid / failed | "
        "position agreement / first preferred / length corr / self-consistency | s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        print(row(run))


if __name__ == "__main__":
    main()
