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
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlmap.core.errors import ConfigError, InputError
from rlmap.core.metrics import upgrade_row
from rlmap.experiments.ledger import Ledger
from rlmap.experiments.rundir import (
    MetricsLog,
    read_json_object,
    write_bytes_atomic,
    write_text_atomic,
)
from rlmap.recipes.config import from_mapping, read_yaml
from rlmap.recipes.explain import composition

BUDGET_TOLERANCE = 0.10
"""Budgets (tokens, wall-clock, compute) further apart than this fraction are flagged."""
FAILED_FILE = "FAILED"
"""Written into a run directory by ``rlmap train --seeds`` when that run raised."""
GRID_POINTS = 50
NOT_COMPARED: dict[str, str] = {
    "seed": "what a group spans: its runs are equal in everything else",
    "recipe": "the name of the preset the fields were resolved from; it labels the groups, "
    "and the fields themselves are compared one by one",
    "run": "what a run records and when (evaluation and checkpoint cadence, logs, samples "
    "written, a merged copy), not what it trains",
    "model.path": "where the base weights lie: the base model path and base checkpoint lines "
    "flag it, the checkpoint's fingerprint saying whether the weights differ or only the path",
    "data.eval_path": "where the held-out file lies: the prompts line compares its content "
    "(the ledger's fingerprint), which a copy at another path does not change",
}
"""Config fields (and sections) left out of the config difference, each with the reason."""


@dataclass(frozen=True)
class Run:
    """One run directory, read."""

    path: Path
    config: dict[str, Any]
    """``config.yaml`` as a mapping (the resolved config)."""
    composition: str
    """The first line of ``config.yaml``: the recipe's full composition."""
    ledger: dict[str, Any]
    summary: dict[str, Any] | None
    records: list[dict[str, Any]]
    failure: str | None
    """Why the run has no result (the ``FAILED`` file, or a missing ``summary.json``)."""

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def recipe(self) -> str:
        return str(self.config.get("recipe", "?"))


def find_runs(paths: Sequence[Path]) -> list[Path]:
    """Run directories among ``paths``: each one itself, or the runs directly inside it."""
    found: list[Path] = []
    for path in map(Path, paths):
        if (path / "config.yaml").is_file():
            found.append(path)
            continue
        if not path.exists():
            raise InputError(f"{path}: no such run directory")
        inner = (
            sorted(p for p in path.iterdir() if (p / "config.yaml").is_file())
            if path.is_dir()
            else []
        )
        if not inner:
            raise InputError(
                f"{path}: not a run directory (no config.yaml), nor a directory of runs"
            )
        found += inner
    return found


def load_run(path: Path) -> Run:
    """Read a run directory; a run that did not finish is returned with its ``failure``.

    A file of the run that exists but cannot be read (not UTF-8, not JSON, a torn line
    before the last in ``metrics.jsonl``, a ledger that is not a JSON object) is an
    :class:`InputError` naming the file: a report from half a run would mislead.
    """
    config = read_yaml(path / "config.yaml")
    if isinstance(config.get("seed", 0), bool) or not isinstance(config.get("seed", 0), int):
        raise InputError(f"{path / 'config.yaml'}: seed: expected an integer")
    first = (path / "config.yaml").read_bytes().decode("utf-8-sig").partition("\n")[0]
    written = first.removeprefix("# ").strip()
    ledger = read_json_object(path / "ledger.json", "ledger") or {}
    summary = read_json_object(path / "summary.json", "run summary")
    records = [upgrade_row(r) for r in MetricsLog.read(path / "metrics.jsonl")]  # old names
    failure = None
    if (path / FAILED_FILE).exists():
        failure = (path / FAILED_FILE).read_text(errors="replace").strip() or "failed"
    elif summary is None:
        failure = "no summary.json: the run did not finish"
    return Run(path, config, _composition(config, written), ledger, summary, records, failure)


def _composition(config: Mapping[str, Any], written: str) -> str:
    """The composition of ``config`` as rlmap writes it today (runs of older versions then
    read alike); ``written``, the run's own first line, when the config no longer loads."""
    try:
        return composition(from_mapping(config))
    except ConfigError:
        return written


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """Every run among ``paths`` (see :func:`find_runs`), read; InputError on a bad one."""
    return [load_run(p) for p in find_runs(paths)]


def group_key(config: Mapping[str, Any]) -> str:
    """The config without what does not define the method: the seed and the ``run`` section."""
    rest = {k: v for k, v in config.items() if k not in ("seed", "run")}
    return json.dumps(rest, sort_keys=True, default=str)


def group_runs(runs: Sequence[Run]) -> dict[str, list[Run]]:
    """Runs grouped by config up to the seed, labelled by recipe; groups of one recipe are
    told apart by the directory that holds each group's runs (a ``--seeds`` sweep's), else
    numbered."""
    by_key: dict[str, list[Run]] = {}
    for run in runs:
        by_key.setdefault(group_key(run.config), []).append(run)
    recipes = [members[0].recipe for members in by_key.values()]
    labels: dict[str, list[Run]] = {}
    for members in by_key.values():
        recipe = members[0].recipe
        parents = {r.path.parent for r in members}
        label = recipe
        if recipes.count(recipe) > 1 and len(parents) == 1:
            label = f"{recipe} ({parents.pop().name})"
        n = 2
        while label in labels:
            label, n = f"{recipe} ({n})", n + 1
        labels[label] = sorted(members, key=lambda r: r.seed)
    return labels


# --- the lines of the comparison ---------------------------------------------------------


def _cfg(*keys: str) -> Callable[[Run], Any]:
    def get(run: Run) -> Any:
        node: Any = run.config
        for key in keys:
            node = node.get(key) if isinstance(node, Mapping) else None
        return node

    return get


def _ledger(key: str) -> Callable[[Run], Any]:
    return lambda run: run.ledger.get(key)


def _after(key: str) -> Callable[[Run], Any]:
    return lambda run: None if run.summary is None else run.summary.get("after", {}).get(key)


def _last(key: str) -> Callable[[Run], Any]:
    def get(run: Run) -> Any:
        values = [r[key] for r in run.records if r.get(key) is not None]
        return values[-1] if values else None

    return get


def _ledger_of(run: Run) -> Ledger | None:
    """The run's ledger as the trainer wrote it (None when missing or unreadable)."""
    try:
        return Ledger.from_dict(run.ledger) if run.ledger else None
    except (TypeError, ValueError):
        return None


def _learner_s(run: Run) -> Any:
    ledger = _ledger_of(run)
    return None if ledger is None else ledger.learner_s


def _share(part: str) -> Callable[[Run], Any]:
    def get(run: Run) -> Any:
        ledger = _ledger_of(run)
        return None if ledger is None or not ledger.learner_s else ledger.compute_share()[part]

    return get


@dataclass(frozen=True)
class Line:
    """One line of the comparison table."""

    label: str
    kind: str
    """``setup``, ``budget``, ``method`` or ``result`` (see the module docstring)."""
    get: Callable[[Run], Any]
    fields: tuple[str, ...] = ()
    """The config fields a setup line shows: when it flags them, the config difference
    does not repeat them."""


def _setting(label: str, section: str, name: str) -> Line:
    """A setup line that shows one config field."""
    return Line(label, "setup", _cfg(section, name), (f"{section}.{name}",))


LINES: tuple[Line, ...] = (
    Line("base checkpoint", "setup", _ledger("base_fingerprint")),
    Line("base model path", "setup", _ledger("base_model")),
    Line("tokenizer + chat template", "setup", _ledger("tokenizer_fingerprint")),
    Line("prompts (train + held-out)", "setup", _ledger("data_fingerprint")),
    _setting("task", "data", "task"),
    Line(
        "task settings",
        "setup",
        lambda run: json.dumps(_cfg("data", "task_args")(run), sort_keys=True),
        ("data.task_args",),
    ),
    Line("training verifier", "setup", _ledger("verifier"), ("feedback.verifier",)),
    Line(
        "held-out verifier",
        "setup",
        lambda run: run.ledger.get("eval_verifier") or run.ledger.get("verifier"),
        ("feedback.eval_verifier",),
    ),
    _setting("temperature", "generation", "temperature"),
    _setting("top-p", "generation", "top_p"),
    _setting("max new tokens", "generation", "max_new_tokens"),
    _setting("eval samples per prompt", "generation", "eval_samples"),
    Line("engine", "setup", _ledger("engine"), ("system.engine",)),
    Line(
        "precision", "setup", _ledger("precision"), ("system.train_dtype", "system.rollout_dtype")
    ),
    Line("generated tokens", "budget", _ledger("generated_tokens")),
    Line("wall-clock s", "budget", _ledger("wall_clock_s")),
    Line("learner compute s", "budget", _learner_s),
    Line("prompts sampled", "budget", _ledger("prompts")),
    Line("composition", "method", lambda run: run.composition),
    Line("optimiser steps (policy)", "method", _ledger("learner_steps")),
    Line("optimiser steps (critic)", "method", _ledger("critic_steps")),
    Line("epochs per batch", "method", _ledger("epochs_per_batch")),
    Line("effective batch", "method", _ledger("effective_batch")),
    Line("reduction", "method", _ledger("reduction")),
    Line("denominator", "method", _ledger("denominator")),
    Line("filtered rollouts", "method", _ledger("filtered_rollouts")),
    Line("rejected rollouts", "method", _ledger("rejected_rollouts")),
    Line("prompts skipped (rebalancing)", "method", _ledger("skipped_prompts")),
    Line("actor share of learner", "method", _share("actor")),
    Line("critic share of learner", "method", _share("critic")),
    Line("reference share of learner", "method", _share("reference")),
    Line("held-out pass@1", "result", _after("eval/pass@1")),
    Line("held-out pass@k", "result", _after("eval/pass@k")),
    Line("held-out diversity", "result", _last("eval/diversity")),
    Line("peak host memory KiB", "result", _ledger("peak_host_memory_kib")),
    Line("seeds", "result", lambda run: str(run.seed)),  # listed, not averaged
)


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def summarize(values: Sequence[Any]) -> str:
    """A group's values: one value, mean [min–max] for numbers, or the distinct values."""
    present = [v for v in values if v is not None]
    if not present:
        return "–"
    numbers = [_number(v) for v in present]
    if all(n is not None for n in numbers) and len(set(numbers)) > 1:
        nums = [n for n in numbers if n is not None]
        return f"{_fmt(sum(nums) / len(nums))} [{_fmt(min(nums))}–{_fmt(max(nums))}]"
    distinct = list(dict.fromkeys(_fmt(v) for v in present))
    return distinct[0] if len(distinct) == 1 else " / ".join(distinct)


def _fmt(v: Any) -> str:
    n = _number(v)
    if n is None:
        return str(v)
    if (n == int(n) and abs(n) >= 1) or abs(n) >= 1000:
        return f"{n:.0f}"
    return f"{n:.4g}"


def _group_mean(runs: Sequence[Run], line: Line) -> float | None:
    nums = [n for n in (_number(line.get(r)) for r in runs if r.failure is None) if n is not None]
    return sum(nums) / len(nums) if nums else None


def flags(groups: Mapping[str, Sequence[Run]]) -> list[str]:
    """Every difference that makes the comparison unfair, then every config field that
    differs between groups, one line each."""
    out: list[str] = []
    for label, runs in groups.items():
        for run in runs:
            if run.failure is not None:
                out.append(f"FAILED run {run.path} ({label}, seed {run.seed}): {run.failure}")
    finished = {k: [r for r in v if r.failure is None] for k, v in groups.items()}
    finished = {k: v for k, v in finished.items() if v}
    flagged: list[str] = []
    for line in LINES:
        found = {"setup": _setup_flag, "budget": _budget_flag}.get(line.kind)
        text = None if found is None else found(line, finished)
        if text is not None:
            out.append(text)
            flagged += line.fields
    return out + config_differences(groups, shown=frozenset(flagged))


def _setup_flag(line: Line, finished: Mapping[str, Sequence[Run]]) -> str | None:
    seen = {label: {_fmt(line.get(r)) for r in runs} for label, runs in finished.items()}
    if len(set().union(*seen.values()) if seen else set()) < 2:
        return None
    detail = ", ".join(f"{k}: {' / '.join(sorted(v))}" for k, v in seen.items())
    return f"UNFAIR setup: {line.label} differs ({detail})"


def _budget_flag(line: Line, finished: Mapping[str, Sequence[Run]]) -> str | None:
    means = {label: _group_mean(runs, line) for label, runs in finished.items()}
    known = {k: v for k, v in means.items() if v is not None}
    if len(known) < 2 or min(known.values()) <= 0:
        return None
    low, high = min(known.values()), max(known.values())
    if high / low <= 1 + BUDGET_TOLERANCE:
        return None
    detail = ", ".join(f"{k}: {_fmt(v)}" for k, v in known.items())
    return (
        f"UNFAIR budget: {line.label} differs {high / low:.2f}x ({detail}); "
        "equal steps are not equal cost — read the curves against budget"
    )


def config_differences(
    groups: Mapping[str, Sequence[Run]], shown: frozenset[str] = frozenset()
) -> list[str]:
    """``CONFIG differs: FIELD (group: value, …)`` for every dotted field of the resolved
    configs whose value differs between groups, in the config's order; fields in
    ``NOT_COMPARED`` and the ``shown`` ones (a setup line flagged them) are left out. A
    group's runs share their config but for the seed and the run section, so its first
    run speaks for it; a field a run's config lacks (an older rlmap) reads ``absent``."""
    flat = {label: _flatten(runs[0].config) for label, runs in groups.items() if runs}
    fields = dict.fromkeys(key for values in flat.values() for key in values)
    out = []
    for field in fields:
        if _left_out(field, shown):
            continue
        values = {label: f.get(field, _ABSENT) for label, f in flat.items()}
        if len({_exact(v) for v in values.values()}) > 1:  # not as shown: 0.95 ≠ 0.9501
            detail = ", ".join(f"{label}: {_shown(v)}" for label, v in values.items())
            out.append(f"CONFIG differs: {field} ({detail})")
    return out


_ABSENT = object()


def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"lora_rank": 8}}`` → ``{"model.lora_rank": 8}``; lists are values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out |= _flatten(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def _left_out(field: str, shown: frozenset[str]) -> bool:
    """``field`` is in NOT_COMPARED or ``shown``, itself or by a section above it."""
    parts = field.split(".")
    above = {".".join(parts[:n]) for n in range(1, len(parts) + 1)}
    return bool(above & (NOT_COMPARED.keys() | shown))


def _exact(value: Any) -> str:
    return "absent" if value is _ABSENT else json.dumps(value, sort_keys=True, default=str)


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "absent"
    if isinstance(value, bool | list | dict) or value is None:
        return json.dumps(value, sort_keys=True)
    return _fmt(value)


def table(groups: Mapping[str, Sequence[Run]], kinds: Sequence[str] | None = None) -> str:
    """The comparison as a Markdown table, one column per group."""
    labels = list(groups)
    rows = ["| kind | line | " + " | ".join(labels) + " |", "|---|---|" + "---|" * len(labels)]
    for line in LINES:
        if kinds is not None and line.kind not in kinds:
            continue
        cells = [summarize([line.get(r) for r in groups[k] if r.failure is None]) for k in labels]
        cells = [c.replace("|", "\\|") for c in cells]
        rows.append(f"| {line.kind} | {line.label} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


# --- curves on budgets ----------------------------------------------------------------------

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
        if (x := _number(r.get(x_key))) is not None and (y := _number(r.get(y_key))) is not None
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


def _equal_budget_lines(groups: Mapping[str, Sequence[Run]]) -> list[str]:
    found = at_equal_budget(groups)
    if found is None:
        return ["- fewer than two runs have evaluations on a common range of generated tokens"]
    budget, scores = found
    return [
        f"Held-out {SCORE.removeprefix('eval/')} at {_fmt(budget)} generated tokens, the "
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


# --- the report ---------------------------------------------------------------------------


def compare(paths: Sequence[Path], out: Path) -> str:
    """Write ``report.md`` and the plots into ``out``; return the report's text."""
    return write_report(load_runs(paths), out)


def write_report(runs: Sequence[Run], out: Path) -> str:
    """Write ``report.md`` and the plots of ``runs`` into ``out``; return the report's text.

    The CLI reads every run first (:func:`load_runs`) and only then creates ``out``, so
    bad input leaves no empty report directory behind.
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
        *_equal_budget_lines(groups),
        "",
        "## Held-out score against budget (not steps)",
        "",
        *[f"![{x_label}]({filename})" for filename, _, x_label in CURVES],
        "",
    ]
    text = "\n".join(lines)
    write_text_atomic(out / "report.md", text)
    return text
