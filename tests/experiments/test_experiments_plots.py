"""Plots from metrics records: every figure with data is written, absent data is skipped."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from rlmap.experiments import plots
from rlmap.experiments.plots import write_plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def synthetic_metrics(steps: int = 6) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for step in range(1, steps + 1):
        record: dict[str, Any] = {
            "step": step,
            "reward/mean": step / steps,
            "length/mean": 10.0 + step,
            "length/p95": 14.0 + step,
            "length/truncated_frac": 0.1,
            "entropy": 1.0 / step,
            "ratio/rho/max_abs_log": 0.2,
            "ratio/rho/p99_abs_log": 0.1,
            "ratio/kappa/max_abs_log": 0.05,
            "system/tokens_per_s": 100.0 * step,
            "system/rollout_p95_s": 0.3,
            "budget/generated_tokens": 640.0 * step,
        }
        if step % 3 == 0:  # held-out evaluation every third step
            record.update({"eval/pass@1": 0.1 * step, "eval/pass@8": 0.15 * step})
        records.append(record)
    records[2]["reward/mean"] = None  # NaN written as null: the point is left out
    return records


def test_all_figures_written_for_full_metrics(tmp_path: Path) -> None:
    written = write_plots(synthetic_metrics(), tmp_path / "plots")
    names = ["reward", "heldout", "length", "entropy", "ratios", "system"]
    assert written == [tmp_path / "plots" / f"{name}.png" for name in names]
    for path in written:
        data = path.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5_000


def test_missing_metrics_skip_their_figures(tmp_path: Path) -> None:
    metrics: list[dict[str, Any]] = [
        {"step": 1, "reward/mean": 0.1, "entropy": None},
        {"step": 2, "reward/mean": 0.3},
    ]
    assert write_plots(metrics, tmp_path) == [tmp_path / "reward.png"]  # entropy all None
    assert write_plots([], tmp_path / "empty") == []
    assert not (tmp_path / "empty").exists()


def test_heldout_needs_generated_tokens_not_steps(tmp_path: Path) -> None:
    no_budget = [{"step": 3, "eval/pass@1": 0.5}, {"step": 6, "eval/pass@1": 0.7}]
    # the held-out curve needs generated tokens on its x axis; steps alone do not make it
    # (reward.png, drawn against steps beside the training reward, may still appear)
    assert tmp_path / "heldout.png" not in write_plots(no_budget, tmp_path)


def test_heldout_x_is_generated_tokens_taken_from_the_same_step() -> None:
    metrics = [
        {"step": 0, "eval/pass@1": 0.1, "budget/generated_tokens": 0},
        {"step": 5, "budget/generated_tokens": 500, "reward/mean": 0.2},
        {"step": 5, "eval/pass@1": 0.4, "eval/pass@k": 0.6},  # logged apart, same step
        {"step": 9, "eval/pass@1": math.inf},  # not plottable, and no budget at step 9
    ]
    xs = plots._x_values(metrics, plots.TOKENS)
    assert xs == [0.0, 500.0, 500.0, None]
    assert plots._series(metrics, xs, "eval/pass@1") == ([0.0, 500.0], [0.1, 0.4])
    spec = next(s for s in plots.PLOTS if s.filename == "heldout.png")
    assert plots._panels(spec, metrics, xs) == [("pass rate", ["eval/pass@1", "eval/pass@k"])]


def test_system_figure_has_one_panel_per_metric() -> None:
    metrics = synthetic_metrics()
    spec = next(s for s in plots.PLOTS if s.filename == "system.png")
    xs = plots._x_values(metrics, "step")
    panels = plots._panels(spec, metrics, xs)
    assert panels == [(k, [k]) for k in ("system/tokens_per_s", "system/rollout_p95_s")]


def test_phase_spans_join_consecutive_steps_and_skip_the_rest() -> None:
    from rlmap.experiments.plots import phase_spans

    records = [{"step": s, "critic/pretraining": float(s in (1, 2, 3, 6))} for s in range(1, 9)]
    xs = [float(r["step"]) for r in records]
    # steps 1-3 form one run, step 6 another (half a step of margin each side)
    assert phase_spans(records, xs, "critic/pretraining") == [(0.5, 3.5), (5.5, 6.5)]
    assert phase_spans(records, xs, "missing") == []


def _expanded(pattern: str) -> list[str]:
    """The concrete names a panel's pattern stands for: each ``(a|b)`` group expanded, ``\\d+``
    read as 8; a ``.+`` is left in (the caller matches it against the registry instead)."""
    import re

    group = re.search(r"\(([^()]*)\)", pattern)
    if group is None:
        return [pattern.replace(r"\d+", "8")]
    head, tail = pattern[: group.start()], pattern[group.end() :]
    return [n for word in group.group(1).split("|") for n in _expanded(head + word + tail)]


def test_every_panel_reads_names_a_run_emits() -> None:
    # a panel whose names nothing emits is dropped without a word (the failed-rewards panel
    # read reward/*_frac after errors/<class>_frac became the one name of each failure)
    import re

    from rlmap.core.metrics import METRICS, unregistered

    samples = [re.sub(r"\{([^{}|]+)\}", "infra_error", m.name) for m in METRICS]
    samples = [re.sub(r"\{([^{}]+)\}", lambda g: g.group(1).split("|")[0], s) for s in samples]
    dead = []
    for spec in plots.PLOTS:
        keys = [spec.x_key, *([spec.shade_key] if spec.shade_key else [])]
        for pattern in [*keys, *(p for panel in spec.panels for p in panel.patterns)]:
            names = _expanded(pattern)  # alive when one of its names is emitted
            if any(".+" in n for n in names):
                alive = any(re.fullmatch(n, s) for n in names for s in samples)
            else:
                alive = len(unregistered(names)) < len(names)
            dead += [] if alive else [pattern]
    assert dead == []
