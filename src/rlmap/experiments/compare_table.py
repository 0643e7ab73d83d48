"""The lines of a comparison, the unfair differences they flag and the side-by-side table
(:mod:`rlmap.experiments.compare` says what each kind of line means)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlmap.experiments.compare_runs import Run
from rlmap.experiments.ledger import Ledger

BUDGET_TOLERANCE = 0.10
"""Budgets (tokens, wall-clock, compute) further apart than this fraction are flagged."""
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


def as_number(x: Any) -> float | None:
    """``x`` as a float when it is a finite number (a bool is not one), else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x) if math.isfinite(x) else None


def summarize(values: Sequence[Any]) -> str:
    """A group's values: one value, mean [min–max] for numbers, or the distinct values."""
    present = [v for v in values if v is not None]
    if not present:
        return "–"
    numbers = [as_number(v) for v in present]
    if all(n is not None for n in numbers) and len(set(numbers)) > 1:
        nums = [n for n in numbers if n is not None]
        mean = sum(nums) / len(nums)
        return f"{format_value(mean)} [{format_value(min(nums))}–{format_value(max(nums))}]"
    distinct = list(dict.fromkeys(format_value(v) for v in present))
    return distinct[0] if len(distinct) == 1 else " / ".join(distinct)


def format_value(v: Any) -> str:
    """``v`` as the comparison shows it: whole and large numbers without decimals, other
    numbers to 4 significant digits, anything else as its ``str``."""
    n = as_number(v)
    if n is None:
        return str(v)
    if (n == int(n) and abs(n) >= 1) or abs(n) >= 1000:
        return f"{n:.0f}"
    return f"{n:.4g}"


def _group_mean(runs: Sequence[Run], line: Line) -> float | None:
    nums = [n for n in (as_number(line.get(r)) for r in runs if r.failure is None) if n is not None]
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
    seen = {label: {format_value(line.get(r)) for r in runs} for label, runs in finished.items()}
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
    detail = ", ".join(f"{k}: {format_value(v)}" for k, v in known.items())
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
    return format_value(value)


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
