"""The truncate_oldest-against-compact table of issue 33 (``bench/kv_recall_compare.sh``):
per arm, over its seeds, held-out success at the start, at the end and at equal generated
tokens, what the policy wrote in summaries, and the state-sufficiency gap.

    python bench/kv_recall_table.py runs/kv_recall      # reads <arm>/seed<S>/metrics.jsonl

"Equal generated tokens": each seed's held-out pass@1 curve against ``budget/generated_tokens``
(the summaries count: they are generated), read by linear interpolation at the smallest
final budget of every run of both arms; a figure is the mean over seeds [min–max].
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path
from statistics import mean

ARMS = ("truncate_oldest", "compact")


def records(run: Path) -> list[dict[str, float]]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def evals(rows: Sequence[dict[str, float]]) -> list[tuple[float, float]]:
    """(generated tokens, held-out pass@1) at each evaluation; the first at 0 tokens."""
    out, spent = [], 0.0
    for r in rows:
        spent = r.get("budget/generated_tokens", spent)
        if "eval/pass@1" in r:
            out.append((spent if out else 0.0, r["eval/pass@1"]))
    return out


def at(curve: Sequence[tuple[float, float]], x: float) -> float:
    """The curve linearly interpolated at ``x`` (within its range)."""
    for (x0, y0), (x1, y1) in pairwise(curve):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return curve[-1][1]


def last(rows: Sequence[dict[str, float]], key: str, n: int = 1) -> float | None:
    """Mean of the last ``n`` values of ``key`` (None when never logged)."""
    seen = [r[key] for r in rows if key in r][-n:]
    return mean(seen) if seen else None


def spread(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "—"
    return f"{mean(known):.3f} [{min(known):.3f}–{max(known):.3f}]"


def main(root: Path) -> None:
    runs = {arm: sorted((root / arm).glob("seed*")) for arm in ARMS}
    rows = {arm: [records(r) for r in rs] for arm, rs in runs.items()}
    budget = min(evals(r)[-1][0] for rs in rows.values() for r in rs)
    lines = [
        ("seeds", lambda r: None),
        ("held-out pass@1, start", lambda r: evals(r)[0][1]),
        ("held-out pass@1, end", lambda r: evals(r)[-1][1]),
        (f"held-out pass@1 at {budget:.0f} generated tokens", lambda r: at(evals(r), budget)),
        ("held-out pass@k, end", lambda r: last(r, "eval/pass@k")),
        ("generated tokens, end", lambda r: last(r, "budget/generated_tokens")),
        ("held-out segments per episode, end", lambda r: last(r, "eval/segments")),
        ("held-out summary tokens per episode, end", lambda r: last(r, "eval/summary_tokens")),
        (
            "held-out tokens dropped per episode, end",
            lambda r: last(r, "eval/context_dropped_tokens"),
        ),
        (
            "critic/segment_value_gap, last 10 steps",
            lambda r: last(r, "critic/segment_value_gap", 10),
        ),
        ("… signed, last 10 steps", lambda r: last(r, "critic/segment_value_gap_signed", 10)),
        (
            "critic/explained_variance, last 10 steps",
            lambda r: last(r, "critic/explained_variance", 10),
        ),
    ]
    print(f"| | {' | '.join(ARMS)} |")
    print(f"|---|{'---|' * len(ARMS)}")
    for name, read in lines:
        if name == "seeds":
            cells = [str(len(rows[arm])) for arm in ARMS]
        else:
            cells = [spread([read(r) for r in rows[arm]]) for arm in ARMS]
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "runs/kv_recall"))
